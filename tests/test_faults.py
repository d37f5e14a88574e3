"""Bad input and faults, end to end: a raw client → ``bastion run`` → a framework-free server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.support import (
    BASTION,
    FIXTURES,
    READY_TIMEOUT,
    SANDBOX_TIERS,
    RawClient,
    pids_with_tag,
    pipe_holders,
    raw_server,
    wait_for,
    write_config,
)


@pytest.fixture
def marks(tmp_path):
    return tmp_path / "marks.txt"


# With the policy off nothing in the chain reads a tools/call, so its bytes pass through the one request path; a
# policy section that allows everything puts an interceptor that reads them in the way. Both must look the same to
# the client and the server.
ALLOW_ALL = "permit(principal, action, resource);\n"


@pytest.fixture(params=["direct", "pipeline"])
def client(request, tmp_path, marks):
    config = tmp_path / "bastion.json"
    settings: dict = {"servers": {"raw": raw_server(marks)}, "max_message_bytes": 65536, "policy": "off",
                      "ready_timeout": READY_TIMEOUT}
    if request.param == "pipeline":
        (tmp_path / "allow.cedar").write_text(ALLOW_ALL)
        settings["policy"] = {"policy_files": ["allow.cedar"], "audit": {"enabled": False}}
    config.write_text(json.dumps(settings))
    c = RawClient(config)
    yield c
    c.close()


def _call(client: RawClient, rid, name, arguments=None, timeout=30.0):
    return client.request(rid, "tools/call", {"name": name, "arguments": arguments or {}}, timeout=timeout)


def _still_works(client: RawClient, rid="alive") -> None:
    answer = _call(client, rid, "raw__echo", {"text": "still here"})
    assert answer["result"]["content"][0]["text"] == "still here"


def test_malformed_json_is_answered_and_the_connection_survives(client):
    client.initialize()
    client.send_bytes(b'{"jsonrpc": "2.0", "id": 1, "method": \n')
    answer = client.recv()
    assert answer["error"]["code"] == -32700 and answer["id"] is None
    _still_works(client)


def test_a_cancellation_naming_an_object_leaves_the_connection_and_its_calls_alone(client):
    # Found by fuzzing the client's session: an object as requestId raised TypeError (unhashable) out of it.
    client.initialize()
    client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": {"id": 1}}})
    client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": [1]}})
    _still_works(client)


def test_invalid_utf8_is_a_parse_error(client):
    client.initialize()
    client.send_bytes(b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "\xff\xfe"}}\n')
    answer = client.recv()
    assert answer["error"]["code"] == -32700
    assert "UTF-8" in answer["error"]["message"]
    _still_works(client)


def test_oversize_frame_is_refused_with_a_clear_error(client):
    client.initialize()
    big = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                      "params": {"name": "raw__echo", "arguments": {"text": "y" * 100_000}}})
    client.send_bytes(big.encode() + b"\n")
    answer = client.recv()
    assert answer["error"]["code"] == -32600
    assert "65536" in answer["error"]["message"]
    _still_works(client)


def test_batches_are_refused(client):
    client.initialize()
    client.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "method": "ping"}])
    answer = client.recv()
    assert answer["error"]["code"] == -32600
    assert "batch" in answer["error"]["message"]
    _still_works(client)


def test_unknown_method_and_unknown_tool(client):
    client.initialize()
    assert client.request(1, "no/such/method", {})["error"]["code"] == -32601
    answer = _call(client, 2, "raw__nope")
    assert answer["error"]["code"] == -32602
    assert "raw__nope" in answer["error"]["message"]


def test_invalid_ids_are_refused(client):
    client.initialize()
    client.send({"jsonrpc": "2.0", "id": None, "method": "ping"})
    assert client.recv()["error"]["code"] == -32600
    client.send({"jsonrpc": "2.0", "id": 1.5, "method": "ping"})
    assert client.recv()["error"]["code"] == -32600
    _still_works(client)


def test_duplicate_in_flight_id_is_refused(client, marks):
    client.initialize()
    client.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "raw__slow", "arguments": {}}})
    answer = client.request(7, "ping")
    assert answer["error"]["code"] == -32600
    assert "already in flight" in answer["error"]["message"]
    client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}})
    assert wait_for(lambda: marks.exists() and "cancelled" in marks.read_text())


def test_response_to_unknown_id_is_ignored(client):
    client.initialize()
    client.send({"jsonrpc": "2.0", "id": "never-sent", "result": {}})
    _still_works(client)


@pytest.fixture
def verbatim_client(request, tmp_path, marks):
    """A client whose server's echo writes its text as the result's JSON, byte for byte."""
    server = raw_server(marks)
    server["env"]["RAW_SERVER_ECHO_VERBATIM"] = "1"
    # Nothing in the chain may read the result for its bytes to pass straight through: the guardrails scan it.
    settings: dict = {"servers": {"raw": server}, "policy": "off", "guardrails": "off", "ready_timeout": READY_TIMEOUT}
    if getattr(request, "param", "direct") == "pipeline":
        (tmp_path / "allow.cedar").write_text(ALLOW_ALL)
        settings["policy"] = {"policy_files": ["allow.cedar"], "audit": {"enabled": False}}
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps(settings))
    c = RawClient(config)
    c.initialize()
    yield c
    c.close()


# Spacing, key order and an integer wider than 64 bits: none of it would survive a decode and re-encode.
UNUSUAL_RESULT = ('{ "n" : 123456789012345678901234567890,\n  "content": [{"type": "text", "text": "caf\u00e9 \\"q\\""}] }'
                  .replace("\n", " "))


def test_a_result_passed_straight_through_reaches_the_client_as_the_bytes_its_server_sent(verbatim_client):
    verbatim_client.send({"jsonrpc": "2.0", "id": "c-1", "method": "tools/call",
                          "params": {"name": "raw__echo", "arguments": {"text": UNUSUAL_RESULT}}})
    line = verbatim_client.recv_line()
    assert line == b'{"jsonrpc":"2.0","id":"c-1","result":' + UNUSUAL_RESULT.encode() + b"}"
    assert json.loads(line)["result"]["n"] == 123456789012345678901234567890


def test_arguments_passed_straight_through_reach_the_server_as_the_bytes_the_client_sent(tmp_path, marks):
    server = raw_server(marks)
    server["env"]["RAW_SERVER_MARK_CALLS"] = "1"
    config = write_config(tmp_path / "c.json", {"raw": server})
    client = RawClient(config)
    try:
        client.initialize()
        # A float's spelling and an integer wider than 64 bits: a decode and re-encode would change both.
        arguments = b'{"text": "exact", "n": 123456789012345678901234567890, "f": 1.10}'
        client.send_bytes(b'{"jsonrpc": "2.0", "id": 3, "method": "tools/call", '
                          b'"params": {"name": "raw__echo", "arguments": ' + arguments + b'}}\n')
        assert client.recv_response(3)["result"]["content"][0]["text"] == "exact"
        calls = [line for line in marks.read_text().splitlines() if line.startswith("call ")]
        assert len(calls) == 1 and ('"arguments":' + arguments.decode()) in calls[0]
        assert '"name":"echo"' in calls[0]  # renamed for its server all the same
    finally:
        client.close()


@pytest.mark.parametrize("verbatim_client", ["direct", "pipeline"], indirect=True)
def test_a_result_with_2026_fields_reaches_a_handshake_era_client_without_them(verbatim_client):
    result = ('{"content": [{"type": "text", "text": "m"}], "resultType": "complete", '
              '"_meta": {"io.modelcontextprotocol/serverInfo": {"name": "x"}, "trace": "t-1"}}')
    answer = _call(verbatim_client, 1, "raw__echo", {"text": result})
    assert answer["result"] == {"content": [{"type": "text", "text": "m"}], "_meta": {"trace": "t-1"}}


@pytest.mark.parametrize("verbatim_client", ["direct", "pipeline"], indirect=True)
def test_a_result_that_must_be_read_but_cannot_be_is_an_error_not_a_hang(verbatim_client):
    # 1e400 is valid JSON but no float. The pipeline reads every result; the direct path reads this one for its
    # _meta, which may hold fields a handshake-era client must not see.
    answer = _call(verbatim_client, 1, "raw__echo", {"text": '{"content": [], "_meta": {"a": 1}, "n": 1e400}'})
    assert answer["error"]["code"] == -32603 and "could not be read" in answer["error"]["message"]
    fine = _call(verbatim_client, 2, "raw__echo", {"text": '{"content": [{"type": "text", "text": "fine"}]}'})
    assert fine["result"]["content"][0]["text"] == "fine"


@pytest.mark.parametrize("sandbox", SANDBOX_TIERS)
def test_a_server_alone_holds_its_ends_of_its_stdin_and_stdout_pipes(tmp_path, marks, sandbox):
    # Plain pipes: a unix socket pair costs the kernel about twice what a pipe does for every frame, on both sides.
    # And no other copy of the server's ends anywhere (not in bubblewrap, not in Bastion, not a spare in the server
    # itself), or a server that closes its stdout is never seen to.
    tag = f"pipes-{uuid.uuid4().hex[:8]}"
    server = raw_server(marks, tag=tag, **({"sandbox": {"profile": "none"}} if sandbox == "none" else {}))
    client = RawClient(write_config(tmp_path / "c.json", {"raw": server}))
    try:
        client.initialize()
        _still_works(client)
        [pid] = [pid for pid in pids_with_tag(tag) if _argv(pid)[1:2] == [str(FIXTURES / "raw_server.py")]]
        stdin, stdout = (os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1))
        assert stdin.startswith("pipe:") and stdout.startswith("pipe:")
        assert pipe_holders(stdout, writing=True) == {(pid, 1)}
        assert pipe_holders(stdin, writing=False) == {(pid, 0)}
        assert {holder for holder, _ in pipe_holders(stdout, writing=False)} == {client.proc.pid}
        assert {holder for holder, _ in pipe_holders(stdin, writing=True)} == {client.proc.pid}
    finally:
        client.close()


def _argv(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode(errors="replace").split("\0")


def test_requests_before_initialize_close_the_connection(tmp_path, marks):
    config = write_config(tmp_path / "c.json", {"raw": raw_server(marks)})
    client = RawClient(config)
    assert client.request(1, "ping")["result"] == {}  # ping is allowed before the handshake
    answer = client.request(2, "tools/list", {})
    assert answer["error"]["code"] == -32600
    with pytest.raises(EOFError):
        client.recv(timeout=20)
    code, _ = client.close()
    assert code == 0


def test_stdout_garbage_from_a_server_is_reported_and_isolated(client):
    client.initialize()
    answer = _call(client, 1, "raw__garbage")
    assert answer["result"]["content"][0]["text"] == "after garbage"
    _still_works(client)
    _, stderr = client.close()
    assert "this is not JSON-RPC, just a stray print" in stderr


def test_a_crash_mid_call_fails_the_call_at_once_and_the_server_restarts(client):
    client.initialize()
    started = time.monotonic()
    answer = _call(client, 1, "raw__crash")
    assert answer["error"]["code"] == -32001
    assert "exited" in answer["error"]["message"] and "raw" in answer["error"]["message"]
    assert time.monotonic() - started < 25  # a clear error, not a hang until the request timeout (120 s)

    def back() -> bool:
        reply = _call(client, f"retry-{time.monotonic_ns()}", "raw__echo", {"text": "back"})
        return "result" in reply

    assert wait_for(back, timeout=30, interval=0.3)


# A server's calls wait this long for their answers: a test that gets an answer at all, waiting far less, shows that
# it came at once, not when the wait ran out.
LONG_WAIT = 600
FAULT_TOOLS = [{"name": "big_unplaced", "description": "big_unplaced",
                "inputSchema": {"type": "object", "properties": {"size": {"type": "integer"}}}},
               {"name": "close_stdout", "description": "close_stdout", "inputSchema": {"type": "object"}}]


def _fault_client(tmp_path: Path, marks: Path, sandbox: str, tag: str) -> RawClient:
    """``bastion run`` with the raw server under ``sandbox`` (its fault tools listed), frames of at most 64 KiB and
    calls that wait LONG_WAIT for their answers."""
    entry = raw_server(marks, tag=tag, request_timeout=LONG_WAIT,
                       **({"sandbox": {"profile": "none"}} if sandbox == "none" else {}))
    entry["env"]["RAW_SERVER_EXTRA_TOOLS"] = json.dumps(FAULT_TOOLS)
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"servers": {"raw": entry}, "max_message_bytes": 65536, "policy": "off",
                                  "ready_timeout": READY_TIMEOUT}))
    return RawClient(config)


def _answers(client: RawClient, ids: set, timeout: float = 60.0) -> dict:
    """The answers to the requests ``ids``, in whatever order they come."""
    answers: dict = {}
    while set(answers) != ids:
        message = client.recv(timeout)
        if message.get("id") in ids and "method" not in message:
            answers[message["id"]] = message
    return answers


def _starts(marks: Path) -> int:
    return marks.read_text().count("started ")


def _comes_back(client: RawClient) -> bool:
    def back() -> bool:
        return "result" in _call(client, f"retry-{time.monotonic_ns()}", "raw__echo", {"text": "back"})

    return wait_for(back, timeout=30, interval=0.3)


@pytest.mark.parametrize("sandbox", SANDBOX_TIERS)
def test_an_answer_over_max_message_bytes_fails_its_call_at_once_and_the_server_serves_on(tmp_path, marks, sandbox):
    client = _fault_client(tmp_path, marks, sandbox, f"oversize-{uuid.uuid4().hex[:8]}")
    try:
        client.initialize()
        client.send({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                     "params": {"name": "raw__slow", "arguments": {}}})
        answer = _call(client, 1, "raw__big", {"size": 100_000}, timeout=60)
        error = answer["error"]
        assert error["code"] == -32603, error
        size = int(re.search(r"a message of (\d+) bytes", error["message"]).group(1))
        assert size > 100_000 and "over max_message_bytes (65536)" in error["message"]
        assert "'raw'" in error["message"] and "tools/call" in error["message"]
        # Only that call: the other one is still in flight, and the server was not restarted.
        client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow"}})
        assert wait_for(lambda: "cancelled" in marks.read_text())
        _still_works(client)
        assert _starts(marks) == 1
    finally:
        client.close()


@pytest.mark.parametrize("sandbox", SANDBOX_TIERS)
def test_a_message_over_max_message_bytes_that_answers_no_call_it_can_tell_fails_them_all_and_restarts_the_server(
        tmp_path, marks, sandbox):
    client = _fault_client(tmp_path, marks, sandbox, f"unplaced-{uuid.uuid4().hex[:8]}")
    try:
        client.initialize()
        client.send({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                     "params": {"name": "raw__slow", "arguments": {}}})
        client.send({"jsonrpc": "2.0", "id": "big", "method": "tools/call",
                     "params": {"name": "raw__big_unplaced", "arguments": {"size": 100_000}}})
        answers = _answers(client, {"slow", "big"})
        for answer in answers.values():
            error = answer["error"]
            assert error["code"] == -32001, error
            assert "over max_message_bytes (65536), whose request could not be told" in error["message"]
        assert _comes_back(client)
        assert _starts(marks) == 2
    finally:
        client.close()


@pytest.mark.parametrize("sandbox", SANDBOX_TIERS)
def test_a_server_that_closes_its_stdout_mid_call_fails_the_call_at_once_and_is_restarted(tmp_path, marks, sandbox):
    tag = f"closes-{uuid.uuid4().hex[:8]}"
    client = _fault_client(tmp_path, marks, sandbox, tag)
    try:
        client.initialize()
        answer = _call(client, 1, "raw__close_stdout", timeout=60)
        error = answer["error"]
        assert error["code"] == -32001, error
        assert error["message"] == "server 'raw' closed its stdout without exiting while handling tools/call"
        assert "stdout closed" in marks.read_text()
        assert _comes_back(client)  # the old process stopped (it reads nothing: by signal), a new one started
        assert _starts(marks) == 2
    finally:
        client.close()


def test_a_ten_megabyte_result_passes(tmp_path, marks):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"servers": {"raw": raw_server(marks)}, "policy": "off",
                                  "ready_timeout": READY_TIMEOUT}))
    client = RawClient(config)
    try:
        client.initialize()
        answer = _call(client, 1, "raw__big", {"size": 10 * 1024 * 1024}, timeout=60)
        assert len(answer["result"]["content"][0]["text"]) == 10 * 1024 * 1024
        _still_works(client)
    finally:
        client.close()


def test_client_cancellation_reaches_the_server_and_gets_no_answer(client, marks):
    client.initialize()
    client.send({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": "raw__slow", "arguments": {}}})
    time.sleep(0.3)
    client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 11, "reason": "test"}})
    assert wait_for(lambda: marks.exists() and "cancelled" in marks.read_text())
    reply = client.request(12, "ping")  # the next message is the ping's answer, never one for id 11
    assert reply["id"] == 12


@pytest.mark.parametrize("way", ["direct", "pipeline"])
def test_a_call_the_server_does_not_answer_in_time_gets_a_timeout_error_and_is_cancelled_upstream(tmp_path, marks, way):
    settings: dict = {"servers": {"raw": raw_server(marks, request_timeout=1.0)}, "policy": "off",
                      "ready_timeout": READY_TIMEOUT}
    if way == "pipeline":
        (tmp_path / "allow.cedar").write_text(ALLOW_ALL)
        settings["policy"] = {"policy_files": ["allow.cedar"], "audit": {"enabled": False}}
    config = tmp_path / "c.json"
    config.write_text(json.dumps(settings))
    client = RawClient(config)
    try:
        client.initialize()
        started = time.monotonic()
        answer = _call(client, 1, "raw__slow", timeout=20)
        assert answer["error"]["code"] == -32003
        assert "did not answer tools/call in time" in answer["error"]["message"]
        assert 0.9 < time.monotonic() - started < 15
        assert wait_for(lambda: "cancelled" in marks.read_text())
        _still_works(client)
    finally:
        client.close()


def test_client_disconnect_mid_call_cancels_upstream_and_leaves_no_process(tmp_path, marks):
    tag = f"disconnect-{uuid.uuid4().hex}"
    config = write_config(tmp_path / "c.json", {"raw": raw_server(marks, tag=tag)})
    client = RawClient(config)
    client.initialize()
    client.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "raw__slow", "arguments": {}}})
    time.sleep(0.3)
    assert pids_with_tag(tag)
    code, _ = client.close()  # closes Bastion's stdin: the client is gone
    assert code == 0
    assert "cancelled" in marks.read_text()
    assert wait_for(lambda: not pids_with_tag(tag), timeout=10)


@pytest.mark.parametrize("sandbox", ["default", "none"])
def test_no_orphan_when_bastion_is_killed(tmp_path, sandbox):
    tag = f"orphan-{uuid.uuid4().hex}"
    # The server ignores the end of its stdin, so only Bastion's process handling can stop it.
    config = write_config(tmp_path / "c.json", {"raw": raw_server(tag=tag, linger=True, sandbox=sandbox)})
    client = RawClient(config)
    client.initialize()
    assert pids_with_tag(tag)
    client.proc.kill()
    client.proc.wait()
    assert wait_for(lambda: not pids_with_tag(tag), timeout=15)


def test_stray_prints_cannot_reach_the_protocol_channel():
    script = (
        "import os, sys\n"
        "from bastion.transport.stdio import protect_stdout\n"
        "fd = protect_stdout()\n"
        "print('stray print')\n"
        "os.write(1, b'stray write to fd 1\\n')\n"
        "os.write(fd, b'{\"jsonrpc\": \"2.0\", \"method\": \"x\"}\\n')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=30)
    assert done.stdout == b'{"jsonrpc": "2.0", "method": "x"}\n'
    assert b"stray print" in done.stderr and b"stray write to fd 1" in done.stderr



def test_nothing_reaches_the_client_before_its_initialize_result_and_pipelined_requests_wait_for_it(tmp_path):
    config = write_config(tmp_path / "c.json", {"raw": raw_server(), "raw2": raw_server(tag="second")})
    client = RawClient(config)
    try:
        # A pipelining client sends initialized before it has read the result; the catalog fills meanwhile.
        client.send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                     "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "p", "version": "0"}}})
        client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        client.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        first = client.recv(timeout=60)
        assert first.get("id") == 0 and "result" in first
        # A request pipelined behind the handshake is served once the handshake is, from the full catalog.
        listed = client.recv(timeout=60)
        assert listed.get("id") == 1
        names = {tool["name"] for tool in listed["result"]["tools"]}
        assert {"raw__echo", "raw2__echo"} <= names
    finally:
        client.close()


@pytest.mark.parametrize("capabilities", [["tools"], {"tools": "yes"}], ids=["not-an-object", "values-not-objects"])
def test_a_server_whose_discover_answer_is_malformed_is_reported_and_retried_while_the_others_serve(
    tmp_path, capabilities
):
    # Poses as a 2026-07-28 server with capabilities Bastion cannot use. Its start must fail with a reason and be
    # retried; the client's initialize must not wait out ready_timeout for a supervisor that died silently.
    discover = {"supportedVersions": ["2026-07-28"], "capabilities": capabilities}
    bad = raw_server(tag="malformed-discover", env={"RAW_SERVER_DISCOVER": json.dumps(discover)})
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"servers": {"bad": bad, "good": raw_server(tag="good")}, "ready_timeout": 600,
                                  "policy": "off"}))
    client = RawClient(config)
    try:
        client.initialize()
        names = [tool["name"] for tool in client.request(1, "tools/list", {})["result"]["tools"]]
        assert "good__echo" in names and not any(name.startswith("bad__") for name in names)
        answer = _call(client, 2, "good__echo", {"text": "fine"})
        assert answer["result"]["content"][0]["text"] == "fine"
    finally:
        _, stderr = client.close()
    assert "server bad failed to start: handshake failed" in stderr
    assert "restarting in" in stderr


# What a client's launcher leaves on Bastion's stdio: a pipe or terminal the event loop can watch, or a regular file
# or /dev/null, which epoll refuses (and libuv, under uvloop, answers a refusal by aborting the process).
def _stdout_for(kind: str, file):
    return {"pipe": subprocess.PIPE, "file": file, "devnull": subprocess.DEVNULL}[kind]


def _copy_to(source, path: Path) -> None:
    with path.open("ab") as sink:
        while chunk := os.read(source.fileno(), 1 << 16):
            sink.write(chunk)
            sink.flush()


def _frames(out: Path) -> list[dict]:
    """The complete lines Bastion has written so far, each of which must be a JSON-RPC message."""
    *complete, _partial = out.read_bytes().split(b"\n")
    messages = [json.loads(line) for line in complete]
    assert all(isinstance(m, dict) and m.get("jsonrpc") == "2.0" for m in messages), messages
    return messages


def _await_answer(proc: subprocess.Popen, out: Path, request_id) -> dict:
    def answer():
        return next((m for m in _frames(out) if m.get("id") == request_id and "method" not in m), None)

    wait_for(lambda: answer() is not None or proc.poll() is not None, timeout=60)
    found = answer()
    assert found is not None, f"no answer to {request_id!r}; bastion exited with {proc.poll()}"
    return found


@pytest.mark.parametrize("stdout", ["pipe", "file"])
def test_closing_stdin_after_a_session_ends_bastion_with_status_0(tmp_path, stdout):
    config = write_config(tmp_path / "c.json", {"raw": raw_server()})
    out, err = tmp_path / "stdout.bin", tmp_path / "stderr.txt"
    with out.open("wb") as sink, err.open("wb") as stderr:
        proc = subprocess.Popen([BASTION, "run", str(config)], stdin=subprocess.PIPE,
                                stdout=_stdout_for(stdout, sink), stderr=stderr)
    copier = None
    if stdout == "pipe":
        copier = threading.Thread(target=_copy_to, args=(proc.stdout, out), daemon=True)
        copier.start()

    def send(message: dict) -> None:
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        proc.stdin.flush()

    try:
        send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "eof-test", "version": "0"}}})
        assert "result" in _await_answer(proc, out, 0)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert "raw__echo" in {tool["name"] for tool in _await_answer(proc, out, 1)["result"]["tools"]}
        proc.stdin.close()  # the client is gone
        assert proc.wait(timeout=30) == 0, err.read_text(errors="replace")[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if copier is not None:
        copier.join(timeout=10)
        proc.stdout.close()
    assert out.read_bytes().endswith(b"\n")
    assert [m.get("id") for m in _frames(out) if "method" not in m] == [0, 1]


@pytest.mark.parametrize("stdout", ["pipe", "file", "devnull"])
@pytest.mark.parametrize("stdin", ["closed-pipe", "devnull"])
def test_a_client_that_sends_nothing_ends_bastion_with_status_0(tmp_path, stdin, stdout):
    config = write_config(tmp_path / "c.json", {"raw": raw_server()})
    out = tmp_path / "stdout.bin"
    with out.open("wb") as sink:
        done = subprocess.run(
            [BASTION, "run", str(config)], stdout=_stdout_for(stdout, sink), stderr=subprocess.PIPE, timeout=60,
            **({"input": b""} if stdin == "closed-pipe" else {"stdin": subprocess.DEVNULL}),
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert not done.stdout and (stdout != "file" or out.read_bytes() == b"")
    assert b"Traceback" not in done.stderr


def test_input_that_cannot_be_read_ends_bastion_instead_of_hanging(tmp_path):
    # Every read of this descriptor fails with EIO (it reads this process's memory from address 0, never
    # mapped), as a failing disk's would: the input is over, as when a pipe breaks.
    config = write_config(tmp_path / "c.json", {"raw": raw_server()})
    failing = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        done = subprocess.run([BASTION, "run", str(config)], stdin=failing, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(failing)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert not done.stdout
    assert b"reading the client's input failed" in done.stderr and b"Traceback" not in done.stderr
