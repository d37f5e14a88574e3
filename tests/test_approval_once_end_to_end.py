"""One approval is one execution, through real Bastion processes: ``bastion serve`` taking 2026-07-28 POSTs, each
on a TCP connection of its own, and ``bastion run`` with a handshake-era client over stdio.

The raw server marks every ``tools/call`` it gets; its ``echo``, approved in advance by the configuration, is called
last to settle the count (the server handles its input in order, so every call sent before it is marked by then).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.http.conftest import Served, serve_config, stop_bastion
from tests.support import BASTION, READY_TIMEOUT, RawClient, raw_server

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
IDENTITY_HEADER = "X-Bastion-Identity"
ACCEPT = {"action": "accept", "content": {"approve": True}}
REPLAYS = 5
REPLAY_REFUSED = ("Call to 'raw__big' was not approved: this approval was already used (one approval runs one call); "
                  "send the call again without requestState to ask again")


@pytest.fixture(autouse=True)
def _state_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _config(tmp_path: Path, approver: str = "client") -> Path:
    """The raw server, untrusted, under the default policy: every call waits for a person but echo's. The client may
    answer the approvals itself (``approver``) unless told otherwise."""
    entry = raw_server(tmp_path / "marks", auto_approve=["echo"])
    entry["env"]["RAW_SERVER_MARK_CALLS"] = "1"
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"raw": entry}, "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"},
        "http": {"identity_header": IDENTITY_HEADER},
        "policy": {
            "approval": {"fallback": "queue", "timeout_seconds": 120, "poll_seconds": 0.1, "approver": approver,
                         "queue_dir": str(tmp_path / "queue")},
            "audit": {"path": str(tmp_path / "audit.jsonl")},
        },
    }))
    return config


def _big_calls(tmp_path: Path) -> int:
    marks = tmp_path / "marks"
    lines = marks.read_text().splitlines() if marks.exists() else []
    return sum(1 for line in lines if line.startswith("call ") and json.loads(line[5:])["params"]["name"] == "big")


# --- 2026-07-28 over HTTP ---------------------------------------------------------------------------------

def _serve(tmp_path: Path, approver: str = "client") -> Served:
    return serve_config(_config(tmp_path, approver), tmp_path, tmp_path / "events.log")


async def _post(served: Served, request_id: int, name: str, arguments: dict[str, Any], **params: Any) -> dict:
    """One 2026-07-28 tools/call, on a connection of its own (a client of its own, closed after the answer)."""
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
            "io.modelcontextprotocol/clientInfo": {"name": "replayer", "version": "0"}}
    headers = {IDENTITY_HEADER: "alice", "content-type": "application/json", "accept": "application/json",
               "mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": name}
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": meta, **params}}
    async with httpx2.AsyncClient(timeout=120) as http:
        response = await http.post(served.url, headers=headers, json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def _settled_big_calls(served: Served, tmp_path: Path) -> int:
    settled = await _post(served, 999, "raw__echo", {"text": "settled"})
    assert settled["result"]["content"][0]["text"] == "settled"
    return _big_calls(tmp_path)


async def test_a_2026_approval_runs_its_call_once_across_posts(tmp_path: Path) -> None:
    served = _serve(tmp_path)
    try:
        asked = (await _post(served, 1, "raw__big", {"size": 3}))["result"]
        assert asked["resultType"] == "input_required" and set(asked["inputRequests"]) == {"approval"}
        approved = {"requestState": asked["requestState"], "inputResponses": {"approval": ACCEPT}}
        ran = await _post(served, 2, "raw__big", {"size": 3}, **approved)
        assert ran["result"]["content"][0]["text"] == "xxx"
        # The same state again, POST after POST: refused, never run.
        for request_id in range(3, 3 + REPLAYS):
            replay = await _post(served, request_id, "raw__big", {"size": 3}, **approved)
            assert replay["error"]["code"] == -32001 and replay["error"]["message"] == REPLAY_REFUSED, replay
        # The identical call without the state asks the person again.
        again = (await _post(served, 10, "raw__big", {"size": 3}))["result"]
        assert again["resultType"] == "input_required" and again["requestState"] != asked["requestState"]
        assert await _settled_big_calls(served, tmp_path) == 1

        # That second approval, sent on several connections at once: one of them runs the call.
        approved = {"requestState": again["requestState"], "inputResponses": {"approval": ACCEPT}}
        answers = await asyncio.gather(*(_post(served, 20 + n, "raw__big", {"size": 3}, **approved)
                                         for n in range(REPLAYS)))
        assert [a["result"]["content"][0]["text"] for a in answers if "result" in a] == ["xxx"], answers
        assert all(a["error"]["message"] == REPLAY_REFUSED for a in answers if "error" in a)
        assert await _settled_big_calls(served, tmp_path) == 2
    finally:
        stop_bastion(served)


# --- the handshake era over stdio ---------------------------------------------------------------------------

def _next(client: RawClient, wanted: Any, timeout: float = 60.0) -> dict:
    """The next message ``wanted`` picks (a predicate), passing over the others (wait notices, say)."""
    while True:
        message = client.recv(timeout)
        if wanted(message):
            return message
        client.skipped.append(message)


def _settled_over_stdio(client: RawClient, tmp_path: Path, request_id: int) -> int:
    answer = client.request(request_id, "tools/call", {"name": "raw__echo", "arguments": {"text": "settled"}},
                            timeout=60)
    assert answer["result"]["content"][0]["text"] == "settled"
    return _big_calls(tmp_path)


def _call(client: RawClient, request_id: int) -> None:
    client.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                 "params": {"name": "raw__big", "arguments": {"size": 1}}})


def _answer_of(request_id: int):
    return lambda message: message.get("id") == request_id and "method" not in message


def _elicitation(message: dict) -> bool:
    return message.get("method") == "elicitation/create"


def test_a_prompts_answer_settles_one_call_and_a_repeated_answer_settles_nothing(tmp_path: Path) -> None:
    client = RawClient(_config(tmp_path), log=tmp_path / "stderr.log")
    try:
        client.initialize(LEGACY, {"elicitation": {}})
        _call(client, 1)
        first = _next(client, _elicitation)
        answer = {"jsonrpc": "2.0", "id": first["id"], "result": ACCEPT}
        client.send(answer)
        assert _next(client, _answer_of(1))["result"]["content"][0]["text"] == "x"
        client.send(answer)  # the same answer again, with nothing asking

        _call(client, 2)  # the identical call: the person is asked again
        second = _next(client, _elicitation)
        assert second["id"] != first["id"]
        client.send(answer)  # the first prompt's answer, while the second prompt waits: it answers nothing
        client.send({"jsonrpc": "2.0", "id": second["id"], "result": {"action": "decline"}})
        refused = _next(client, _answer_of(2))["error"]
        assert refused["code"] == -32001 and "declined" in refused["message"]
        assert _settled_over_stdio(client, tmp_path, 3) == 1
    finally:
        client.close()


def _notice(message: dict) -> bool:
    params = message.get("params") or {}
    return message.get("method") == "notifications/message" and "approvalId" in (params.get("data") or {})


def _bastion(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([BASTION, *argv], capture_output=True, text=True, timeout=60)


def test_a_queue_approval_settles_one_call(tmp_path: Path) -> None:
    queue = str(tmp_path / "queue")
    client = RawClient(_config(tmp_path), log=tmp_path / "stderr.log")
    try:
        client.initialize(LEGACY)  # no elicitation: the call waits in the queue
        _call(client, 1)
        first = _next(client, _notice)["params"]["data"]["approvalId"]
        assert _bastion("approve", first, "--queue-dir", queue).returncode == 0
        assert _next(client, _answer_of(1))["result"]["content"][0]["text"] == "x"
        again = _bastion("approve", first, "--queue-dir", queue)
        assert again.returncode == 1 and "already approved" in again.stderr

        _call(client, 2)  # the identical call waits for a person again, under a request of its own
        second = _next(client, _notice)["params"]["data"]["approvalId"]
        assert second != first
        assert _bastion("approve", first, "--queue-dir", queue).returncode == 1  # the old approval settles nothing
        assert _bastion("deny", second, "--queue-dir", queue).returncode == 0
        refused = _next(client, _answer_of(2))["error"]
        assert refused["code"] == -32001 and "denied" in refused["message"]
        assert _settled_over_stdio(client, tmp_path, 3) == 1
    finally:
        client.close()


# --- who may approve ----------------------------------------------------------------------------------------

def _waiting_approval(log: Path) -> str:
    """The id of the approval a call waits for, once the gateway's log names it."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"waiting for a person's approval \(approval (\S+)\)", log.read_text() if log.exists() else "")
        if found:
            return found.group(1)
        time.sleep(0.05)
    raise AssertionError(f"no call waits for approval: {log.read_text()}")


