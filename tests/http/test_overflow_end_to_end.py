"""A stream whose reader stops reading, through a real ``bastion serve``: a server floods a call's answer stream
with large log messages while the client reads nothing, the stream's buffer passes its bound, and the client,
reading at last, finds the stream ended by the request's own answer: an error naming the bound, not a bare
close."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from pathlib import Path

import httpx2

from tests.http.conftest import IDENTITY_HEADER, start_bastion, stop_bastion

DEADLINE = 120.0

# A handshake-era server over stdio whose one tool logs 200 messages of 60 kB before it answers.
FLOOD_SERVER = r'''
import json, sys
BIG = "x" * 60000
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
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [{"name": "flood", "inputSchema": {"type": "object"}}]}})
    elif method == "tools/call":
        for n in range(200):
            send({"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": "info", "data": f"{n} {BIG}"}})
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "flooded"}]}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found"}})
'''


async def test_a_reader_that_stops_reading_gets_an_error_naming_the_bound_as_the_last_event(tmp_path: Path) -> None:
    script = tmp_path / "flood_server.py"
    script.write_text(FLOOD_SERVER)
    served = start_bastion(tmp_path, {"identity_header": IDENTITY_HEADER, "stream_buffer_messages": 8},
                           servers={"flood": {"command": sys.executable, "args": [str(script)],
                                              "sandbox": {"writable": [str(tmp_path)]}}})
    loop = asyncio.get_running_loop()
    reader = socket.socket()
    try:
        async with httpx2.AsyncClient(timeout=DEADLINE) as http:
            headers = {IDENTITY_HEADER: "flooded", "accept": "application/json, text/event-stream"}
            init = await http.post(served.url, headers=headers, json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
            session = init.headers["mcp-session-id"]
            headers = {**headers, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
            done = await http.post(served.url, headers=headers, json={"jsonrpc": "2.0",
                                                                      "method": "notifications/initialized"})
            assert done.status_code == 202
        # The call, on a socket that reads nothing until the bound has been passed.
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.setblocking(False)
        host, port = served.base.removeprefix("http://").split(":")
        await loop.sock_connect(reader, (host, int(port)))
        body = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                           "params": {"name": "flood__flood", "arguments": {}}}).encode()
        request = (f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                   f"Accept: application/json, text/event-stream\r\n{IDENTITY_HEADER}: flooded\r\n"
                   f"Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        await loop.sock_sendall(reader, request)
        deadline = time.monotonic() + DEADLINE
        while "events unread" not in served.stderr.read_text():
            assert time.monotonic() < deadline, "the stream never passed its bound"
            await asyncio.sleep(0.1)
        received = bytearray()
        while not received.endswith(b"0\r\n\r\n"):  # the chunked body's end: the response was completed
            chunk = await asyncio.wait_for(loop.sock_recv(reader, 1 << 20), DEADLINE)
            assert chunk, "the connection closed before the stream's last event"
            received += chunk
        messages = [json.loads(line[len(b"data: "):]) for line in bytes(received).split(b"\n")
                    if line.startswith(b"data: {")]
        last = messages[-1]
        assert last["id"] == 9 and last["error"]["code"] == -32000, last
        assert "http.stream_buffer_messages" in last["error"]["message"] and "unread" in last["error"]["message"]
        # Before it, some of the flood as it was sent, and never the answer the server gave after it.
        assert messages[:-1] and all(m["method"] == "notifications/message" for m in messages[:-1])
        assert len(messages) - 1 < 200
    finally:
        reader.close()
        stop_bastion(served)
