"""The seed's failure modes, end to end (docs/faults.md): a server killed with calls from several clients pending, a
server that stops reading its stdin, very large results, and a client that stops reading its event stream.

Each runs real processes (``bastion run`` or ``bastion serve --http``, the framework-free tests/fixtures/raw_server.py)
and waits on answers, bounded by a deadline, never on a sleep.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

from tests.support import READY_TIMEOUT, RawClient, pids_with_tag, raw_server, wait_for

# A server's calls wait this long for their answers: an answer that comes at all, in a test waiting far less, came
# because of the fault, not because the wait ran out.
LONG_WAIT = 600
STOP_READING = {"name": "stop_reading", "description": "stop reading stdin", "inputSchema": {"type": "object"}}


def _entry(marks: Path, tag: str, **extra) -> dict:
    entry = raw_server(marks, tag=tag, request_timeout=LONG_WAIT, sandbox={"profile": "none"}, **extra)
    entry["env"]["RAW_SERVER_EXTRA_TOOLS"] = json.dumps([STOP_READING])
    return entry


def _config(tmp_path: Path, servers: dict, **settings) -> Path:
    config = tmp_path / "bastion.json"
    # Guardrails off: these servers run unconfined, which the default guardrails hold against a second server's call.
    config.write_text(json.dumps({"servers": servers, "policy": "off", "guardrails": "off",
                                  "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"}, **settings}))
    return config


def _call(rid, name: str, arguments: dict | None = None) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, "arguments": arguments or {}}}


def _answers(client: RawClient, ids: set, timeout: float = 60.0) -> dict:
    """The answers to the requests ``ids``, in whatever order they come, within ``timeout`` in all."""
    deadline = time.monotonic() + timeout
    answers: dict = {}
    while set(answers) != ids:
        message = client.recv(max(0.01, deadline - time.monotonic()))
        if message.get("id") in ids and "method" not in message:
            answers[message["id"]] = message
    return answers


def _rss(pid: int) -> int:
    """A process's resident memory, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


# ---------------------------------------------------------------------------------- a server that stops reading
def test_a_server_that_stops_reading_its_stdin_is_refused_with_retry_after_while_the_others_serve(tmp_path):
    marks = tmp_path / "stuck.txt"
    bound = 1024 * 1024
    config = _config(tmp_path, {"stuck": _entry(marks, f"stuck-{uuid.uuid4().hex[:8]}", max_queued_bytes=bound),
                                "other": _entry(tmp_path / "other.txt", f"other-{uuid.uuid4().hex[:8]}")})
    client = RawClient(config)
    try:
        client.initialize()
        client.send(_call("stop", "stuck__stop_reading"))
        assert wait_for(lambda: marks.exists() and "stopped reading" in marks.read_text(), timeout=30)
        # 3 MiB of calls, far past what the 64 KiB pipe takes: the first ones wait in Bastion until the bound, the
        # rest are refused at once.
        text = "y" * (256 * 1024)
        ids = {f"fill-{i}" for i in range(12)}
        for rid in sorted(ids):
            client.send(_call(rid, "stuck__echo", {"text": text}))
        refused = []
        while not refused or len(refused) < 3:
            message = client.recv(30)
            if str(message.get("id", "")).startswith("fill-"):
                refused.append(message)
        for answer in refused:
            error = answer["error"]
            assert error["code"] == -32000, error
            assert error["data"] == {"retryAfterSeconds": 1}, error
            assert "server 'stuck' is not reading its input" in error["message"]
            assert f"over max_queued_bytes ({bound})" in error["message"]
        # Another server answers while this one is stuck.
        answer = client.request("other-1", "tools/call", {"name": "other__echo", "arguments": {"text": "fine"}},
                                timeout=30)
        assert answer.get("result", {}).get("content") == [{"type": "text", "text": "fine"}], answer
        # Nothing grows: 24 MiB more of calls are each refused, and Bastion's memory stays within a fraction of them.
        before = _rss(client.proc.pid)
        more = {f"more-{i}" for i in range(96)}
        for rid in sorted(more):
            client.send(_call(rid, "stuck__echo", {"text": text}))
        answers = _answers(client, more)
        assert {answer["error"]["code"] for answer in answers.values()} == {-32000}
        grown = _rss(client.proc.pid) - before
        assert grown < 8 * 1024 * 1024, f"bastion grew by {grown} bytes while refusing 24 MiB"
        assert client.request("other-2", "tools/call", {"name": "other__echo", "arguments": {"text": "still"}},
                              timeout=30)["result"]["content"][0]["text"] == "still"
    finally:
        client.close()


