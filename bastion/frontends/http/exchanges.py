"""What one HTTP request waits for, and how a connection's outgoing frames find the request they belong to."""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Any, Callable

from bastion.frontends.http.streams import SseStream, priming_event, sse_event
from bastion.protocol.jsonrpc import ErrorResponse, Message, Notification, Outgoing, RawResponse, Request, Response


@dataclass(frozen=True, slots=True)
class Peeked:
    """The top of a JSON-RPC frame, enough to route it."""

    kind: str  # "request", "notification" or "response"
    id: Any = None
    method: str | None = None
    params: Any = None
    error_code: int | None = None


def peek(message: Message) -> Peeked:
    """What a parsed message is, for routing its POST: the session's own classification (``parse_message``), never
    a reading of its own."""
    kind = type(message)
    if kind is Request:
        return Peeked("request", message.id, message.method, message.params)  # type: ignore[union-attr]
    if kind is Notification:
        return Peeked("notification", None, message.method, message.params)  # type: ignore[union-attr]
    if kind is ErrorResponse:
        code = message.error.get("code")  # type: ignore[union-attr]
        return Peeked("response", message.id, error_code=code if type(code) is int else None)  # type: ignore
    return Peeked("response", message.id)  # type: ignore[union-attr]


def answer_to(message: Outgoing) -> tuple[bool, Any, int | None]:
    """Whether a message the gateway sends is an answer; if so, the id it answers and its error code (None for a
    result): read from the message the session hands over with its frame, never from the frame."""
    kind = type(message)
    if kind is Response or kind is RawResponse:
        return True, message.id, None  # type: ignore[union-attr]
    if kind is ErrorResponse:
        code = message.error.get("code")  # type: ignore[union-attr]
        return True, message.id, code if type(code) is int else None  # type: ignore[union-attr]
    return False, None, None


WITHDRAWN = b""  # what a withdrawn exchange's POST is answered: nothing (202)


class Exchange:
    """One POST that carries a request: its answer goes back as JSON when nothing comes before it, or as an SSE
    stream when the server has something to say first (progress, logs, a question) and the client accepts one.

    A resumable exchange (``stream_key`` set) numbers its stream's events ``<key>.<n>``, starting with a priming
    event ``<key>.0``, and keeps the last ``replay`` of them, so that a client whose stream dropped can ask for
    the rest with ``Last-Event-ID`` on a GET (``resume``) while the call goes on."""

    def __init__(self, request_id: Any, *, accepts_sse: bool, release: Callable[[], None] = lambda: None,
                 stream_key: str | None = None, replay: int = 0) -> None:
        self.request_id = request_id
        self.accepts_sse = accepts_sse
        self.first: asyncio.Future[tuple[bytes, bool]] = asyncio.get_running_loop().create_future()
        self.stream: SseStream | None = None
        self.answered = False
        self.error_code: int | None = None  # the answer's, once answered with an error
        self.stream_key = stream_key
        self.pending = False  # recorded in the store replicas share as a call whose answer is a stream
        self.expiry: asyncio.TimerHandle | None = None  # while its stream is down: when its call is given up
        self._backlog: list[tuple[bytes, bool]] = []
        self._release: Callable[[], None] | None = release
        self._replay = max(replay, 1)
        self._sent: collections.deque[tuple[int, bytes]] | None = None  # made with the first event: most answer as JSON
        self._next_event = 1

    def deliver(self, frame: bytes, final: bool, error_code: int | None = None) -> None:
        if self.answered:
            return
        if final:
            self.answered = True
            self.error_code = error_code
            self.release()
        if self.stream is not None:
            # A stream that dropped takes nothing more; a resumable one's events wait in _sent for the client.
            self.stream.push(self._event(frame))
            if final:
                self.stream.finish()
            return
        if not final and not self.accepts_sse:
            return  # a JSON answer has no room for what comes before it
        if not self.first.done():
            self.first.set_result((frame, final))
        else:
            self._backlog.append((frame, final))

    def withdraw(self) -> None:
        """The client cancelled the request, so nothing answers it (a receiver of a cancellation sends no response):
        its POST ends at once, with 202 and no body, or its stream ends without an answer."""
        if self.answered:
            return
        self.answered = True
        self.release()
        if self.stream is not None:
            self.stream.finish()
        elif not self.first.done():
            self.first.set_result((WITHDRAWN, True))

    def attach(self, stream: SseStream, first: bytes | None, retry_ms: int) -> None:
        """Answer on ``stream`` from now on: its priming event when resumable, then ``first`` (None when the
        answer is merely slow) and what came after it."""
        self.stream = stream
        if self.stream_key is not None:
            stream.push(priming_event(f"{self.stream_key}.0", retry_ms))
        if first is not None:
            stream.push(self._event(first))
        for frame, final in self._backlog:
            stream.push(self._event(frame))
        self._backlog.clear()
        if self.answered:
            stream.finish()

    def resume(self, stream: SseStream, after: int) -> None:
        """Go on answering on ``stream``, a client's GET with ``Last-Event-ID: <key>.<after>``: first the events
        it missed, then what follows."""
        previous, self.stream = self.stream, stream
        if previous is not None:
            previous.finish()  # a client that reconnects may not have been seen to leave; the new stream wins
        for number, event in self._sent or ():
            if number > after:
                stream.push(event)
        if self.answered:
            stream.finish()

    def _event(self, frame: bytes) -> bytes:
        if self.stream_key is None:
            return sse_event(frame)
        number = self._next_event
        self._next_event += 1
        event = sse_event(frame, f"{self.stream_key}.{number}")
        if self._sent is None:
            self._sent = collections.deque(maxlen=self._replay)
        self._sent.append((number, event))
        return event

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
