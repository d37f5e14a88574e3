"""How the HTTP frontend answers one exchange (a POSTed request): as JSON when its answer comes first, or as an SSE
stream when something comes before it (or, for a resumable session, when it is slow); the resumption of such a stream
with ``Last-Event-ID``; what ends a stream whose client stopped reading; a stream run until its client goes."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

import orjson

from bastion.config import HttpConfig
from bastion.frontends.http.exchanges import WITHDRAWN, Exchange
from bastion.frontends.http.streams import SseStream, event_number, sse_event, wait_disconnect
from bastion.frontends.http.wire import NO_STORE, HttpError, Receive, Send, empty_response, json_response

if TYPE_CHECKING:
    from bastion.frontends.http.sessions import LegacySession

STATUS_FOR_CODE = {-32020: 400, -32021: 400, -32022: 400}
# A resumable session's call not answered within STREAM_AFTER_SECONDS is answered as a stream (SEP-1699), so that a
# client whose connection drops during a long call can come back for its answer.
STREAM_AFTER_SECONDS = 0.1
RETRY_MS = 1000  # the priming event's retry: how long a client waits before it reconnects


class Answers:
    """The answering of exchanges, with the streams open for them (ended when the frontend stops)."""

    def __init__(self, settings: HttpConfig) -> None:
        self.settings = settings
        self.streams: set[SseStream] = set()

    async def answer(self, exchange: Exchange, receive: Receive, send: Send, headers: tuple[tuple[bytes, bytes], ...],
                     abandon: Callable[[], None], statuses: Mapping[int, int] = STATUS_FOR_CODE, *,
                     detach: Callable[[], None] | None = None, forget: Callable[[], None] = lambda: None,
                     streaming: Callable[[], Awaitable[None]] | None = None) -> None:
        """Send the exchange's answer as JSON, or as an SSE stream when something comes first; call ``abandon``
        when the client goes before the answer. A resumable exchange (``detach`` given) is streamed too when its
        answer is slow, and a drop of its stream calls ``detach`` instead, leaving the call to be resumed;
        ``streaming`` is awaited before such a stream begins (replicas record the call as pending there)."""
        first: bytes | None = None
        if not exchange.first.done():
            came = await _first_before_disconnect(exchange.first, receive,
                                                  STREAM_AFTER_SECONDS if detach is not None else None)
            if came == _GONE:
                abandon()
                return
        if exchange.first.done():
            first, final = exchange.first.result()
            if final and first == WITHDRAWN:  # the client cancelled it: nothing answers it
                forget()
                await empty_response(send, 202, headers)
                return
            if final:
                forget()
                status = statuses.get(exchange.error_code or 0, 200)
                await json_response(send, status, first, headers)
                return
        if streaming is not None and detach is not None:
            await streaming()
            if first is None and exchange.first.done():
                # The answer came while the call was being recorded for other replicas (a store round trip): it is
                # the stream's first event, not lost (a withdrawal then ends the stream with nothing, as it should).
                came, final = exchange.first.result()
                if not (final and came == WITHDRAWN):
                    first = came
        stream = SseStream(send, limit=self.settings.stream_buffer_messages,
                           byte_limit=self.settings.stream_buffer_bytes,
                           heartbeat=self.settings.heartbeat_seconds, headers=(NO_STORE, *headers),
                           notice=self.overflow_answer(exchange.request_id))
        stream.on_complete = _when_delivered(exchange, stream, forget)
        exchange.attach(stream, first, RETRY_MS)
        try:
            await self.stream_until_gone(stream, receive)
        finally:
            _settle(exchange, stream, abandon, detach, forget)

    async def resume(self, session: "LegacySession", event_id: str, receive: Receive, send: Send) -> None:
        """A GET with the ``Last-Event-ID`` of a call's answer stream: that stream goes on here, from the event
        after that one to the answer."""
        key, _, after = event_id.partition(".")
        exchange = session.resumable.get(key)
        number = event_number(after)
        if exchange is None or number is None:
            raise HttpError(400, -32600, f"no answer stream to resume at event {event_id!r}: its answer was sent, "
                                         f"or it waited more than {self.settings.resume_seconds:g} s for the client "
                                         "(http.resume_seconds)")
        session.resuming(exchange)
        stream = SseStream(send, limit=self.settings.stream_buffer_messages,
                           byte_limit=self.settings.stream_buffer_bytes, heartbeat=self.settings.heartbeat_seconds,
                           headers=(NO_STORE, (b"mcp-session-id", session.id.encode())),
                           notice=self.overflow_answer(exchange.request_id))
        stream.on_complete = _when_delivered(exchange, stream, lambda: session.forget(exchange))
        exchange.resume(stream, number)
        try:
            await self.stream_until_gone(stream, receive)
        finally:
            _settle(exchange, stream, lambda: session.abandon(exchange), lambda: session.detach(exchange),
                    lambda: session.forget(exchange))

    async def answer_lost(self, session: "LegacySession", key: str, request_id: Any, after: int,
                          send: Send) -> None:
        """A client resuming, here, the answer stream of a call another replica ran: that replica stopped (or the
        client was sent away from it), so the stream ends at once with an error for the request, never a wait."""
        stream = SseStream(send, limit=self.settings.stream_buffer_messages,
                           byte_limit=self.settings.stream_buffer_bytes, heartbeat=self.settings.heartbeat_seconds,
                           headers=(NO_STORE, (b"mcp-session-id", session.id.encode())))
        stream.push(sse_event(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": {
            "code": -32000, "message": "the gateway replica that ran this request stopped before its answer was "
                                       "sent (or this client now reaches another replica): its outcome is unknown; "
                                       "check before sending it again", "data": {"outcome": "unknown"}}}),
                              f"{key}.{after + 1}"))
        stream.finish()
        await stream.run()

    def overflow_answer(self, request_id: Any) -> bytes:
        """What ends a request's stream whose client stopped reading: the request's answer, an error saying why."""
        return sse_event(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": {
            "code": -32000, "message": f"Bastion closed this stream: {self._unread()}; the request is "
                                       "cancelled"}}))

    def overflow_notice(self, consequence: str, event: str | None = None) -> bytes:
        """What ends a stream of server messages whose client stopped reading: a log message saying why."""
        return sse_event(orjson.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {
            "level": "error", "logger": "bastion",
            "data": f"Bastion closed this stream: {self._unread()}; {consequence}"}}), event=event)

    def _unread(self) -> str:
        settings = self.settings
        return (f"more than {settings.stream_buffer_messages} messages or {settings.stream_buffer_bytes} bytes waited "
                "unread for this client (http.stream_buffer_messages, http.stream_buffer_bytes)")

    async def stream_until_gone(self, stream: SseStream, receive: Receive) -> None:
        """Run ``stream`` until it ends or its client goes, whichever comes first."""
        self.streams.add(stream)
        gone = asyncio.ensure_future(wait_disconnect(receive))
        writer = asyncio.ensure_future(stream.run())
        try:
            await asyncio.wait((gone, writer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not writer.done():
                writer.cancel()
            self.streams.discard(stream)


def _when_delivered(exchange: Exchange, stream: SseStream, forget: Callable[[], None]) -> Callable[[], None]:
    """What a call's answer stream does once its last event is written and before its response ends: forget the
    call, so that a client resuming the moment it has the answer is told there is nothing to resume (never sent
    the answer twice)."""
    def delivered() -> None:
        if exchange.stream is stream and exchange.answered:
            forget()
    return delivered


def _settle(exchange: Exchange, stream: SseStream, abandon: Callable[[], None], detach: Callable[[], None] | None,
            forget: Callable[[], None]) -> None:
    """After a call's answer stream ended: done when the answer was written; else the call is abandoned, or, when
    its stream is resumable, kept for the client's return. A stream another one has replaced decides nothing."""
    if exchange.stream is not stream:
        return
    if stream.overflowed:
        abandon()
    elif exchange.answered and stream.completed:
        forget()
    elif detach is not None:
        detach()
    elif not exchange.answered:
        abandon()


