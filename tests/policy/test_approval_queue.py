"""The local approval queue: how a request ends, and why a settled, expired, withdrawn or orphaned one cannot be
approved; the command a person is told to run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bastion.policy.approval import ApprovalQueue, approve_command, process_started

RECORD = {"identity": "alice", "server": "fs", "tool": "write_file", "arguments": {"path": "/tmp/x"}}


def _rewrite(queue: ApprovalQueue, approval_id: str, **changes: object) -> None:
    path = queue.directory / f"{approval_id}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_request_names_the_process_waiting_for_it(tmp_path: Path) -> None:
    queue = ApprovalQueue(tmp_path)
    approval_id = queue.submit(RECORD, 60)
    item = queue.read(approval_id)
    assert item is not None and item.status == "pending"
    assert item.record["pid"] == os.getpid() and item.record["pid_started"] == process_started(os.getpid())
    assert [i.id for i in queue.pending()] == [approval_id]


def test_approving_twice_says_it_is_already_settled(tmp_path: Path) -> None:
    queue = ApprovalQueue(tmp_path)
    approval_id = queue.submit(RECORD, 60)
    assert queue.settle(approval_id, True, by="alice").status == "approved"
    with pytest.raises(LookupError, match="already approved by alice"):
        queue.settle(approval_id, False)
    with pytest.raises(LookupError, match="no approval request 0123abcd"):
        queue.settle("0123abcd", True)


def test_a_request_past_its_time_reads_as_timed_out(tmp_path: Path) -> None:
    queue = ApprovalQueue(tmp_path)
    approval_id = queue.submit(RECORD, 60)
    _rewrite(queue, approval_id, expires=1.0)
    assert queue.read(approval_id).status == "expired" and queue.pending() == []
    with pytest.raises(LookupError, match="timed out after 60 s"):
        queue.settle(approval_id, True)


def test_a_request_whose_gateway_is_gone_is_orphaned(tmp_path: Path) -> None:
    queue = ApprovalQueue(tmp_path)
    approval_id = queue.submit(RECORD, 60)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _rewrite(queue, approval_id, pid=gone.pid, pid_started=process_started(os.getpid()))
    assert queue.read(approval_id).status == "orphaned" and queue.pending() == []
    with pytest.raises(LookupError, match=f"orphaned: the gateway that asked \\(pid {gone.pid}\\) is no longer running"):
        queue.settle(approval_id, True)
    # The same pid with another start time is another process: the one that asked is gone.
    _rewrite(queue, approval_id, pid=os.getpid(), pid_started="1")
    assert queue.read(approval_id).status == "orphaned"


async def test_a_cancelled_wait_withdraws_the_request(tmp_path: Path) -> None:
    queue = ApprovalQueue(tmp_path)
    approval_id = queue.submit(RECORD, 60)
    waiting = asyncio.ensure_future(queue.wait(approval_id, 60, 0.05))
    await asyncio.sleep(0.2)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    item = queue.read(approval_id)
    assert item.status == "withdrawn" and item.record["why"] == "the client withdrew the call"
    with pytest.raises(LookupError, match="withdrawn: the client cancelled the call or disconnected"):
        queue.settle(approval_id, True)


async def test_a_wait_ends_with_the_answer_or_the_timeout(tmp_path: Path) -> None:
    queue = ApprovalQueue(tmp_path)
    approval_id = queue.submit(RECORD, 60)
    waiting = asyncio.ensure_future(queue.wait(approval_id, 60, 0.05))
    await asyncio.sleep(0.1)
    await asyncio.to_thread(queue.settle, approval_id, False)
    assert await waiting == "denied"
    late = queue.submit(RECORD, 0.2)
    assert await queue.wait(late, 0.2, 0.05) == "expired"
    assert queue.read(late).record["status"] == "expired"


def test_the_command_names_the_queue_unless_it_is_the_default(tmp_path: Path) -> None:
    default = str(tmp_path / "state" / "approvals")
    assert approve_command("abc123", default, default) == "bastion approve abc123"
    elsewhere = tmp_path / "my queue"
    assert approve_command("abc123", elsewhere, default) == f"bastion approve abc123 --queue-dir '{elsewhere}'"
