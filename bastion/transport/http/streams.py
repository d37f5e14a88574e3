"""Server-sent event streams with a bound on what a client that stops reading may make Bastion hold, heartbeats,
and the replay log that ``Last-Event-ID`` reads."""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, Awaitable, Callable, Iterable

log = logging.getLogger("bastion.http")

AsgiSend = Callable[[dict[str, Any]], Awaitable[None]]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-store"),
               (b"x-accel-buffering", b"no")]
_HEARTBEAT = b": keep-alive\n\n"


def sse_event(data: bytes, event_id: str | None = None, event: str | None = None) -> bytes:
    parts = []
    if event is not None:
        parts.append(b"event: " + event.encode() + b"\n")
    if event_id is not None:
        parts.append(b"id: " + event_id.encode() + b"\n")
    for line in data.splitlines() or [b""]:  # a frame is one line; a stray newline must not end the event
        parts.append(b"data: " + line + b"\n")
    parts.append(b"\n")
    return b"".join(parts)


class StreamOverflow(Exception):
    pass


class SseStream:
    """One open SSE response. ``push`` never blocks (the gateway's send is synchronous); the writer task sends what
    was pushed, a heartbeat when there was nothing for a while, and ends the response when the client has let
    ``limit`` events pile up unread, when ``finish`` is called, or when the client goes."""

    def __init__(self, send: AsgiSend, *, limit: int, heartbeat: float, headers: Iterable[tuple[bytes, bytes]] = (),
                 on_sent: Callable[[int], None] | None = None) -> None:
        self._send = send
        self._queue: collections.deque[tuple[bytes, int | None]] = collections.deque()
        self._ready = asyncio.Event()
        self._limit = limit
        self._heartbeat = heartbeat
        self._headers = [*SSE_HEADERS, *headers]
        self._on_sent = on_sent
        self._finishing = False
        self.overflowed = False
        self.ended = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None

    def push(self, event: bytes, seq: int | None = None) -> bool:
        """Queue one encoded event; False (and the stream ends) when the client has stopped reading."""
        if self.ended.is_set() or self._finishing:
            return False
        if len(self._queue) >= self._limit:
            if not self.overflowed:
                self.overflowed = True
                log.warning("an SSE client left %d events unread; its stream is closed", self._limit)
                if self._writer is not None:
                    self._writer.cancel()  # it may wait on a socket the client does not read, for ever
            self.ended.set()
            self._ready.set()
            return False
        self._queue.append((event, seq))
        self._ready.set()
        return True

    def finish(self) -> None:
        """End the response once what was pushed is sent."""
        self._finishing = True
        self._ready.set()

    async def run(self, status: int = 200) -> None:
        self._writer = asyncio.current_task()
        try:
            await self._send({"type": "http.response.start", "status": status, "headers": self._headers})
            await self._send({"type": "http.response.body", "body": b": stream open\n\n", "more_body": True})
            while not self.ended.is_set():
                if not self._queue:
                    if self._finishing:
                        break
                    self._ready.clear()
                    try:
                        await asyncio.wait_for(self._ready.wait(), self._heartbeat)
                    except TimeoutError:
                        await self._send({"type": "http.response.body", "body": _HEARTBEAT, "more_body": True})
                    continue
                if self.overflowed:
                    break
                event, seq = self._queue.popleft()
                await self._send({"type": "http.response.body", "body": event, "more_body": True})
                if seq is not None and self._on_sent is not None:
                    self._on_sent(seq)
            if not self.overflowed:
                await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            # An overflowed stream returns without ending its body: the server then drops the connection.
        except OSError:
            pass  # the client went while we wrote
        except asyncio.CancelledError:
            if not self.overflowed:
                raise
        finally:
            self._writer = None
            self.ended.set()


class ReplayLog:
    """The events of a session's GET stream, numbered, the last ``size`` of them kept: a client that reconnects
    with ``Last-Event-ID`` gets what it missed, and messages sent while no GET stream was open wait here."""

    def __init__(self, size: int) -> None:
        self._events: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=max(size, 1))
        self._next = 1
        self.delivered = 0  # the last sequence number a live stream sent

    def record(self, frame: bytes) -> int:
        seq = self._next
        self._next += 1
        self._events.append((seq, frame))
        return seq

    def after(self, seq: int) -> list[tuple[int, bytes]]:
        return [(s, f) for s, f in self._events if s > seq]

    def sent(self, seq: int) -> None:
        if seq > self.delivered:
            self.delivered = seq


async def wait_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """Return when the client has gone (after the request body, which the caller has read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