async def test_over_http_a_server_that_stops_reading_is_refused_with_retry_after_in_both_eras(tmp_path):
    import asyncio

    import httpx2

    from tests.http.conftest import serve_config, stop_bastion
    from tests.http.test_sdk_clients import MODERN_META

    marks = tmp_path / "stuck.txt"
    bound = 1024 * 1024
    config = _config(tmp_path, {"stuck": _entry(marks, f"stuck-{uuid.uuid4().hex[:8]}", max_queued_bytes=bound),
                                "other": _entry(tmp_path / "other.txt", f"other-{uuid.uuid4().hex[:8]}")})
    served = serve_config(config, tmp_path, tmp_path / "events.log")
    modern = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
              "mcp-method": "tools/call"}

    def modern_call(http, rid: str, name: str, arguments: dict | None = None):
        return http.post(served.url, headers={**modern, "mcp-name": name}, json={
            "jsonrpc": "2.0", "id": rid, "method": "tools/call",
            "params": {"name": name, "arguments": arguments or {}, "_meta": MODERN_META}})

    try:
        async with httpx2.AsyncClient(timeout=LONG_WAIT) as http, httpx2.AsyncClient(timeout=60) as legacy:
            stop = asyncio.ensure_future(modern_call(http, "stop", "stuck__stop_reading"))
            assert await asyncio.to_thread(wait_for, lambda: marks.exists() and "stopped reading" in marks.read_text(),
                                           60)
            text = "y" * (256 * 1024)
            # 3 MiB of calls: the first ones fill the pipe and then Bastion's bound, the rest are refused. The server
            # reads nothing, so any answer is a refusal.
            waiting = [asyncio.ensure_future(modern_call(http, f"fill-{i}", "stuck__echo", {"text": text}))
                       for i in range(12)]
            done, _ = await asyncio.wait(waiting, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            assert done, "no call was refused"
            refused = _message(done.pop().result())
            assert refused["error"]["code"] == -32000 and refused["error"]["data"] == {"retryAfterSeconds": 1}, refused
            assert "server 'stuck' is not reading its input" in refused["error"]["message"], refused
            init = await legacy.post(served.url, headers={"accept": modern["accept"]}, json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"}}})
            session = {"accept": modern["accept"], "mcp-protocol-version": "2025-11-25",
                       "mcp-session-id": init.headers["mcp-session-id"]}
            await legacy.post(served.url, headers=session,
                              json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            again = _message(await legacy.post(served.url, headers=session, json=_call("l-1", "stuck__echo")))
            assert again["error"]["code"] == -32000 and again["error"]["data"] == {"retryAfterSeconds": 1}, again
            other = _message(await legacy.post(served.url, headers=session, json=_call(
                "l-2", "other__echo", {"text": "fine"})))
            assert other["result"]["content"][0]["text"] == "fine", other
            for call in (stop, *waiting):
                call.cancel()
            await asyncio.gather(stop, *waiting, return_exceptions=True)
    finally:
        stop_bastion(served)


# ------------------------------------------------------------------------------ a server killed mid-call
# tests/test_faults.py covers one call of one client whose server exits on its own; here SIGKILL comes from outside,
# with several calls pending (from several clients over HTTP), and the server's neighbour must not notice.
def _killable(tmp_path: Path, tag: str) -> tuple[dict, Path]:
    marks = tmp_path / "victim.txt"
    entry = _entry(marks, tag)
    entry["env"]["RAW_SERVER_MARK_CALLS"] = "1"
    return entry, marks


def _kill_when_called(marks: Path, tag: str, calls: int) -> int:
    """SIGKILL the server tagged ``tag`` once ``calls`` tools/call lines reached it; its pid."""
    def called() -> int:
        return sum(line.startswith("call ") for line in marks.read_text().splitlines()) if marks.exists() else 0

    assert wait_for(lambda: called() >= calls, timeout=60), called()
    [pid] = pids_with_tag(tag)
    os.kill(pid, signal.SIGKILL)
    return pid


def _died(error: dict, method: str = "tools/call") -> None:
    assert error["code"] == -32001, error
    assert error["message"].startswith("server 'victim' "), error
    assert "SIGKILL" in error["message"] or "signal 9" in error["message"], error
    assert error["message"].endswith(f"while handling {method}"), error


def test_a_server_killed_with_several_calls_pending_fails_each_at_once_and_serves_again_after(tmp_path):
    tag = f"victim-{uuid.uuid4().hex[:8]}"
    victim, marks = _killable(tmp_path, tag)
    other = _entry(tmp_path / "other.txt", f"other-{uuid.uuid4().hex[:8]}")
    config = _config(tmp_path, {"victim": victim, "other": other})
    client = RawClient(config)
    try:
        client.initialize()
        pending = {f"slow-{i}" for i in range(3)}
        for rid in sorted(pending):
            client.send(_call(rid, "victim__slow"))
        client.send(_call("neighbour", "other__slow"))
        _kill_when_called(marks, tag, 3)
        answers = _answers(client, pending, timeout=60)  # each call waits LONG_WAIT: these came from the death
        for answer in answers.values():
            _died(answer["error"])
        assert client.request("other-echo", "tools/call", {"name": "other__echo", "arguments": {"text": "fine"}},
                              timeout=30)["result"]["content"][0]["text"] == "fine"

        def back() -> bool:
            reply = client.request(f"back-{time.monotonic_ns()}", "tools/call",
                                   {"name": "victim__echo", "arguments": {"text": "back"}}, timeout=30)
            return "result" in reply

        assert wait_for(back, timeout=60, interval=0.3)
        assert marks.read_text().count("started ") == 2
        # The neighbour's call was never touched: it is still in flight, and cancelling it reaches its server.
        client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "neighbour"}})
        assert wait_for(lambda: "cancelled" in (tmp_path / "other.txt").read_text(), timeout=30)
    finally:
        client.close()


