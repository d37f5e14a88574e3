"""Server-sent event streams with a bound on what a client that stops reading may make Bastion hold, heartbeats,
and the replay log that ``Last-Event-ID`` reads."""

from __future__ import annotations

import asyncio
import collections
import logging
import re
from typing import Any, Awaitable, Callable, Iterable

log = logging.getLogger("bastion.http")

AsgiSend = Callable[[dict[str, Any]], Awaitable[None]]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-store"),
               (b"x-accel-buffering", b"no")]
_HEARTBEAT = b": keep-alive\n\n"


_EVENT_NUMBER = re.compile(r"[0-9]{1,18}")


def event_number(text: str) -> int | None:
    """The number a ``Last-Event-ID`` (or its part after the dot) gives, None when it gives none: ASCII digits only,
    fewer than 19 (``str.isdigit`` admits "²", which ``int`` refuses, and ``int`` refuses over 4,300 digits)."""
    return int(text) if _EVENT_NUMBER.fullmatch(text) else None


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


def priming_event(event_id: str, retry_ms: int) -> bytes:
    """An event with an id and empty data, sent first on a resumable stream (SEP-1699): the client records the id
    as where to resume with ``Last-Event-ID`` and dispatches nothing; ``retry`` is how long it waits to reconnect."""
    return b"id: " + event_id.encode() + b"\nretry: " + str(retry_ms).encode() + b"\ndata: \n\n"


class StreamOverflow(Exception):
    pass


class SseStream:
    """One open SSE response. ``push`` never blocks (the gateway's send is synchronous); the writer task sends what
    was pushed, a heartbeat when there was nothing for a while, and ends the response when the client has let
    ``limit`` events (or ``byte_limit`` bytes of them) pile up unread, when ``finish`` is called, or when the client
    goes.

    A client that let ``limit`` events (or ``byte_limit`` bytes) pile up is told why its stream ends: what was
    queued is dropped and ``notice`` (an encoded event) is written instead, then the response ends. A client that
    is merely slow reads it once it catches up; one that never reads gets its connection closed after
    ``notice_grace`` seconds."""

    def __init__(self, send: AsgiSend, *, limit: int, heartbeat: float, headers: Iterable[tuple[bytes, bytes]] = (),
                 on_sent: Callable[[int], None] | None = None, notice: bytes | None = None,
                 notice_grace: float = 5.0, byte_limit: int | None = None) -> None:
        self._send = send
        self._queue: collections.deque[tuple[bytes, int | None]] = collections.deque()
        self._ready = asyncio.Event()
        self._limit = limit
        # Bytes as well as events: a few huge events would hold as much memory as no count bounds.
        self._byte_limit = byte_limit
        self._queued_bytes = 0
        self._heartbeat = heartbeat
        self._headers = [*SSE_HEADERS, *headers]
        self._on_sent = on_sent
        self._notice = notice
        self._notice_grace = notice_grace
        self._sending = False  # the writer waits in a write of events, which an overflow interrupts
        self._finishing = False
        self.overflowed = False
        self.completed = False  # every event pushed was written and the response is ending
        # Called once every event pushed is written, before the response ends: what must no longer be offered once
        # the client has it all (a call's answer to resume) is withdrawn before the client can see the end.
        self.on_complete: Callable[[], None] | None = None
        self.ended = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None

    def push(self, event: bytes, seq: int | None = None) -> bool:
        """Queue one encoded event; False (and the stream ends) when the client has stopped reading."""
        if self.ended.is_set() or self._finishing or self.overflowed:
            return False
        if len(self._queue) >= self._limit or self._over_bytes(len(event)):
            self.overflowed = True
            log.warning("an SSE client left %d events unread (%d bytes); its stream is closed, with a notice saying "
                        "so", len(self._queue), self._queued_bytes)
            self._queue.clear()
            self._queued_bytes = 0
            if self._writer is not None and self._sending:
                self._writer.cancel()  # it waits on a socket the client does not read, maybe for ever
            self._ready.set()  # a writer waiting for events sees the overflow itself
            return False
        self._queue.append((event, seq))
        self._queued_bytes += len(event)
        self._ready.set()
        return True

    def _over_bytes(self, size: int) -> bool:
        """Whether one more event of ``size`` bytes passes the byte bound; an event alone never does (it is within
        max_message_bytes), only one that joins others the client has not read."""
        return self._byte_limit is not None and bool(self._queue) and self._queued_bytes + size > self._byte_limit

    def finish(self) -> None:
        """End the response once what was pushed is sent."""
        self._finishing = True
        self._ready.set()

    async def run(self, status: int = 200) -> None:
        writer = self._writer = asyncio.current_task()
        assert writer is not None
        try:
            try:
                await self._send({"type": "http.response.start", "status": status, "headers": self._headers})
                await self._send({"type": "http.response.body", "body": b": stream open\n\n", "more_body": True})
                await self._write_events()
            except asyncio.CancelledError:
                if not self.overflowed:
                    raise
                writer.uncancel()  # push's own interruption of a write the client was not reading
            if self.overflowed:
                await self._say_overflowed()
        except OSError:
            pass  # the client went while we wrote
        finally:
            self._writer = None
            self.ended.set()

    async def _write_events(self) -> None:
        """Write what is pushed until ``finish`` (then end the response) or an overflow (then return): an overflow
        cancels a write in progress (only that: see ``_write``), and is seen here between writes."""
        while not self.overflowed:
            if not self._queue:
                if self._finishing:
                    self.completed = True
                    if self.on_complete is not None:
                        self.on_complete()
                    await self._send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
                self._ready.clear()
                try:
                    await asyncio.wait_for(self._ready.wait(), self._heartbeat)
                except TimeoutError:
                    await self._write(_HEARTBEAT)
                continue
            event, seq = self._queue.popleft()
            self._queued_bytes -= len(event)
            await self._write(event)
            if seq is not None and self._on_sent is not None:
                self._on_sent(seq)

    async def _write(self, body: bytes) -> None:
        self._sending = True
        try:
            await self._send({"type": "http.response.body", "body": body, "more_body": True})
        finally:
            self._sending = False

    async def _say_overflowed(self) -> None:
        """End the response with the notice once the client reads again; if it does not within the grace, return
        without ending it, and the server drops the connection."""
        try:
            async with asyncio.timeout(self._notice_grace):
                await self._send({"type": "http.response.body", "body": self._notice or b"", "more_body": False})
        except TimeoutError:
            pass


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
