"""The audit trail page: its chains verified by the code of ``bastion audit verify`` (intact, or where and how
each breaks), a search by time, caller, method or tool, outcome and text (a GET: a search is a link), and the
newest matching records, those where the chain breaks marked."""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from bastion.console import audit_worker
from bastion.console.audit_view import (
    OUTCOMES,
    ChainState,
    Found,
    SearchResult,
    caller_of,
    method_of,
    outcome_of,
    summary,
    target_of,
    when,
)
from bastion.console.markup import Html, join, pre, table, tag
from bastion.console.registry import Page, View

FIELDS = ("since", "until", "identity", "method", "outcome", "text", "limit")


async def render(view: View) -> Html:
    trail = view.data.audit_trail()
    if trail is None:
        return tag("p", "This configuration writes no audit trail (its policy or policy.audit is off).",
                   class_="empty")
    form = query_form(view.query)
    try:
        state, result, error = await audit_worker.read(trail, form, key_file=view.data.audit_key_file())
    except audit_worker.TrailUnreadable as problem:
        return tag("p", str(problem), class_="notice refused", role="alert")
    parts = [chain_banner(state), search_form(form, f"/admin/{view.path}")]
    if error or result is None:
        parts.append(tag("p", error or "", class_="notice refused", role="alert", data_testid="search-error"))
    else:
        parts.append(results_table(result))
    return join(parts)


def query_form(params: Mapping[str, Any]) -> dict[str, str]:
    """The search fields of a query string, ignoring any other parameter."""
    return {name: str(params[name]) for name in FIELDS if isinstance(params.get(name), str) and params[name]}


def chain_banner(state: ChainState | None) -> Html:
    if state is None:
        return Html("")
    if state.intact:
        notes = [tag("li", note) for note in state.notes]
        return tag("div", tag("strong", "Chain verified: intact"),
                   f" — {state.records} records in {state.chains} chain(s)",
                   tag("ul", *notes, class_="notes") if notes else Html(""),
                   class_="chain intact", data_testid="chain-state")
    return tag("div", tag("strong", "Chain BROKEN: the trail was altered"),
               f" — {len(state.problems)} problem(s), as bastion audit verify reports them:",
               tag("ul", *(tag("li", problem) for problem in state.problems)),
               class_="chain broken", role="alert", data_testid="chain-state")


def search_form(form: Mapping[str, str], action: str, *, with_outcome: bool = True) -> Html:
    def field(name: str, label: str, kind: str = "text", hint: str | None = None) -> Html:
        return tag("label", f"{label} ", tag("input", type=kind, name=name, value=form.get(name, ""), maxlength="200",
                                             placeholder=hint))

    options = [tag("option", outcome or "any", value=outcome, selected=form.get("outcome", "") == outcome)
               for outcome in OUTCOMES]
    outcome = tag("label", "Outcome ", tag("select", *options, name="outcome")) if with_outcome else Html("")
    return tag("form", field("since", "From (UTC)", "datetime-local"), field("until", "To (UTC)", "datetime-local"),
               field("identity", "Caller", hint="name"), field("method", "Method or tool", hint="tools/call, kb__"),
               outcome, field("text", "Text", hint="anything in the record"), field("limit", "Show", "number", "100"),
               tag("button", "Search", type="submit"), method="get", action=action, class_="search", role="search")


def results_table(result: SearchResult) -> Html:
    rows = [_row(found) for found in result.found]
    more = tag("p", f"Showing the newest {len(result.found)} matching records of {result.scanned} read; narrow the "
                    "search to see older ones.", class_="muted") if result.more else Html("")
    return join([table(("Time (UTC)", "Kind", "Caller", "Method", "Target", "Outcome", "Detail"), rows,
                       empty="No record matches."), more])


def _row(found: Found) -> list[Any]:
    record = found.record
    mark = tag("strong", "chain broken here ", class_="broken") if found.broken else Html("")
    raw = tag("details", tag("summary", f"record {record.get('seq', '')}"),
              pre(orjson.dumps(record, option=orjson.OPT_INDENT_2).decode()))
    return [when(record.get("ts")), str(record.get("kind", "")), caller_of(record), method_of(record),
            target_of(record), outcome_of(record), join([mark, summary(record), raw])]


PAGES = (Page("audit", "Audit trail", render),)
ACTS = ()