async def test_a_server_killed_under_several_http_clients_of_both_eras_fails_each_call_at_once(tmp_path):
    import asyncio

    import httpx2

    from tests.http.conftest import serve_config, stop_bastion
    from tests.http.test_sdk_clients import MODERN_META

    tag = f"victim-{uuid.uuid4().hex[:8]}"
    victim, marks = _killable(tmp_path, tag)
    other = _entry(tmp_path / "other.txt", f"other-{uuid.uuid4().hex[:8]}")
    config = _config(tmp_path, {"victim": victim, "other": other})
    served = serve_config(config, tmp_path, tmp_path / "events.log")
    modern = {"content-type": "application/json", "accept": "application/json, text/event-stream",
              "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call"}

    def modern_call(http, rid: str, name: str, arguments: dict | None = None):
        return http.post(served.url, headers={**modern, "mcp-name": name}, json={
            "jsonrpc": "2.0", "id": rid, "method": "tools/call",
            "params": {"name": name, "arguments": arguments or {}, "_meta": MODERN_META}})

    try:
        async with httpx2.AsyncClient(timeout=LONG_WAIT) as first, httpx2.AsyncClient(timeout=LONG_WAIT) as second, \
                httpx2.AsyncClient(timeout=LONG_WAIT) as legacy:
            listed = await first.post(served.url, headers={**modern, "mcp-method": "tools/list"}, json={
                "jsonrpc": "2.0", "id": "list", "method": "tools/list", "params": {"_meta": MODERN_META}})
            assert "victim__slow" in {tool["name"] for tool in listed.json()["result"]["tools"]}
            init = await legacy.post(served.url, headers={"accept": "application/json, text/event-stream"}, json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"}}})
            session = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25",
                       "mcp-session-id": init.headers["mcp-session-id"]}
            assert (await legacy.post(served.url, headers=session, json={
                "jsonrpc": "2.0", "method": "notifications/initialized"})).status_code == 202
            calls = [asyncio.ensure_future(modern_call(first, "m-1", "victim__slow")),
                     asyncio.ensure_future(modern_call(second, "m-2", "victim__slow")),
                     asyncio.ensure_future(legacy.post(served.url, headers=session, json=_call("l-1", "victim__slow")))]
            await asyncio.to_thread(_kill_when_called, marks, tag, 3)
            done, _ = await asyncio.wait(calls, timeout=60)  # each call waits LONG_WAIT: these came from the death
            assert len(done) == 3
            for call in calls:
                _died(_message(call.result())["error"])
            other = await modern_call(second, "o-1", "other__echo", {"text": "fine"})
            assert other.json()["result"]["content"][0]["text"] == "fine"
            deadline = time.monotonic() + 60
            while "result" not in _message(await modern_call(first, "back", "victim__echo", {"text": "back"})):
                assert time.monotonic() < deadline, "the killed server never served again"
                await asyncio.sleep(0.3)
            assert marks.read_text().count("started ") == 2
    finally:
        stop_bastion(served)


