"""What one HTTP request waits for, and how a connection's outgoing frames find the request they belong to."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Callable

import orjson

from bastion.transport.http.streams import SseStream, sse_event


@dataclass(frozen=True, slots=True)
class Peeked:
    """The top of a JSON-RPC frame, enough to route it."""

    kind: str  # "request", "notification", "response" or "invalid"
    id: Any = None
    method: str | None = None
    params: Any = None
    error_code: int | None = None


def peek(frame: bytes | dict[str, Any]) -> Peeked:
    if isinstance(frame, (bytes, bytearray, memoryview)):
        try:
            message = orjson.loads(frame)
        except orjson.JSONDecodeError:
            try:  # integers wider than 64 bits, which orjson refuses and the protocol allows
                message = json.loads(bytes(frame))
            except ValueError:
                return Peeked("invalid")
    else:
        message = frame
    if not isinstance(message, dict):
        return Peeked("invalid")
    method = message.get("method")
    if isinstance(method, str):
        return Peeked("request" if "id" in message else "notification", message.get("id"), method,
                      message.get("params"))
    if "id" in message and ("result" in message or "error" in message):
        error = message.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        return Peeked("response", message.get("id"), error_code=code if isinstance(code, int) else None)
    return Peeked("invalid")


class Exchange:
    """One POST that carries a request: its answer goes back as JSON when nothing comes before it, or as an SSE
    stream when the server has something to say first (progress, logs, a question) and the client accepts one."""

    def __init__(self, request_id: Any, *, accepts_sse: bool, release: Callable[[], None] = lambda: None) -> None:
        self.request_id = request_id
        self.accepts_sse = accepts_sse
        self.first: asyncio.Future[tuple[bytes, bool]] = asyncio.get_running_loop().create_future()
        self.stream: SseStream | None = None
        self.answered = False
        self._backlog: list[tuple[bytes, bool]] = []
        self._release: Callable[[], None] | None = release

    def deliver(self, frame: bytes, final: bool) -> None:
        if self.answered:
            return
        if final:
            self.answered = True
            self.release()
        if self.stream is not None:
            self.stream.push(sse_event(frame))
            if final:
                self.stream.finish()
            return
        if not final and not self.accepts_sse:
            return  # a JSON answer has no room for what comes before it
        if not self.first.done():
            self.first.set_result((frame, final))
        else:
            self._backlog.append((frame, final))

    def attach(self, stream: SseStream, first: bytes) -> None:
        self.stream = stream
        stream.push(sse_event(first))
        for frame, final in self._backlog:
            stream.push(sse_event(frame))
        self._backlog.clear()
        if self.answered:
            stream.finish()

    def release(self) -> None:
        """Give back the server's in-flight slot this request held, once."""
        release, self._release = self._release, None
        if release is not None:
            release()


class ServerGate:
    """A bound on the requests one server has in flight from all clients (calls, prompts, reads, completions):
    past it a request is refused at once with -32000 and ``retryAfterSeconds``, never queued."""

    def __init__(self, limit: int, retry_after: int) -> None:
        self.limit = limit
        self.retry_after = retry_after
        self._in_flight: dict[str, int] = {}

    def acquire(self, server: str) -> Callable[[], None] | None:
        """A release for the slot taken, or None when the server is full."""
        count = self._in_flight.get(server, 0)
        if count >= self.limit:
            return None
        self._in_flight[server] = count + 1

        def release() -> None:
            left = self._in_flight.get(server, 1) - 1
            if left > 0:
                self._in_flight[server] = left
            else:
                self._in_flight.pop(server, None)
        return release

    def in_flight(self, server: str) -> int:
        return self._in_flight.get(server, 0)

    def busy_error(self, server: str) -> dict[str, Any]:
        return {"code": -32000,
                "message": f"server {server!r} has {self.limit} requests in flight, the most Bastion sends it "
                           f"(http.max_in_flight_per_server); retry in {self.retry_after} s",
                "data": {"retryAfterSeconds": self.retry_after}}
