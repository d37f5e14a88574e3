"""The HTTP frontend's sessions: a handshake-era client's Streamable HTTP session (its gateway connection, its GET
stream, the POSTs waiting for their answers and the answer streams it may resume) and an HTTP+SSE client's."""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any, Callable

import orjson

from bastion.frontends.connection import ClientConnection
from bastion.frontends.http.exchanges import Exchange, answer_to
from bastion.frontends.http.quotas import Holder
from bastion.frontends.http.records import SessionRecord, SessionRecords, caller_of
from bastion.frontends.http.streams import ReplayLog, SseStream, sse_event
from bastion.model import Identity
from bastion.protocol.jsonrpc import Notification, Outgoing, Request, is_valid_id
from bastion.state import StateUnavailable

if TYPE_CHECKING:
    from bastion.frontends.http.app import HttpFrontend

log = logging.getLogger("bastion.http")

# A 2025-11-25 session's streams are resumable (SEP-1699): each begins with a priming event, and a call not answered
# in time is answered as such a stream, so that a client whose connection drops during a long call can come back for
# its answer. Older clients cannot read a priming event's empty data.
RESUMABLE_SINCE = "2025-11-25"


class LegacySession:
    """A 2025-11-25 (or older) client's session: its gateway connection, its GET stream and the POSTs waiting."""

    def __init__(self, frontend: "HttpFrontend", identity: Identity, holder: Holder,
                 restored: tuple[str, SessionRecord] | None = None) -> None:
        self.id = secrets.token_urlsafe(24) if restored is None else restored[0]
        self.identity = identity
        self.holder = holder  # whose quota it counts against (quotas.py)
        self.exchanges: dict[Any, Exchange] = {}
        self.progress: dict[Any, Exchange] = {}
        self.outbox = ReplayLog(frontend.settings.replay_events)
        self.get_stream: SseStream | None = None
        self.last_seen = time.monotonic()
        self.closing = False
        self._frontend = frontend
        self._feeding: Exchange | None = None
        # The calls whose answer stream a GET with Last-Event-ID may resume, by the key their event ids begin with.
        self.resumable: dict[str, Exchange] = {}
        self._stream_numbers = itertools.count(1)
        self.connection = ClientConnection(frontend.gateway, self.route, identity=identity,
                                           close=self._close_soon, over_network=True)
        # The record replicas share (records.py) as last written, and when: written again when it changes, and
        # refreshed every few seconds while the session is used.
        self.saved: SessionRecord | None = None
        self.saved_at = 0.0
        self.shared = restored is not None  # its record is in the store (not, when too large to share)
        self._relayed: asyncio.Task[None] | None = None  # answers to this replica's requests POSTed to another
        self._shared_out: asyncio.Queue[bytes] | None = None  # GET stream messages on their way to the store
        self._sharing: asyncio.Task[None] | None = None
        if frontend.records is not None:
            self.connection.protocol.outgoing_prefix = f"bastion-{frontend.replica_tag}-"
        if restored is not None:
            record = restored[1]
            self.connection.restore(record.protocol_version, record.client_capabilities, record.client_info,
                                    initialized=record.initialized, log_level=record.log_level)
            self.saved, self.saved_at = record, time.monotonic()

    def record(self) -> SessionRecord:
        """What another replica needs to continue this session."""
        protocol = self.connection.protocol
        return SessionRecord(caller_of(self.identity), self.holder, protocol.protocol_version,
                             protocol.client_capabilities, protocol.client_info, protocol.initialized,
                             protocol.log_level)

    def renew(self, identity: Identity) -> None:
        """The same caller with another credential (a refreshed token, or one stepped up to more scopes): what
        decides from here on sees its scopes and claims, and a token exchange upstream its token, not the first
        one's, which may have expired."""
        self.identity = identity
        self.connection.identity = identity
        self.connection.session.identity = identity

    def ends_by_itself_at(self, idle_timeout: float) -> float | None:
        """When the idle expiry would end it: only while no stream or call holds it open."""
        if self.get_stream is not None or self.exchanges:
            return None
        return self.last_seen + idle_timeout

    @property
    def streams_resumable(self) -> bool:
        return (self._frontend.settings.resume_seconds > 0
                and self.connection.session.protocol_version >= RESUMABLE_SINCE)

    def resumable_exchange(self, request_id: Any, release: Callable[[], None]) -> Exchange:
        """An exchange for a client that accepts SSE, whose answer stream it may resume."""
        key = f"s{self._frontend.replica_tag}{next(self._stream_numbers)}"
        exchange = Exchange(request_id, accepts_sse=True, release=release, stream_key=key,
                            replay=self._frontend.settings.replay_events)
        self.resumable[key] = exchange
        return exchange

    def detach(self, exchange: Exchange) -> None:
        """The client's stream of this call dropped: keep the call for ``resume_seconds``, for the client to come
        back with ``Last-Event-ID``; past that, give it up (and cancel it if it still runs)."""
        if exchange.expiry is not None:
            exchange.expiry.cancel()
        exchange.expiry = asyncio.get_running_loop().call_later(
            self._frontend.settings.resume_seconds, self._expire, exchange)

    def resuming(self, exchange: Exchange) -> None:
        if exchange.expiry is not None:
            exchange.expiry.cancel()
            exchange.expiry = None

    def forget(self, exchange: Exchange) -> None:
        """Its answer has reached the client, or it was given up: nothing to resume any more."""
        self.resuming(exchange)
        if exchange.stream_key is not None and self.resumable.get(exchange.stream_key) is exchange:
            del self.resumable[exchange.stream_key]
            if exchange.pending:
                self._frontend.settled(self, exchange.stream_key)

    def _expire(self, exchange: Exchange) -> None:
        exchange.expiry = None
        if not exchange.answered:
            log.info("session %s…: request %r was not resumed within %g s of its stream dropping (http.resume_seconds);"
                     " it is cancelled", self.id[:8], exchange.request_id, self._frontend.settings.resume_seconds)
        self.abandon(exchange)

    def feed(self, frame: bytes, decoded: Any = None, exchange: Exchange | None = None) -> None:
        self.last_seen = time.monotonic()
        self._feeding = exchange
        try:
            self.connection.feed(frame, decoded)
        finally:
            self._feeding = None

    def route(self, frame: bytes, message: Outgoing) -> None:
        """Where one frame from the gateway goes: an answer to the POST that asked, progress to the POST whose
        request it is about, everything else to the GET stream (or its replay log until one is open)."""
        is_answer, answered_id, error_code = answer_to(message)
        if is_answer:
            exchange = self.exchanges.pop(answered_id, None) if answered_id is not None else self._feeding
            if exchange is not None:
                self._forget_progress(exchange)
                exchange.deliver(frame, True, error_code)
                return
        elif type(message) is Notification and message.method == "notifications/progress":  # type: ignore[union-attr]
            params = message.params  # type: ignore[union-attr]
            token = params.get("progressToken") if isinstance(params, dict) else None
            exchange = self.progress.get(token) if is_valid_id(token) else None
            if exchange is not None:
                exchange.deliver(frame, False)
                return
        if type(message) is Request and self._relayed is None and self._frontend.records is not None:
            # The client may answer on another replica: from now on this one listens for what it relays.
            self._relayed = asyncio.get_running_loop().create_task(self._take_relayed(self._frontend.records))
        if self.get_stream is None:
            # A client with no GET stream open still hears a question while its call waits, on that call's stream.
            streaming = [e for e in self.exchanges.values() if e.accepts_sse]
            if streaming:
                streaming[-1].deliver(frame, False)
                return
        if self._frontend.records is not None:
            self._share(frame)
            return
        seq = self.outbox.record(frame)
        if self.get_stream is not None:
            self.get_stream.push(sse_event(frame, str(seq)), seq)

    def _share(self, frame: bytes) -> None:
        """A message for the GET stream, which may be open on any replica: through the session's log in the store,
        in order (one writer per session)."""
        if self._shared_out is None:
            self._shared_out = asyncio.Queue()
            self._sharing = asyncio.get_running_loop().create_task(self._write_shared(self._shared_out))
        self._shared_out.put_nowait(frame)

    async def _write_shared(self, frames: "asyncio.Queue[bytes]") -> None:
        records = self._frontend.records
        assert records is not None
        while True:
            frame = await frames.get()
            try:
                await records.add_event(self.id, frame, self._frontend.settings.replay_events)
            except StateUnavailable as exc:
                log.warning("session %s…: a message for its GET stream could not be shared: %s", self.id[:8], exc)
                if self.get_stream is not None:  # a stream open here still gets it, without an id to resume at
                    self.get_stream.push(sse_event(frame))

    def _forget_progress(self, exchange: Exchange) -> None:
        for token in [t for t, e in self.progress.items() if e is exchange]:
            del self.progress[token]

    def abandon(self, exchange: Exchange) -> None:
        """The client went before its answer: cancel the request so that nothing runs on for nobody."""
        self.forget(exchange)
        if exchange.answered:
            return
        exchange.answered = True
        exchange.release()
        if self.exchanges.get(exchange.request_id) is exchange:
            del self.exchanges[exchange.request_id]
            self._forget_progress(exchange)
            self.feed(orjson.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {
                "requestId": exchange.request_id, "reason": "the client's HTTP connection closed"}}))

    def withdraw(self, request_id: Any) -> None:
        """The client cancelled one of its requests: its POST is answered with nothing, now."""
        exchange = self.exchanges.pop(request_id, None) if is_valid_id(request_id) else None  # true is no id
        if exchange is not None:
            self._forget_progress(exchange)
            exchange.withdraw()

    async def _take_relayed(self, records: "SessionRecords") -> None:
        try:
            async for frame in records.answers(self.id):
                try:
                    answered = orjson.loads(frame).get("id")
                except (orjson.JSONDecodeError, AttributeError):
                    continue
                if self.connection.protocol.expects(answered):
                    self.feed(frame)
        except StateUnavailable as exc:
            log.warning("session %s…: answers given on other replicas cannot reach this one: %s", self.id[:8], exc)
        finally:
            self._relayed = None  # the next request to the client listens again

    def _close_soon(self) -> None:
        asyncio.get_running_loop().create_task(self._frontend.end_session(self))

    async def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        for task in (self._relayed, self._sharing):
            if task is not None:
                task.cancel()
        for exchange in list(self.resumable.values()):
            self.resuming(exchange)
        self.resumable.clear()
        await self.connection.closed()
        ended = orjson.dumps
        for exchange in list(self.exchanges.values()):
            exchange.deliver(ended({"jsonrpc": "2.0", "id": exchange.request_id, "error": {
                "code": -32600, "message": "the session ended before this request was answered"}}), True, -32600)
        self.exchanges.clear()
        if self.get_stream is not None:
            self.get_stream.finish()


class SseSession:
    """A client of the old HTTP+SSE transport: one GET /sse stream carries everything the gateway sends."""

    def __init__(self, frontend: "HttpFrontend", identity: Identity, holder: Holder, stream: SseStream) -> None:
        self.id = secrets.token_urlsafe(24)
        self.identity = identity
        self.holder = holder
        self.stream = stream
        self.releases: dict[Any, Callable[[], None]] = {}
        self.connection = ClientConnection(frontend.gateway, self.route, identity=identity, close=stream.finish,
                                           over_network=True)

    def renew(self, identity: Identity) -> None:
        """As a Streamable HTTP session's: the same caller's newer credential decides from here on."""
        self.identity = identity
        self.connection.identity = identity
        self.connection.session.identity = identity

    def ends_by_itself_at(self, idle_timeout: float) -> float | None:
        return None  # it lasts as long as its stream

    def route(self, frame: bytes, message: Outgoing) -> None:
        if self.releases:
            is_answer, answered_id, _ = answer_to(message)
            if is_answer:
                release = self.releases.pop(answered_id, None)
                if release is not None:
                    release()
        self.stream.push(sse_event(frame, event="message"))
