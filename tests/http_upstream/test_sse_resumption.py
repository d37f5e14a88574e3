"""A 2025-11-25 server that closes an event stream after naming an event id and ``retry: 300``: Bastion's HTTP
transport reconnects once, with ``Last-Event-ID``, and not before the retry interval by the server's own clock.

The server is a few lines of HTTP/1.1 on a loopback socket, so what it records is exactly what arrived."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from bastion.transport.http_client import HttpTransport

RETRY_SECONDS = 0.3
SESSION = "session-resume"


class ResumingServer:
    """Legacy Streamable HTTP: ``initialize`` gives a session; a stream (the GET one, or a ``tools/call``'s) sends
    an event with an id and ``retry: 300``, then closes; a GET with ``Last-Event-ID`` is recorded and, for the
    call, carries its answer."""

    def __init__(self, close_get_stream: bool) -> None:
        self.close_get_stream = close_get_stream
        self.gets: list[tuple[float, str | None]] = []  # (server clock, Last-Event-ID) of every GET
        self.closed_at: float | None = None  # when the stream with the retry field was closed
        self.pending_call: Any = None
        self._held: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/mcp"

    async def __aexit__(self, *exc: object) -> None:
        for writer in self._held:
            writer.close()
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method = head[0].split(" ")[0]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        loop = asyncio.get_running_loop()
        if method == "GET":
            self.gets.append((loop.time(), headers.get("last-event-id")))
            self._start_stream(writer)
            if len(self.gets) == 1 and self.close_get_stream:
                writer.write(b"id: get-1\nretry: 300\ndata: \n\n")
                await writer.drain()
                self.closed_at = loop.time()
                writer.close()
            elif headers.get("last-event-id") == "call-1" and self.pending_call is not None:
                answer = {"jsonrpc": "2.0", "id": self.pending_call, "result": {"content": [], "resumed": True}}
                writer.write(b"id: call-2\ndata: " + orjson.dumps(answer) + b"\n\n")
                await writer.drain()
                writer.close()
            else:
                self._held.append(writer)  # open and silent
            return
        if method != "POST":  # the DELETE that ends the session at close
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        message = orjson.loads(body)
        if message.get("method") == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "resuming", "version": "1"}}
            payload = orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: " + SESSION.encode()
                         + b"\r\nconnection: close\r\ncontent-length: " + str(len(payload)).encode() + b"\r\n\r\n"
                         + payload)
        elif message.get("method") == "tools/call":
            self.pending_call = message["id"]
            self._start_stream(writer)
            writer.write(b"id: call-1\nretry: 300\ndata: \n\n")
            await writer.drain()
            self.closed_at = loop.time()
        else:
            writer.write(b"HTTP/1.1 202 Accepted\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    @staticmethod
    def _start_stream(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                     b"mcp-session-id: " + SESSION.encode() + b"\r\nconnection: close\r\n\r\n")


class Frames:
    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()

    def frames_received(self, frames: Any) -> None:
        self.received.extend(orjson.loads(frame) for frame in frames)
        self.arrived.set()

    async def answer(self, request_id: Any) -> dict[str, Any]:
        while True:
            for frame in self.received:
                if frame.get("id") == request_id and "method" not in frame:
                    return frame
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 30)


async def _handshake(transport: HttpTransport, frames: Frames) -> None:
    await transport.start(frames)
    transport.send(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}))
    assert (await frames.answer(1))["result"]["protocolVersion"] == "2025-11-25"
    transport.send(orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))


async def _until(condition: Any, what: str) -> None:
    for _ in range(600):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_get_stream_that_ends_is_reopened_with_last_event_id_after_its_retry() -> None:
    server = ResumingServer(close_get_stream=True)
    async with server as url:
        transport = HttpTransport("resuming", url, {}, kind="streamable-http")
        try:
            await _handshake(transport, Frames())
            await _until(lambda: len(server.gets) >= 2, "the GET stream to be reopened")
            await asyncio.sleep(2 * RETRY_SECONDS)  # time for a wrong extra reconnection to show
            assert [last for _, last in server.gets] == [None, "get-1"]
            assert server.closed_at is not None
            assert server.gets[1][0] - server.closed_at >= RETRY_SECONDS - 0.01
            assert transport.is_open
        finally:
            await transport.close()


async def test_a_calls_stream_closed_before_its_answer_is_resumed_with_last_event_id_after_its_retry() -> None:
    server = ResumingServer(close_get_stream=False)
    async with server as url:
        transport = HttpTransport("resuming", url, {}, kind="streamable-http")
        frames = Frames()
        try:
            await _handshake(transport, frames)
            transport.send(orjson.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                         "params": {"name": "slow", "arguments": {}}}))
            answer = await frames.answer(2)
            assert answer.get("result", {}).get("resumed") is True, answer
            resumptions = [(at, last) for at, last in server.gets if last is not None]
            assert [last for _, last in resumptions] == ["call-1"]
            assert server.closed_at is not None
            assert resumptions[0][0] - server.closed_at >= RETRY_SECONDS - 0.01
            assert len([last for _, last in server.gets if last is None]) == 1  # the session's own stream
        finally:
            await transport.close()