def _message(response) -> dict:
    """The JSON-RPC answer of a POST, whether it came as JSON or as the last event of an SSE stream."""
    if response.headers["content-type"].startswith("application/json"):
        return response.json()
    data = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    return json.loads(data[-1])


# ------------------------------------------------------------------------------------- very large results
# A 10 MB result passes: tests/test_faults.py::test_a_ten_megabyte_result_passes. A 64 KiB limit's oversize answer:
# tests/test_faults.py::test_an_answer_over_max_message_bytes_fails_its_call_at_once_and_the_server_serves_on.
def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def test_a_hundred_megabyte_result_over_the_default_limit_fails_at_once_and_is_never_held_whole(tmp_path):
    marks = tmp_path / "big.txt"
    client = RawClient(_config(tmp_path, {"raw": _entry(marks, f"big-{uuid.uuid4().hex[:8]}")}))
    try:
        client.initialize()
        assert client.request("warm", "tools/call", {"name": "raw__echo", "arguments": {"text": "x"}})["result"]
        before = _rss(client.proc.pid)
        answer = client.request(1, "tools/call", {"name": "raw__big", "arguments": {"size": 100 * 1024 * 1024}},
                                timeout=120)  # the call itself waits LONG_WAIT
        error = answer["error"]
        assert error["code"] == -32603, error
        assert "server 'raw' answered tools/call with a message of 104857" in error["message"], error
        assert "over max_message_bytes (33554432); Bastion dropped it unread" in error["message"], error
        # Dropped as it streamed in, never gathered: Bastion's peak memory stayed far below the message.
        grown = _peak_rss(client.proc.pid) - before
        assert grown < 40 * 1024 * 1024, f"bastion's peak memory grew by {grown} bytes for a dropped 100 MiB message"
        assert client.request(2, "tools/call", {"name": "raw__echo", "arguments": {"text": "on"}})["result"]
        assert marks.read_text().count("started ") == 1  # the server answered on, it was not restarted
    finally:
        client.close()


def test_a_fifty_megabyte_result_passes_under_a_raised_limit_and_every_ping_meanwhile_is_answered(tmp_path):
    """The latency of those pings, against the 50 ms the issue sets, is measured in bench/large_result_pings.py."""
    size = 50 * 1024 * 1024
    client = RawClient(_config(tmp_path, {"raw": _entry(tmp_path / "big.txt", f"big-{uuid.uuid4().hex[:8]}")},
                               max_message_bytes=64 * 1024 * 1024))
    try:
        client.initialize()
        client.send(_call("big", "raw__big", {"size": size}))
        pings = {f"ping-{i}" for i in range(20)}
        for rid in sorted(pings):
            client.send({"jsonrpc": "2.0", "id": rid, "method": "ping"})
        answers = _answers(client, pings | {"big"}, timeout=120)
        assert all(answers[rid]["result"] == {} for rid in pings)
        assert answers["big"]["result"]["content"][0]["text"] == "x" * size
    finally:
        client.close()


