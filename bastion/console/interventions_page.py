"""The guardrail interventions page: counts since the gateway started, then the recent interventions from the
audit trail (who, where, which rule; never the matched value), searchable as the audit page is."""

from __future__ import annotations

from html import escape
from typing import Mapping

from bastion.console.audit_page import search_form
from bastion.console.audit_view import SearchResult, caller_of, target_of, when
from bastion.console.interventions import InterventionCount


def counts_table(rows: list[InterventionCount]) -> str:
    if not rows:
        return "<p class=empty data-testid=no-counts>No guardrail has intervened since the gateway started.</p>"
    body = "".join(f"<tr><td>{escape(row.guardrail)}</td><td>{escape(row.action)}</td><td>{escape(row.kind)}</td>"
                   f"<td class=num>{row.count}</td></tr>" for row in rows)
    return ("<table class=counts data-testid=counts><thead><tr><th>Guardrail</th><th>Action</th><th>Found</th>"
            f"<th>Since start</th></tr></thead><tbody>{body}</tbody></table>")


def recent_table(result: SearchResult) -> str:
    if not result.found:
        return "<p class=empty data-testid=no-interventions>No intervention in the audit trail matches.</p>"
    rows = []
    for found in result.found:
        record = found.record
        detail = escape(str(record.get("detail") or ""))
        rows.append(f"<tr><td>{escape(when(record.get('ts')))}</td><td>{escape(str(record.get('guardrail', '')))}</td>"
                    f"<td>{escape(str(record.get('action', '')))}</td><td>{escape(str(record.get('found', '')))}</td>"
                    f"<td>{escape(target_of(record))}</td><td>{escape(caller_of(record))}</td>"
                    f"<td><code>{escape(str(record.get('rule', '')))}</code></td><td>{detail}</td></tr>")
    return ("<table class=interventions data-testid=interventions><thead><tr><th>Time (UTC)</th><th>Guardrail</th>"
            "<th>Action</th><th>Found</th><th>Where</th><th>Caller</th><th>Rule</th><th>Detail</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def render(rows: list[InterventionCount], form: Mapping[str, str], action: str, result: SearchResult | None,
           error: str | None) -> str:
    parts = ["<h1>Guardrail interventions</h1>", "<h2>Since the gateway started</h2>", counts_table(rows),
             "<h2>Recent, from the audit trail</h2>", search_form(form, action, with_outcome=False)]
    if error:
        parts.append(f'<p class="flash problem" role=alert>{escape(error)}</p>')
    elif result is not None:
        parts.append(recent_table(result))
    return "\n".join(parts)