_CAME, _GONE, _LATE = "came", "gone", "late"


async def _first_before_disconnect(first: asyncio.Future[Any], receive: Receive, patience: float | None = None) -> str:
    """Wait for ``first`` while this task itself watches ``receive()``: ``_CAME`` when it came, ``_GONE`` when the
    client went first, ``_LATE`` when ``patience`` seconds passed first. The future's arrival (or the timer)
    interrupts the wait on ``receive()`` by cancelling it; a Task per request to watch for the disconnect, and
    ``asyncio.wait`` over both, cost about 8 µs of CPU on every POST."""
    task = asyncio.current_task()
    assert task is not None
    watching, interrupted = True, ""

    def interrupt(_: asyncio.Future[Any] | None = None, why: str = _CAME) -> None:
        nonlocal interrupted
        if watching and not interrupted:  # a callback already queued when the disconnect won must not cancel later
            interrupted = why
            task.cancel()

    first.add_done_callback(interrupt)
    timer = asyncio.get_running_loop().call_later(patience, interrupt, None, _LATE) if patience is not None else None
    try:
        await wait_disconnect(receive)
    except asyncio.CancelledError:
        # Only this interruption is absorbed; a cancellation from elsewhere (the server stopping) goes on.
        if not interrupted or task.uncancel() > 0:
            raise
        return interrupted
    finally:
        watching = False
        first.remove_done_callback(interrupt)
        if timer is not None:
            timer.cancel()
    return _GONE