# ------------------------------------------------------------------------------ a client that stops reading
# tests/http/test_overflow_end_to_end.py: past http.stream_buffer_messages, the stream ends with the request's answer
# naming the bound. Here few messages, but large ones: the byte bound ends the stream, Bastion's memory stays
# bounded, and another client is served meanwhile.
FLOOD_SERVER = r'''
import json, sys
def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    message = json.loads(line)
    rid, method, params = message.get("id"), message.get("method"), message.get("params") or {}
    if rid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": params.get("protocolVersion", "2025-11-25"),
              "capabilities": {"tools": {}, "logging": {}}, "serverInfo": {"name": "flood", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [{"name": "flood", "inputSchema": {"type": "object"}},
                                                                {"name": "echo", "inputSchema": {"type": "object"}}]}})
    elif method == "tools/call" and params["name"] == "flood":
        big = "x" * 100000
        for n in range(400):  # 40 MB of log messages, far fewer than http.stream_buffer_messages
            send({"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": "info", "data": f"{n} {big}"}})
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "flooded"}]}})
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "echoed"}]}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found"}})
'''


async def test_a_client_that_stops_reading_its_stream_is_cut_off_at_the_byte_bound_and_told_why(tmp_path):
    import asyncio
    import socket

    import httpx2

    from tests.http.conftest import serve_config, stop_bastion
    from tests.http.test_sdk_clients import MODERN_META

    script = tmp_path / "flood_server.py"
    script.write_text(FLOOD_SERVER)
    bound = 1024 * 1024
    config = _config(tmp_path, {"flood": {"command": os.sys.executable, "args": [str(script)],
                                          "sandbox": {"profile": "none"}}},
                     # The last replay_events of a stream are kept for a client that resumes it (256 by default, here
                     # 25 MB of the flood): few here, so what is measured is the buffer for the client.
                     http={"stream_buffer_bytes": bound, "replay_events": 8})
    served = serve_config(config, tmp_path, tmp_path / "events.log")
    loop = asyncio.get_running_loop()
    reader = socket.socket()
    try:
        base = {"accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient(timeout=120) as http:
            init = await http.post(served.url, headers=base, json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"}}})
            session = init.headers["mcp-session-id"]
            assert (await http.post(served.url, headers={**base, "mcp-session-id": session,
                                                         "mcp-protocol-version": "2025-11-25"},
                                    json={"jsonrpc": "2.0", "method": "notifications/initialized"})).status_code == 202
            before = _rss(served.process.pid)
            # The call, on a socket that reads nothing until the bound has been passed.
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.setblocking(False)
            host, port = served.base.removeprefix("http://").split(":")
            await loop.sock_connect(reader, (host, int(port)))
            body = json.dumps(_call(9, "flood__flood")).encode()
            await loop.sock_sendall(reader, (
                f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Accept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\n"
                f"MCP-Protocol-Version: 2025-11-25\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
            deadline = time.monotonic() + 120
            while "events unread" not in served.stderr.read_text():
                assert time.monotonic() < deadline, "the stream never passed its bound"
                await asyncio.sleep(0.1)
            # Another client is served while this one reads nothing.
            other = await http.post(served.url, headers={
                **base, "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "flood__echo"},
                json={"jsonrpc": "2.0", "id": "other", "method": "tools/call",
                      "params": {"name": "flood__echo", "arguments": {}, "_meta": MODERN_META}})
            assert _message(other)["result"]["content"][0]["text"] == "echoed"
            # 40 MB went by: Bastion held about the bound of them for the client (and 8 to resume), never the flood.
            grown = _peak_rss(served.process.pid) - before
            assert grown < 12 * 1024 * 1024, f"bastion's peak memory grew by {grown} bytes"
        received = bytearray()
        while not received.endswith(b"0\r\n\r\n"):  # the chunked body's end: the response was completed
            chunk = await asyncio.wait_for(loop.sock_recv(reader, 1 << 20), 120)
            assert chunk, "the connection closed before the stream's last event"
            received += chunk
        messages = [json.loads(line[len(b"data: "):]) for line in bytes(received).split(b"\n")
                    if line.startswith(b"data: {")]
        last = messages[-1]
        assert last["id"] == 9 and last["error"]["code"] == -32000, last
        assert f"{bound} bytes waited unread" in last["error"]["message"], last
        assert "http.stream_buffer_bytes" in last["error"]["message"], last
        assert 0 < len(messages) - 1 < 400  # some of the flood, then the notice, never the answer the server gave
    finally:
        reader.close()
        stop_bastion(served)
