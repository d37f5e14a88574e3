"""Pending tool changes: every definition withheld by its pins, with every reason it is withheld (as ``bastion pins
diff`` gives them) and a readable diff; the acts ``accept_tool_change`` (trust what the server offers now: running
gateways serve it at the next list or call) and ``reject_tool_change`` (keep it withheld, and record who refused it)."""

from __future__ import annotations

import asyncio
from typing import Any

from bastion.console.markup import Html, join, pre, tag
from bastion.console.registry import Act, ActRequest, BadForm, Outcome, Page, View, field_of
from bastion.guardrails.pin_book import SINGULAR
from bastion.guardrails.pin_diff import unified
from bastion.guardrails.pin_store import PinStoreError
from bastion.pin_review import where

# what lifts a reason by accepting, and whether the whole server must be accepted for it
_ACCEPTED_BY = {"changed-definition": False, "renamed-definition": False, "changed-configuration": True}


async def render(view: View) -> Html:
    return await asyncio.to_thread(_render, view)


def _render(view: View) -> Html:
    try:
        _, rows = view.data.withheld()
        reviews = view.data.latest_reviews()
    except PinStoreError as error:
        return tag("p", f"The pins file cannot be read: {error}", class_="notice refused")
    if not rows:
        return tag("p", "Nothing is withheld: every definition offered matches its pin, and the metadata scan finds "
                        "nothing in them.", class_="empty")
    return join(_change(view, row, reviews.get((row["configuration"], row["server"], _kind(row), row["name"])))
                for row in rows)


def _kind(row: dict[str, Any]) -> str:
    return next((kind for kind, said in SINGULAR.items() if said == row["kind"]), row["kind"])


def _change(view: View, row: dict[str, Any], review: dict[str, Any] | None) -> Html:
    reference = f"{row['server']}/{row['name']}"
    if row["status"] == "renamed":
        head, before = f"{reference} ({row['kind']}): a new name for {row['matches']!r}", f"{row['matches']} (pinned)"
    elif row["status"] == "changed":
        head, before = f"{reference} ({row['kind']}): changed since it was pinned {row['pinned_at']}", \
            f"{reference} pinned {row['pinned_at']}"
    else:
        head, before = f"{reference} ({row['kind']}): withheld, pinned {row['pinned_at']}", ""
    reasons = tag("ul", *(tag("li", tag("strong", reason["reason"]), ": ", reason["text"]) for reason in row["reasons"]),
                  class_="reasons")
    changes = tag("ul", *(tag("li", change) for change in row.get("changes", [])), class_="changes") \
        if row.get("changes") else Html("")
    diff = pre(unified(row["pinned"], row["offered"], before, f"{reference} offered {row['offered_at']}"),
               class_="diff") if row["offered"] is not None else Html("")
    said = Html("")
    if review is not None and review.get("decision") == "rejected":
        said = tag("p", f"Rejected by {review.get('by')} at {review.get('at')}: it stays withheld.", class_="muted")
    fields = {"configuration": row["configuration"] or "", "server": row["server"], "name": row["name"]}
    kinds = {reason["reason"] for reason in row["reasons"]}
    acts = []
    if kinds & _ACCEPTED_BY.keys():
        whole = any(_ACCEPTED_BY.get(k) for k in kinds)
        acts.append(view.form("accept_tool_change", "Accept the whole server" if whole else "Accept",
                              {**fields, "name": "" if whole else row["name"]}))
        acts.append(view.form("reject_tool_change", "Reject", fields))
    if "injection" in kinds:
        acts.append(tag("p", "Accepting does not lift the metadata scan's finding: review the server, then set "
                             "metadata_injection for it in its configuration.", class_="muted"))
    return tag("section", tag("h2", head), tag("p", f"configuration: {row['configuration'] or where(row['server'])}",
                                                class_="muted"),
               reasons, changes, diff, said, tag("div", *acts, class_="acts"), class_="change")


def _address(request: ActRequest) -> tuple[str, str | None, str]:
    """(pin identity, key or None for the whole server, what it is in words), refused outside ``pins_of``."""
    server = field_of(request.form, "server")
    configuration = request.form.get("configuration") or None
    name = request.form.get("name") or None
    pins_of = request.data.pins_of
    if pins_of is not None and (configuration or "") != pins_of:
        raise BadForm(f"this console acts on the pins of {pins_of} only")
    said = f"{server}/{name}" if name else f"every withheld change of server {server}"
    return request.data.pin_identity(configuration, server), name, said


async def accept(request: ActRequest) -> Outcome:
    identity, name, said = _address(request)
    store = request.data.pins()
    accepted, _ = await asyncio.to_thread(store.accept, identity, name, f"{request.identity.name} (web console)")
    if not accepted:
        return Outcome(f"nothing to accept for {said}: nothing of it is withheld by a changed definition", 404)
    return Outcome(f"accepted {len(accepted)} change{'s' if len(accepted) != 1 else ''} ({said}); running gateways "
                   "serve them at the next list or call")


async def reject(request: ActRequest) -> Outcome:
    identity, name, said = _address(request)
    refused = await asyncio.to_thread(request.data.pins().reject, identity, name, f"{request.identity.name} (web console)")
    if not refused:
        return Outcome(f"nothing to reject for {said}: nothing of it is withheld by a changed definition", 404)
    return Outcome(f"rejected {said}: it stays withheld")


def _target(form: Any) -> str | None:
    server = form.get("server")
    return None if not server else f"{server}/{form.get('name')}" if form.get("name") else server


PAGES = (Page("changes", "Tool changes", render),)
ACTS = (Act("accept_tool_change", accept, target=_target), Act("reject_tool_change", reject, target=_target))
