"""The approval queue page: the calls waiting for a person, with their arguments as the policy let the queue record
them (credentials redacted), each with Approve and Deny: the acts ``approve`` and ``deny``, Cedar's ``administer``
with that operation, audited like every act; the gateway's waiting call goes on (or is refused) within its poll."""

from __future__ import annotations

import asyncio

from bastion.console.approvals import MAX_ID, WaitingCall, age, secret_redactor, settle, waiting_calls
from bastion.console.markup import Html, join, pre, table, tag
from bastion.console.registry import Act, ActRequest, Outcome, Page, View, field_of


async def render(view: View) -> Html:
    queue = view.data.approval_queue()
    calls = await asyncio.to_thread(waiting_calls, queue, secret_redactor())
    lead = tag("p", "Calls waiting for a person's approval. Arguments are shown as the policy let the queue record "
                    "them (values, or only their shape; policy.approval.show_argument_values), credentials redacted. "
                    "This is the out-of-band approval channel: the agent's call goes on once you answer.",
               class_="muted")
    rows = [_row(view, call) for call in calls]
    return join([lead, table(("Call", "Caller", "Arguments", "Waiting", "Left", ""), rows,
                             empty="No call is waiting for a person.")])


def _row(view: View, call: WaitingCall) -> list[Html | str]:
    fields = {"approval_id": call.id}
    acts = tag("div", view.form("approve", "Approve", fields, class_="act approve"),
               view.form("deny", "Deny", fields, class_="act deny"), class_="acts", data_approval=call.id)
    arguments = join([pre(call.arguments), tag("p", call.note, class_="note") if call.note else Html("")])
    return [tag("span", tag("code", f"{call.server}/{call.tool}"), Html("<br>"), tag("small", f"id {call.id}")),
            call.who, arguments, age(call.created), f"{int(call.seconds_left)} s", acts]


def _answer(approve: bool):
    async def run(request: ActRequest) -> Outcome:
        approval_id = field_of(request.form, "approval_id", most=MAX_ID)
        done = await asyncio.to_thread(settle, request.data.approval_queue(), approval_id, approve, request.identity)
        if done.problem is not None:
            return Outcome(f"Nothing changed: {done.problem}", 409 if done.status != "unknown" else 404)
        return Outcome(f"{done.target} ({done.approval_id}): {done.status}; the waiting call goes on"
                       if approve else f"{done.target} ({done.approval_id}): {done.status}; the call is refused")
    return run


PAGES = (Page("approvals", "Approvals", render),)
ACTS = (Act("approve", _answer(True), target=lambda form: form.get("approval_id")),
        Act("deny", _answer(False), target=lambda form: form.get("approval_id")))
