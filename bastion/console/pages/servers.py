"""The servers page: each running gateway's servers with status, protocol era, sandbox, restarts and recent stderr;
the act ``retry_server`` starts a failed one again now (what ``bastion servers retry NAME`` does); the feed
``servers`` is the same as JSON."""

from __future__ import annotations

import asyncio
from typing import Any

from bastion.console.markup import Html, join, pre, table, tag
from bastion.console.registry import Act, ActRequest, BadForm, Feed, Outcome, Page, View, field_of


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
                         view.form("reload", "Reload its configuration", {"gateway": gateway.pid})
                         if gateway.config else Html(""),
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


async def reload(request: ActRequest) -> Outcome:
    """Read a gateway's configuration file again and apply it (docs/operations.md, Reloading the configuration):
    the gateway the console runs in directly, with the operator named in its audit record; a stdio gateway beside
    ``bastion console`` by SIGHUP, whose own log says what changed."""
    field = field_of(request.form, "gateway", most=12)
    if not field.isdigit():
        raise BadForm(f"gateway must be a process id, not {field!r}")
    pid = int(field)
    data = request.data
    if data.reload_here is not None and pid == data.only_pid:
        outcome = await data.reload_here(identity=request.identity)
        return Outcome(f"reloaded: {outcome.describe()}" if outcome.applied else outcome.describe(),
                       0 if outcome.applied else 409)
    if not await asyncio.to_thread(data.ask_reload, pid):
        return Outcome(f"no gateway {pid} is running for this user: nothing to reload", 404)
    return Outcome(f"asked gateway {pid} to read its configuration again (SIGHUP); its log says what changed")


async def states(view: View) -> list[dict[str, Any]]:
    """Each shown gateway's servers as its status file has them, for a page that watches them change."""
    gateways = await asyncio.to_thread(view.data.gateways)
    return [{"pid": g.pid, "config": g.config, "servers": g.servers} for g in gateways]


PAGES = (Page("servers", "Servers", render),)
FEEDS = (Feed("servers", states),)
ACTS = (Act("retry_server", retry, target=lambda form: form.get("server")),
        Act("reload", reload, target=lambda form: f"gateway {form.get('gateway')}"))