async def test_over_http_an_agent_that_declares_elicitation_cannot_approve_its_own_call_by_default(
        tmp_path: Path) -> None:
    """Under the default ``approver = "auto"`` a client over HTTP is never asked: its call waits for a person, who
    settles it with `bastion approve`; no input_required a client could answer itself."""
    served = _serve(tmp_path, approver="auto")
    try:
        call = asyncio.ensure_future(_post(served, 1, "raw__big", {"size": 2}))
        approval_id = await asyncio.to_thread(_waiting_approval, served.stderr)
        assert not call.done()
        approved = await asyncio.to_thread(_bastion, "approve", approval_id, "--queue-dir", str(tmp_path / "queue"))
        assert approved.returncode == 0, approved.stderr
        answer = (await call)["result"]
        assert answer.get("resultType", "complete") == "complete" and answer["content"][0]["text"] == "xx"
        assert await _settled_big_calls(served, tmp_path) == 1
    finally:
        stop_bastion(served)


def test_out_of_band_over_stdio_never_asks_the_client(tmp_path: Path) -> None:
    """``approver = "out_of_band"``: a client that declares elicitation gets no prompt; a person approves."""
    client = RawClient(_config(tmp_path, approver="out_of_band"), log=tmp_path / "stderr.log")
    try:
        client.initialize(LEGACY, {"elicitation": {}})
        _call(client, 1)
        waiting = _next(client, _notice)["params"]["data"]
        assert "answer the prompt in the client" not in waiting["message"]
        assert _bastion("approve", waiting["approvalId"], "--queue-dir", str(tmp_path / "queue")).returncode == 0
        assert _next(client, _answer_of(1))["result"]["content"][0]["text"] == "x"
        assert not any(_elicitation(message) for message in client.skipped)
    finally:
        client.close()

