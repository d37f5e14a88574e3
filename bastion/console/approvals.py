"""The approval queue as the console shows it and settles it: the out-of-band approval channel in a browser.

What a waiting call's arguments show is what the approval queue recorded for it, which the policy decided when the
call was queued (``policy.approval.show_argument_values``: values, or only their shape), and never more: any
credential the secrets detectors find in a value is replaced by a marker naming its kind, since a web page is read
(and cached, and screenshotted) in more places than a terminal prompt. Settling a call is ``ApprovalQueue.settle``,
the same as ``bastion approve``, with the operator's identity as who settled it.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Callable

import orjson

from bastion.model import Identity
from bastion.policy.approval import ApprovalQueue, QueuedApproval
from bastion.state import StateUnavailable

# Replaces each credential found in the arguments' strings, in place; built from the guardrails' scanner by
# ``secret_redactor``; tests and callers without a scanner may pass any such function.
Redactor = Callable[[Any], Any]
MAX_ID = 64  # the queue's ids are 12 hex digits; a longer one is refused before it names a file
MAX_SHOWN = 20_000  # characters of a call's arguments the page shows; the rest is said to be cut


@dataclass(frozen=True, slots=True)
class WaitingCall:
    """One call a gateway waits on, as the approval page lists it."""

    id: str
    who: str  # the caller, as the approval prompt names it: ``alice (oauth, https://id.example.com)``
    server: str
    tool: str
    arguments: str  # indented JSON, as the policy let it be shown (values or shape), credentials redacted
    note: str  # what the session read before the call that could steer it, or a guardrail's question
    created: float
    seconds_left: float


def who_of(record: dict[str, Any]) -> str:
    who = record.get("who")
    if not isinstance(who, dict):
        return str(record.get("identity", ""))
    how = ", ".join(str(part) for part in (who.get("authenticated_by"), who.get("issuer")) if part)
    return f"{who.get('name')} ({how})" if how else str(who.get("name"))


def shown_arguments(arguments: Any, redact: Redactor | None) -> str:
    """The arguments as the page prints them: a copy, credentials redacted, as indented JSON."""
    shown = copy.deepcopy(arguments) if arguments is not None else {}
    if redact is not None:
        shown = redact(shown)
    try:
        text = orjson.dumps(shown, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return "(not shown: the recorded arguments are not JSON)"
    if len(text) > MAX_SHOWN:
        # A page of megabytes helps no one decide; `bastion approvals --json` prints them whole.
        return text[:MAX_SHOWN] + f"\n... ({len(text) - MAX_SHOWN} more characters: bastion approvals --json shows all)"
    return text


def waiting_call(item: QueuedApproval, redact: Redactor | None) -> WaitingCall:
    record = item.record
    return WaitingCall(
        id=item.id,
        who=who_of(record),
        server=str(record.get("server") or ""),
        tool=str(record.get("tool") or ""),
        arguments=shown_arguments(record.get("arguments"), redact),
        note=str(record.get("note") or ""),
        created=float(record.get("created") or 0),
        seconds_left=item.seconds_left,
    )


def waiting_calls(queue: ApprovalQueue, redact: Redactor | None = None) -> list[WaitingCall]:
    """The calls a gateway waits on now, oldest first (reads files: call it off the event loop)."""
    return [waiting_call(item, redact) for item in queue.pending()]


@dataclass(frozen=True, slots=True)
class Settled:
    """What became of an operator's approve or deny: ``problem`` says why nothing changed (None when it did)."""

    approval_id: str
    status: str  # approved | denied, or the status that stood (expired, withdrawn, ...) when nothing changed
    target: str  # server/tool, for the audit record and the page
    problem: str | None = None


def settle(queue: ApprovalQueue, approval_id: str, approve: bool, identity: Identity) -> Settled:
    """Approve or deny a waiting call as ``identity`` (reads and writes files: call it off the event loop)."""
    if len(approval_id) > MAX_ID:  # a file name too long for the file system, not an id
        return Settled(approval_id[:MAX_ID], "unknown", "", f"not an approval id: {approval_id[:MAX_ID]!r}...")
    try:
        item = queue.settle(approval_id, approve, by=f"{identity.describe()} in the console")
    except ValueError as error:  # not an id at all
        return Settled(approval_id, "unknown", "", str(error))
    except OSError as error:  # the queue directory cannot be read or written
        return Settled(approval_id, "unknown", "", f"the approval queue cannot be changed ({error.strerror})")
    except StateUnavailable as error:  # the shared state store cannot be reached: nothing is approved
        return Settled(approval_id, "unknown", "", f"the approval queue cannot be changed ({error})")
    except LookupError as error:
        standing = _standing(queue, approval_id)
        return Settled(approval_id, standing.status if standing else "unknown", _target(standing), str(error).strip("'"))
    return Settled(item.id, item.status, _target(item))


def _standing(queue: ApprovalQueue, approval_id: str) -> QueuedApproval | None:
    try:
        return queue.read(approval_id)
    except ValueError:
        return None


def _target(item: QueuedApproval | None) -> str:
    if item is None:
        return ""
    return f"{item.record.get('server')}/{item.record.get('tool')}"


def secret_redactor(scanner: Any = None) -> Redactor:
    """A Redactor replacing every credential the secrets guardrail finds (``[redacted: KIND]``); personal data is
    left, as the approving person may need it (the recipient of a message, say)."""
    from bastion.guardrails.content import text_slots
    from bastion.guardrails.scanning import default_scanner

    def redact(arguments: Any) -> Any:
        holder = {"arguments": arguments}
        (scanner or default_scanner()).scan(text_slots("tools/call", holder),
                                            lambda detector: "redact" if detector.guardrail == "secrets" else "off")
        return holder["arguments"]

    return redact


def age(created: float, now: float | None = None) -> str:
    """How long a call has waited, in words: ``12 s``, ``3 min``."""
    seconds = max(0, int((now if now is not None else time.time()) - created))
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min"
