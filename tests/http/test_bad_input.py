"""Bad HTTP input: each gets a clear status and JSON-RPC error, and nothing else slows down or leaks."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from urllib.parse import urlsplit

import httpx2
import pytest

from tests.http.conftest import IDENTITY_HEADER, SERVER, Served
from tests.http.test_sdk_clients import MODERN_META, open_legacy_session

JSON = {IDENTITY_HEADER: "tester", "content-type": "application/json", "accept": "application/json, text/event-stream"}
LIST = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":' \
       b'"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}'
MODERN = {**JSON, "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"}


@pytest.mark.parametrize("headers, body, status, code, words", [
    (MODERN, b"{not json", 400, -32700, "Parse error: malformed JSON"),  # the session's own errors (one reading)
    (MODERN, b"[" + LIST + b"]", 400, -32600, "batch"),
    (MODERN, b'{"jsonrpc":"1.0","id":1,"method":"x"}', 400, -32600, 'jsonrpc must be "2.0"'),
    ({**MODERN, "content-type": "text/plain"}, LIST, 415, -32600, "application/json"),
    ({**MODERN, "accept": "text/html"}, LIST, 406, -32600, "Accept"),
    ({**MODERN, "mcp-method": "tools/call"}, LIST, 400, -32020, "Mcp-Method"),
    ({**MODERN, "mcp-protocol-version": "2025-11-25"}, LIST, 400, -32020, "MCP-Protocol-Version"),
    ({k: v for k, v in MODERN.items() if k != IDENTITY_HEADER.lower() and k != IDENTITY_HEADER}, LIST, 401, -32600,
     IDENTITY_HEADER),
    (JSON, b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', 400, -32600, "Mcp-Session-Id"),
    ({**JSON, "mcp-session-id": "no-such-session"}, b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', 404, -32600,
     "unknown"),
    ({**MODERN, "origin": "https://evil.example"}, LIST, 403, -32600, "Origin"),
    ({**MODERN, "host": "evil.example"}, LIST, 403, -32600, "Host"),
    (MODERN, b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"pad":"' + b"x" * 70000 + b'"}}', 413, -32600,
     "limit"),
])
async def test_bad_requests_get_a_status_and_a_json_rpc_error(bastion_http: Served, headers, body, status, code,
                                                              words) -> None:
    async with httpx2.AsyncClient(timeout=120) as http:
        response = await http.post(bastion_http.url, headers=headers, content=body)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] == code and words in error["message"]
        # Nothing broke: a good request right after is answered.
        good = await http.post(bastion_http.url, headers=MODERN, content=LIST)
        assert good.status_code == 200 and good.json()["result"]["tools"]


async def test_a_tool_name_header_that_disagrees_with_the_body_is_refused(bastion_http: Served) -> None:
    async with httpx2.AsyncClient(timeout=120) as http:
        response = await http.post(bastion_http.url, headers={
            **MODERN, "mcp-method": "tools/call", "mcp-name": f"{SERVER}__test_error_handling"}, json={
            "jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": f"{SERVER}__test_simple_text", "arguments": {}, "_meta": MODERN_META}})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == -32020 and response.json()["id"] == 3


async def test_get_and_delete_need_a_session_and_modern_clients_get_405(bastion_http: Served) -> None:
    async with httpx2.AsyncClient(timeout=120) as http:
        assert (await http.get(bastion_http.url, headers={**JSON, "accept": "text/event-stream"})).status_code == 400
        modern_get = await http.get(bastion_http.url, headers={**MODERN, "accept": "text/event-stream"})
        assert modern_get.status_code == 405
        assert (await http.delete(bastion_http.url, headers=JSON)).status_code == 400
        assert (await http.delete(bastion_http.url, headers={**JSON, "mcp-session-id": "nope"})).status_code == 404
        assert (await http.put(bastion_http.url, headers=JSON, content=b"{}")).status_code == 405
        assert (await http.get(f"{bastion_http.base}/elsewhere")).status_code == 404


async def test_the_get_stream_replays_what_a_reconnecting_client_missed(bastion_http: Served) -> None:
    async with httpx2.AsyncClient(timeout=120) as http:
        headers = await open_legacy_session(http, bastion_http.url, "tester")
        # A list_changed the server announces reaches the session's GET stream, or its log while none is open.
        answer = await http.post(bastion_http.url, headers=headers, json={
            "jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": f"{SERVER}__test_add_dynamic_tool", "arguments": {}}})
        assert answer.status_code == 200
        events = await read_events(http, bastion_http.url, {**headers, "accept": "text/event-stream"}, 1)
        assert "notifications/tools/list_changed" in events[0][1]
        again = await read_events(http, bastion_http.url, {**headers, "accept": "text/event-stream",
                                                           "last-event-id": str(int(events[0][0]) - 1)}, 1)
        assert again == events  # redelivered from the bounded window


async def read_events(http: httpx2.AsyncClient, url: str, headers: dict, count: int) -> list[tuple[str, str]]:
    """The first ``count`` messages of a GET stream, as (event id, data), after its priming event (an id with
    empty data, which a 2025-11-25 stream begins with so that the client knows where to resume)."""
    found: list[tuple[str, str]] = []
    primed = False
    async with http.stream("GET", url, headers=headers) as stream:
        assert stream.status_code == 200
        event_id = ""
        async for line in stream.aiter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line == "data: " and not found and not primed:
                primed = True
            elif line.startswith("data: "):
                found.append((event_id, line[6:]))
                if len(found) == count:
                    break
    assert primed, "the GET stream did not begin with a priming event"
    return found


async def test_an_sse_stream_sends_heartbeats(bastion_http: Served) -> None:
    async with httpx2.AsyncClient(timeout=120) as http:
        headers = await open_legacy_session(http, bastion_http.url, "tester")
        async with http.stream("GET", bastion_http.url, headers={**headers, "accept": "text/event-stream"}) as stream:
            beats = 0
            async for line in stream.aiter_lines():
                beats += line.startswith(": keep-alive")
                if beats == 2:
                    break
        assert beats == 2


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_a_thousand_connections_opened_and_dropped_leak_nothing(bastion_http: Served) -> None:
    address = urlsplit(bastion_http.url)
    async with httpx2.AsyncClient(timeout=120) as http:
        assert (await http.post(bastion_http.url, headers=MODERN, content=LIST)).status_code == 200
        before = open_fds(bastion_http.process.pid)
        for index in range(1000):
            sock = socket.create_connection((address.hostname, address.port))
            if index % 2:  # half send the start of a request first
                sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
            sock.close()
        good = await http.post(bastion_http.url, headers=MODERN, content=LIST)
        assert good.status_code == 200 and good.json()["result"]["tools"]
        deadline = time.monotonic() + 60
        while open_fds(bastion_http.process.pid) > before + 5:
            assert time.monotonic() < deadline, "connections dropped by their clients were never closed"
            await asyncio.sleep(0.2)


def test_a_body_that_stalls_is_answered_with_408(bastion_http: Served) -> None:
    address = urlsplit(bastion_http.url)
    with socket.create_connection((address.hostname, address.port), timeout=60) as sock:
        sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"{IDENTITY_HEADER}: tester\r\nContent-Length: 50\r\n\r\n{{".encode())
        answer = ""  # the rest of the body never comes
        while "http.body_timeout" not in answer:
            chunk = sock.recv(65536).decode()
            if not chunk:
                break
            answer += chunk
    assert answer.startswith("HTTP/1.1 408"), answer
    assert "http.body_timeout" in answer


async def test_2026_requests_get_the_status_their_error_calls_for(bastion_http: Served) -> None:
    async with httpx2.AsyncClient(timeout=120) as http:
        no_meta = await http.post(bastion_http.url, headers=MODERN, json={"jsonrpc": "2.0", "id": 1,
                                                                          "method": "tools/list"})
        assert no_meta.status_code == 400 and no_meta.json()["error"]["code"] == -32602
        for method in ("initialize", "ping", "logging/setLevel"):  # removed in 2026-07-28, not a session's start
            removed = await http.post(bastion_http.url, headers={**MODERN, "mcp-method": method}, json={
                "jsonrpc": "2.0", "id": 2, "method": method, "params": {"_meta": MODERN_META}})
            assert removed.status_code == 404 and removed.json()["error"]["code"] == -32601, removed.text
            assert "mcp-session-id" not in removed.headers
        unknown = await http.post(bastion_http.url, headers={**MODERN, "mcp-method": "tools/call", "mcp-name": "nope"},
                                  json={"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                        "params": {"name": "nope", "arguments": {}, "_meta": MODERN_META}})
        assert unknown.status_code == 400 and unknown.json()["error"]["code"] == -32602


def test_whitespace_around_a_header_value_is_not_part_of_it(bastion_http: Served) -> None:
    address = urlsplit(bastion_http.url)
    with socket.create_connection((address.hostname, address.port), timeout=120) as sock:
        sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Mcp-Method: tools/list \t\r\nMCP-Protocol-Version: 2026-07-28\r\n"
                     + f"{IDENTITY_HEADER}: tester\r\nContent-Length: {len(LIST)}\r\n\r\n".encode() + LIST)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]


@pytest.mark.parametrize("token", [{"t": 1}, [1]])
async def test_a_progress_token_that_is_no_token_leaves_the_request_and_its_id_alone(bastion_http: Served,
                                                                                      token) -> None:
    # Found by fuzzing: an object as a handshake-era request's progressToken raised TypeError (unhashable) after the
    # request was registered, so its id stayed "in flight" for good and its admission slot was never given back.
    async with httpx2.AsyncClient(timeout=120) as http:
        headers = await open_legacy_session(http, bastion_http.url, "tokens")
        for _ in range(2):  # the same id again: answered, not "already in flight"
            response = await http.post(bastion_http.url, headers={**headers, "accept": "application/json"}, json={
                "jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {"_meta": {"progressToken": token}}})
            assert response.status_code == 200, response.text
            assert response.json()["result"]["tools"]


@pytest.mark.parametrize("event_id", [b"\xb2", b"\xb9\xb3", b"1" * 5000])
async def test_a_last_event_id_that_is_no_number_is_no_internal_error(bastion_http: Served, event_id: bytes) -> None:
    # Found by fuzzing: the header's bytes are read as Latin-1, where str.isdigit admits "²", "³" and "¹", which int
    # refuses, and int refuses over 4,300 digits: the GET answered 500. It now starts the stream where it would
    # without the header (an answer stream's "key.N" goes through the same reading of N).
    async with httpx2.AsyncClient(timeout=120) as http:
        headers = await open_legacy_session(http, bastion_http.url, "resumer")
        async with http.stream("GET", bastion_http.url, headers={**headers, "accept": "text/event-stream",
                                                                  "last-event-id": event_id}) as response:
            assert response.status_code == 200
