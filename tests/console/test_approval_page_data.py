"""The approval queue as the console reads and settles it: a real queue directory, records as the gateway writes
them, the arguments shown as the policy let them be recorded with credentials redacted by the real detectors."""

from __future__ import annotations

import json

import pytest

from bastion.console.approvals import age, secret_redactor, settle, shown_arguments, waiting_calls
from bastion.model import Identity
from bastion.policy.approval import ApprovalQueue
from bastion.policy.audit_sealer import shape_of

OPERATOR = Identity("olga", ("admins",), "header")
AWS_KEY = "AKIAIOSFODNN7REALKEY"  # the shape of an AWS access key id, not one that exists


def _queued(queue: ApprovalQueue, arguments, **extra) -> str:
    record = {"identity": "alice", "groups": [], "who": {"name": "alice", "groups": [], "authenticated_by": "header"},
              "session": "s1", "method": "tools/call", "server": "files", "tool": "write", "arguments": arguments,
              **extra}
    return queue.submit(record, 60)


def test_waiting_calls_list_what_the_queue_recorded(tmp_path) -> None:
    queue = ApprovalQueue(tmp_path)
    first = _queued(queue, {"path": "/tmp/a", "text": "hello"}, note="the session read untrusted mail")
    second = _queued(queue, shape_of({"path": "/tmp/b"}))  # a policy that shows only shapes queued this one
    calls = waiting_calls(queue)
    assert [call.id for call in calls] == [first, second]
    assert calls[0].who == "alice (header)" and (calls[0].server, calls[0].tool) == ("files", "write")
    assert json.loads(calls[0].arguments) == {"path": "/tmp/a", "text": "hello"}
    assert calls[0].note == "the session read untrusted mail"
    assert json.loads(calls[1].arguments) == {"path": {"string": 6}}  # the shape, never more
    assert 0 < calls[0].seconds_left <= 60


def test_settled_calls_are_no_longer_waiting(tmp_path) -> None:
    queue = ApprovalQueue(tmp_path)
    approval_id = _queued(queue, {})
    done = settle(queue, approval_id, True, OPERATOR)
    assert (done.status, done.problem, done.target) == ("approved", None, "files/write")
    assert queue.read(approval_id).record["by"] == "olga (header) in the console"
    assert waiting_calls(queue) == []


def test_a_second_answer_changes_nothing_and_says_why(tmp_path) -> None:
    queue = ApprovalQueue(tmp_path)
    approval_id = _queued(queue, {})
    settle(queue, approval_id, False, OPERATOR)
    again = settle(queue, approval_id, True, OPERATOR)
    assert again.status == "denied" and "already denied by olga" in again.problem
    assert queue.read(approval_id).status == "denied"


@pytest.mark.parametrize("hostile", ["../../etc/passwd", "", "a" * 5000, "id<script>", "1;rm"])
def test_an_id_that_is_not_one_is_refused_without_touching_files(tmp_path, hostile) -> None:
    queue = ApprovalQueue(tmp_path)
    settled = settle(queue, hostile, True, OPERATOR)
    assert settled.problem and settled.status == "unknown"
    assert len(settled.approval_id) <= 64
    assert list(tmp_path.iterdir()) == []


def test_credentials_in_arguments_are_redacted_on_the_page() -> None:
    arguments = {"note": f"deploy with {AWS_KEY} now", "nested": [{"k": AWS_KEY}], "plain": "nothing secret"}
    shown = json.loads(shown_arguments(arguments, secret_redactor()))
    assert AWS_KEY not in json.dumps(shown)
    assert shown["note"] == "deploy with [redacted: aws-access-key] now"
    assert shown["plain"] == "nothing secret"
    assert arguments["note"].endswith("now") and AWS_KEY in arguments["note"]  # the queue's record is left alone


def test_arguments_json_cannot_hold_are_not_shown() -> None:
    assert shown_arguments({"n": float("nan")}, None) != ""  # orjson writes NaN as null: shown, not a crash
    assert shown_arguments(None, None) == "{}"


def test_huge_arguments_are_cut_on_the_page() -> None:
    shown = shown_arguments({"blob": "x" * 1_000_000}, None)
    assert len(shown) < 20_200 and shown.endswith("more characters: bastion approvals --json shows all)")


def test_age_in_words() -> None:
    assert age(100.0, 112.5) == "12 s"
    assert age(0.0, 600.0) == "10 min"
