"""The guardrail interventions page: from the audit trail's guardrail records, how many of each guardrail, action
and kind, and the newest ones with where, who and which rule (never the matched value: none is recorded)."""

from __future__ import annotations

from typing import Any

from bastion.console import audit_worker
from bastion.console.audit_view import caller_of, target_of, when
from bastion.console.interventions import counts
from bastion.console.markup import Html, join, table, tag
from bastion.console.pages.audit import query_form, search_form
from bastion.console.registry import Page, View


async def render(view: View) -> Html:
    trail = view.data.audit_trail()
    if trail is None:
        return tag("p", "This configuration writes no audit trail, where interventions are recorded.", class_="empty")
    form = query_form(view.query)
    try:
        _, result, error = await audit_worker.read(trail, form, verify=False, kind="guardrail", count=True)
    except audit_worker.TrailUnreadable as problem:
        result, error = None, str(problem)
    parts = [search_form(form, f"/admin/{view.path}", with_outcome=False)]
    if error or result is None:
        parts.append(tag("p", error or "", class_="notice refused", role="alert"))
        return join(parts)
    parts += [tag("h2", "By guardrail and kind"),
              table(("Guardrail", "Action", "Found", "Interventions"),
                    [[row.guardrail, row.action, row.kind, row.count] for row in counts(result)],
                    empty="No guardrail intervention is recorded."),
              tag("h2", "Newest"),
              table(("Time (UTC)", "Guardrail", "Action", "Found", "Where", "Caller", "Rule", "Detail"),
                    [_row(found.record) for found in result.found], empty="None matches.")]
    return join(parts)


def _row(record: dict[str, Any]) -> list[Any]:
    return [when(record.get("ts")), record.get("guardrail", ""), record.get("action", ""), record.get("found", ""),
            target_of(record), caller_of(record), tag("code", str(record.get("rule", ""))), record.get("detail") or ""]


PAGES = (Page("interventions", "Guardrails", render),)
ACTS = ()
