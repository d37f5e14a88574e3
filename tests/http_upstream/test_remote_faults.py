"""A remote server that hangs, resets or sends garbage: each call gets a clear error, none hangs, the local server
beside it keeps working, and a remote that comes back is reconnected."""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Iterator

import pytest

from tests.support import RawClient, raw_server, wait_for, write_config


def _federate(tmp_path, url: str, **entry) -> RawClient:
    # The remote is untrusted: taint would send the local server's calls after it to a person nobody plays here.
    config = write_config(tmp_path / "bastion.json", {"remote": {"url": url, **entry}, "local": raw_server()},
                          guardrails={"taint": "off"})
    client = RawClient(config)
    client.initialize()
    return client


def _call(client: RawClient, request_id: int, name: str, arguments: dict, timeout: float = 120) -> dict:
    return client.request(request_id, "tools/call", {"name": name, "arguments": arguments}, timeout=timeout)


def _local_still_answers(client: RawClient, request_id: int) -> None:
    answer = _call(client, request_id, "local__echo", {"text": "still here"})
    assert "result" in answer and "still here" in str(answer["result"]), answer


@pytest.mark.parametrize("args,entry", [((), {"era": "modern"}), ((), {"era": "legacy"}),
                                        (("--transport", "sse"), {"transport": "sse"})],
                         ids=["modern", "legacy", "sse"])
def test_a_remote_that_hangs_is_timed_out_as_a_local_one_is(tmp_path, remote_server, args, entry):
    server = remote_server(*args)
    client = _federate(tmp_path, server.url, request_timeout=2, **entry)
    try:
        assert "result" in _call(client, 1, "remote__echo", {"text": "warm"})
        hung = _call(client, 2, "remote__slow", {"seconds": 60}, timeout=60)
        assert hung["error"]["code"] == -32003 and "in time" in hung["error"]["message"]
        assert "result" in _call(client, 3, "remote__echo", {"text": "after"})  # the connection outlived it
        _local_still_answers(client, 4)
    finally:
        status, stderr = client.close()
    assert status == 0 and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("args,entry", [((), {"era": "modern"}), ((), {"era": "legacy"}),
                                        (("--transport", "sse"), {"transport": "sse"})],
                         ids=["modern", "legacy", "sse"])
def test_a_remote_that_resets_fails_pending_calls_at_once_and_is_reconnected(tmp_path, remote_server, args, entry):
    server = remote_server(*args)
    # Long timeouts: the pending call must fail because the connection went, not because time ran out.
    client = _federate(tmp_path, server.url, request_timeout=600, **entry)
    try:
        assert "result" in _call(client, 1, "remote__echo", {"text": "warm"})
        client.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                     "params": {"name": "remote__slow", "arguments": {"seconds": 300}}})
        assert wait_for(lambda: server.proc is not None, timeout=5)
        threading.Timer(1.0, server.kill).start()
        failed = client.recv_response(2, timeout=120)  # far less than the call's 300 s and its 600 s timeout
        assert failed["error"]["code"] == -32001, failed
        _local_still_answers(client, 3)
        server.restart()

        def answers_again() -> bool:
            answer = _call(client, 4 + answers_again.tries, "remote__echo", {"text": "back"})
            answers_again.tries += 1
            return "result" in answer

        answers_again.tries = 0
        assert wait_for(answers_again, timeout=120, interval=1.0)
    finally:
        status, stderr = client.close()
    assert status == 0 and "Traceback" not in stderr, stderr
    assert "remote" in stderr and "restarting in" in stderr


class _GarbageServer:
    """A TCP server on 127.0.0.1 answering every HTTP request with what ``respond`` returns for its first line."""

    def __init__(self, respond: Callable[[bytes], bytes]) -> None:
        self._respond = respond
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/mcp"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                reply = self._respond(data.split(b"\r\n", 1)[0])
                if isinstance(reply, tuple):  # (the start of a stream, how long to keep it open saying nothing)
                    conn.sendall(reply[0])
                    time.sleep(reply[1])
                else:
                    conn.sendall(reply)
            except OSError:
                pass

    def close(self) -> None:
        self._listener.close()


def _http(status: str, content_type: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


# Each kind of garbage, and what the error a call gets says about it.
GARBAGE = {
    "json-that-is-not": (lambda line: _http("200 OK", "application/json", b"{not json at all"),
                         "not a JSON-RPC message"),
    "html": (lambda line: _http("200 OK", "text/html", b"<html>a login page</html>"), "text/html"),
    "sse-of-nonsense": (lambda line: _http("200 OK", "text/event-stream", b"data: \x00\x01garbage\n\nevent: x\n\n"),
                        "without answering"),
    "not-http": (lambda line: b"SSH-2.0-OpenSSH_9.6\r\n" + b"\xff" * 64, "lost the connection"),
    "server-error": (lambda line: _http("500 Internal Server Error", "text/plain", b"boom"), "HTTP 500"),
    "unauthorized": (lambda line: _http("401 Unauthorized", "text/plain", b"no"), "check the credentials"),
}


@pytest.fixture
def garbage_server(request) -> Iterator[_GarbageServer]:
    server = _GarbageServer(GARBAGE[request.param][0])
    yield server
    server.close()


@pytest.mark.parametrize("garbage_server", list(GARBAGE), indirect=True)
def test_a_remote_that_sends_garbage_is_reported_and_harms_nothing_else(tmp_path, garbage_server, request):
    kind = request.node.callspec.params["garbage_server"]
    client = _federate(tmp_path, garbage_server.url, startup_timeout=3, era="legacy")
    try:
        names = {tool["name"] for tool in client.request(1, "tools/list", {}, timeout=120)["result"]["tools"]}
        assert "local__echo" in names and not any(name.startswith("remote__") for name in names)
        refused = _call(client, 2, "remote__anything", {})
        assert refused["error"]["code"] == -32001 and GARBAGE[kind][1] in refused["error"]["message"], refused
        _local_still_answers(client, 3)
    finally:
        status, stderr = client.close()
    assert status == 0 and "Traceback" not in stderr, stderr
    assert "server remote" in stderr  # the failure is said, with the server's name


def _silent_sse(line: bytes) -> bytes | tuple[bytes, float]:
    """An HTTP+SSE server whose stream names its endpoint and then never says anything again."""
    if line.startswith(b"GET"):
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\r\n"
        return head + b"event: endpoint\ndata: /messages?session_id=1\n\n", 120.0
    return _http("202 Accepted", "text/plain", b"")


def test_an_event_stream_silent_past_its_idle_timeout_is_a_dropped_connection(tmp_path):
    server = _GarbageServer(_silent_sse)
    try:
        client = _federate(tmp_path, server.url.replace("/mcp", "/sse"), transport="sse", sse_idle_timeout=1,
                           startup_timeout=60)
        try:
            refused = _call(client, 1, "remote__anything", {})
            _local_still_answers(client, 2)
        finally:
            status, stderr = client.close()
    finally:
        server.close()
    # Found silent after a second, not after the 60 s the handshake is allowed.
    assert refused["error"]["code"] == -32001 and "silent for 1s" in refused["error"]["message"], refused
    assert status == 0 and "Traceback" not in stderr, stderr
