"""The audit trail page: the chain's verification on top (intact, or where it breaks, as ``bastion audit verify``
says it), a search form (GET, so a search is a link one can share), and the matching records, newest first, with
the records where the chain breaks marked. Every value from the trail is escaped."""

from __future__ import annotations

from html import escape
from typing import Any, Mapping

import orjson

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

FIELDS = ("since", "until", "identity", "method", "outcome", "text", "limit")


def chain_banner(state: ChainState) -> str:
    if state.intact:
        notes = "".join(f"<li>{escape(note)}</li>" for note in state.notes)
        return (f'<div class="chain intact" data-testid=chain-state><strong>Chain verified: intact</strong> — '
                f"{state.records} records in {state.chains} chain(s)"
                + (f"<ul class=notes>{notes}</ul>" if notes else "") + "</div>")
    problems = "".join(f"<li>{escape(problem)}</li>" for problem in state.problems)
    return (f'<div class="chain broken" role=alert data-testid=chain-state><strong>Chain BROKEN: the trail was '
            f"altered</strong> — {len(state.problems)} problem(s), as <code>bastion audit verify</code> reports them:"
            f"<ul>{problems}</ul></div>")


def search_form(form: Mapping[str, str], action: str, *, with_outcome: bool = True) -> str:
    def field(name: str, label: str, kind: str = "text", hint: str = "") -> str:
        value = escape(form.get(name, ""))
        return (f'<label>{label} <input type={kind} name={name} value="{value}" maxlength=200'
                + (f' placeholder="{escape(hint)}"' if hint else "") + "></label>")

    options = "".join(
        f'<option value="{outcome}"{" selected" if form.get("outcome", "") == outcome else ""}>{outcome or "any"}</option>'
        for outcome in OUTCOMES)
    outcome = f"<label>Outcome <select name=outcome>{options}</select></label>" if with_outcome else ""
    return (f'<form method=get action="{escape(action)}" class=search role=search>'
            + field("since", "From", "datetime-local") + field("until", "To", "datetime-local")
            + field("identity", "Caller", hint="name") + field("method", "Method or tool", hint="tools/call, files__")
            + outcome + field("text", "Text", hint="anything in the record")
            + field("limit", "Show", "number", "100")
            + "<button type=submit>Search</button></form>")


def results_table(result: SearchResult) -> str:
    if not result.found:
        return '<p class=empty data-testid=no-records>No record matches.</p>'
    rows = "".join(_row(found) for found in result.found)
    more = (f'<p class=more>Showing the newest {len(result.found)} matching records of {result.scanned} read; '
            "narrow the search to see older ones.</p>") if result.more else ""
    return ("<table class=audit data-testid=records><thead><tr><th>Time (UTC)</th><th>Kind</th><th>Caller</th>"
            "<th>Method</th><th>Target</th><th>Outcome</th><th>Detail</th></tr></thead><tbody>"
            + rows + "</tbody></table>" + more)


def _row(found: Found) -> str:
    record = found.record
    broken = (' class=broken title="the chain breaks at this record"', "<strong>chain broken here</strong> ") \
        if found.broken else ("", "")
    raw = escape(orjson.dumps(record, option=orjson.OPT_INDENT_2).decode())
    return (f"<tr{broken[0]}><td>{escape(when(record.get('ts')))}</td><td>{escape(str(record.get('kind', '')))}</td>"
            f"<td>{escape(caller_of(record))}</td><td>{escape(method_of(record))}</td>"
            f"<td>{escape(target_of(record))}</td><td>{escape(outcome_of(record))}</td>"
            f"<td>{broken[1]}{escape(summary(record))}<details><summary>record {escape(str(record.get('seq', '')))}"
            f"</summary><pre>{raw}</pre></details></td></tr>")


def render(form: Mapping[str, str], action: str, state: ChainState, result: SearchResult | None,
           error: str | None) -> str:
    """The page's body; ``error`` says which search field could not be read (then there are no results)."""
    parts = ["<h1>Audit trail</h1>", chain_banner(state), search_form(form, action)]
    if error:
        parts.append(f'<p class="flash problem" role=alert data-testid=search-error>{escape(error)}</p>')
    elif result is not None:
        parts.append(results_table(result))
    return "\n".join(parts)


def query_form(params: Mapping[str, Any]) -> dict[str, str]:
    """The search fields of a query string (first value of each), ignoring any other parameter."""
    out: dict[str, str] = {}
    for name in FIELDS:
        value = params.get(name)
        if isinstance(value, list):
            value = value[0] if value else ""
        if isinstance(value, str) and value:
            out[name] = value
    return out
