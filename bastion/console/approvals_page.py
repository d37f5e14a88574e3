"""The approval queue page: the calls waiting for a person, each with approve and deny (a POST carrying the
console's CSRF fields). Everything from outside (callers' names, tools, arguments, notes) is escaped."""

from __future__ import annotations

from html import escape

from bastion.console.approvals import Settled, WaitingCall, age

APPROVE = "approve"
DENY = "deny"
DECISIONS = (APPROVE, DENY)


def render(calls: list[WaitingCall], form_fields: str, action: str, settled: Settled | None = None,
           now: float | None = None) -> str:
    """The page's body. ``form_fields``: the framework's hidden CSRF inputs, already HTML; ``action``: where the
    forms post (their ``approval_id`` and ``decision`` fields say what to do)."""
    parts = ["<h1>Approval queue</h1>",
             "<p class=lead>Calls waiting for a person. Arguments are shown as the policy let the queue record them "
             "(values, or only their shape), credentials redacted.</p>"]
    if settled is not None:
        parts.append(outcome_note(settled))
    if not calls:
        parts.append('<p class=empty data-testid=no-approvals>No call is waiting for a person.</p>')
        return "\n".join(parts)
    parts.append("<table class=approvals><thead><tr><th>Call</th><th>Caller</th><th>Arguments</th><th>Waiting</th>"
                 "<th>Left</th><th></th></tr></thead><tbody>")
    parts.extend(_row(call, form_fields, action, now) for call in calls)
    parts.append("</tbody></table>")
    return "\n".join(parts)


def _row(call: WaitingCall, form_fields: str, action: str, now: float | None) -> str:
    note = f'<p class=note>{escape(call.note)}</p>' if call.note else ""
    ident = escape(call.id)
    return (
        f'<tr data-approval="{ident}"><td><code>{escape(call.server)}/{escape(call.tool)}</code>'
        f'<br><small>id {ident}</small></td>'
        f"<td>{escape(call.who)}</td>"
        f"<td><pre>{escape(call.arguments)}</pre>{note}</td>"
        f"<td>{escape(age(call.created, now))}</td><td>{int(call.seconds_left)} s</td>"
        f'<td><form method=post action="{escape(action)}">{form_fields}'
        f'<input type=hidden name=approval_id value="{ident}">'
        f'<button type=submit name=decision value={APPROVE} class=approve>Approve</button> '
        f'<button type=submit name=decision value={DENY} class=deny>Deny</button></form></td></tr>'
    )


def outcome_note(settled: Settled) -> str:
    what = f"{escape(settled.target)} ({escape(settled.approval_id)})" if settled.target else escape(settled.approval_id)
    if settled.problem is None:
        return f'<p class="flash ok" role=status data-testid=settled>{what}: {escape(settled.status)}.</p>'
    return f'<p class="flash problem" role=alert data-testid=settled>Nothing changed: {escape(settled.problem)}</p>'
