"""The federated catalog: every tool each running gateway serves, with its cost in prompt tokens (what listing it
costs a model: o200k_base over its canonical JSON) and its pin state (pinned, changed and withheld, not pinned)."""

from __future__ import annotations

import asyncio
from typing import Any

from bastion.console.markup import Html, join, table, tag
from bastion.console.registry import Page, View
from bastion.guardrails.pin_book import PinBook, server_id
from bastion.guardrails.pin_store import PinStoreError

DESCRIBED = 300  # characters of a description shown; the whole one is in the changes page's diff


async def render(view: View) -> Html:
    return await asyncio.to_thread(_render, view)


def _render(view: View) -> Html:
    gateways = view.data.gateways()
    if not gateways:
        return tag("p", "No gateway is running for this user (bastion run, bastion serve).", class_="empty")
    try:
        book: PinBook | None = view.data.pin_book()
        unread = Html("")
    except PinStoreError as error:
        book, unread = None, tag("p", f"The pins file cannot be read: {error}", class_="notice refused")
    parts = [unread]
    for gateway in gateways:
        rows, total = [], 0
        for tool in gateway.catalog:
            cost = view.data.token_cost(tool.get("definition"))
            total += cost or 0
            rows.append(_row(tool, cost, _pin_state(book, gateway.config, tool)))
        cut = tag("p", "Only the first tools are listed: the status file keeps a bounded number.", class_="muted") \
            if gateway.catalog_cut else Html("")
        parts.append(tag("section", tag("h2", f"Gateway {gateway.pid}"),
                         tag("p", f"{gateway.config or 'the demo configuration'}: {len(rows)} tools, "
                                  f"{total:,} tokens listed in full", class_="muted"),
                         cut, table(("Tool", "Server", "Description", "Tokens", "Pin"), rows,
                                    empty="no tools yet (servers still starting, or none offers any)")))
    return join(parts)


def _row(tool: dict[str, Any], cost: int | None, pin: str) -> list[Any]:
    definition = tool.get("definition") if isinstance(tool.get("definition"), dict) else {}
    description = str(definition.get("description") or "")
    if len(description) > DESCRIBED:
        description = description[:DESCRIBED] + "…"
    shown_cost = f"{cost:,}" if cost is not None else f"not counted ({tool.get('bytes', '?')} bytes)"
    return [tag("code", tool.get("exposed", "")), tool.get("server", ""), description, shown_cost,
            tag("span", pin, class_="pin-withheld" if "withheld" in pin else None)]


def _pin_state(book: PinBook | None, configuration: str | None, tool: dict[str, Any]) -> str:
    if book is None:
        return "unknown (pins file unreadable)"
    record = book.get(server_id(str(tool.get("server", "")), configuration), "tools", str(tool.get("name", "")))
    if record is None:
        return "not pinned"
    if record.offered is not None:
        return f"changed {record.offered_at or ''}: withheld".replace("  ", " ")
    return f"pinned {record.pinned_at or ''}".strip()


PAGES = (Page("catalog", "Catalog", render),)
ACTS = ()
