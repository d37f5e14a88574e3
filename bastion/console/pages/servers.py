"""The servers page: each running gateway's servers with status, protocol era, sandbox, restarts and recent stderr;
the act ``retry_server`` starts a failed one again now (what ``bastion servers retry NAME`` does); the feed
``servers`` is the same as JSON."""

from __future__ import annotations

import asyncio
from typing import Any

from bastion.console.markup import Html, join, pre, table, tag
from bastion.console.registry import Act, ActRequest, Feed, Outcome, Page, View, field_of


async def render(view: View) -> Html:
    gateways = await asyncio.to_thread(view.data.gateways)
    if not gateways:
        return tag("p", "No gateway is running for this user (bastion run, bastion serve).", class_="empty")
    parts = []
    for gateway in gateways:
        rows = [_row(view, name, entry) for name, entry in sorted(gateway.servers.items())]
        parts.append(tag("section",
                         tag("h2", f"Gateway {gateway.pid}"),
                         tag("p", gateway.config or "the demo configuration", class_="muted"),
                         table(("Server", "Status", "Era", "Sandbox", "Restarts", "Recent stderr", ""), rows,
                               empty="this gateway has no servers"),
                         class_="gateway"))
    return join(parts)


def _row(view: View, name: str, entry: Any) -> list[Any]:
    entry = entry if isinstance(entry, dict) else {}
    status = str(entry.get("status", "?"))
    said = status if status == "ready" else f"{status}: {entry.get('reason', '')}"
    if status == "failed":
        said += f" ({entry.get('failed_starts')} failed start(s); restarted {entry.get('retried')})"
    stderr = entry.get("stderr") or []
    act = view.form("retry_server", "Retry", {"server": name}) if status == "failed" else Html("")
    return [name, tag("span", said, class_=f"status-{status}"), entry.get("era") or "-", entry.get("sandbox") or "-",
            entry.get("restarts", 0), pre("\n".join(str(line) for line in stderr[-20:])) if stderr else "-", act]


async def retry(request: ActRequest) -> Outcome:
    server = field_of(request.form, "server")
    asked = await asyncio.to_thread(request.data.retry, server)
    if not asked:
        return Outcome(f"no running gateway has a failed server {server!r}: nothing to retry", 404)
    return Outcome(f"asked gateway {', '.join(map(str, asked))} to start {server} again")


async def states(view: View) -> list[dict[str, Any]]:
    """Each shown gateway's servers as its status file has them, for a page that watches them change."""
    gateways = await asyncio.to_thread(view.data.gateways)
    return [{"pid": g.pid, "config": g.config, "servers": g.servers} for g in gateways]


PAGES = (Page("servers", "Servers", render),)
FEEDS = (Feed("servers", states),)
ACTS = (Act("retry_server", retry, target=lambda form: form.get("server")),)
