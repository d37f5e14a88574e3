"""The ASGI app behind ``bastion serve --http``: Streamable HTTP on ``/mcp`` for both protocol eras, and the old
HTTP+SSE transport on ``/sse`` + ``/messages``. Each handshake-era session is one gateway connection; each
2026-07-28 POST is a connection of its own for that request (``modern.py``). What a request passes first is
``admission.py``; the sessions are ``sessions.py``; how an exchange is answered, ``answers.py``; the wire's
reading and writing, ``wire.py``."""

from __future__ import annotations

import asyncio
from functools import partial
import logging
import os
import secrets
import time
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs

import orjson

from bastion.auth.build import HttpAuth, build_http_auth
from bastion.config import HttpConfig
from bastion.console.app import ConsoleApp, is_console_path
from bastion.console.data import ConsoleData
from bastion.console.live import LiveWindow
from bastion.console.login import CredentialLogin
from bastion.console.pages import console
from bastion.frontends.http.admission import Admission, nothing
from bastion.frontends.http.answers import RETRY_MS, Answers
from bastion.frontends.http.exchanges import Exchange, Peeked
from bastion.frontends.http.guards import accepts
from bastion.frontends.http.input_relay import InputRelay
from bastion.frontends.http.modern import ModernPosts
from bastion.frontends.http.quotas import Held, Holder, SessionQuotas, holder_of
from bastion.frontends.http.records import (CANCELLED_CHANNEL, ENDED_CHANNEL, MAX_RECORD_BYTES, KeyRing,
                                            SessionRecords)
from bastion.frontends.http.sessions import LegacySession, SseSession
from bastion.frontends.http.streams import SseStream, event_number, priming_event, sse_event
from bastion.frontends.http.wire import (
    Gone,
    HttpError,
    Receive,
    Scope,
    Send,
    empty_response,
    error_body,
    headers_of,
    json_response,
    lifespan,
    read_message,
)
from bastion.gateway.core import Gateway
from bastion.model import Identity
from bastion.observability.request_context import take_trace_context
from bastion.frontends.http.operations import HEALTH_PATHS, METRICS_PATH, answer_health, answer_metrics
from bastion.protocol.jsonrpc import is_valid_id
from bastion.protocol.versions import LEGACY_VERSIONS, is_modern, is_modern_first_message
from bastion.state import StateUnavailable

log = logging.getLogger("bastion.http")

MCP_PATHS = ("/mcp", "/mcp/")
# Where an upstream authorization server sends a person back after they authorized Bastion (task F's flow): it
# carries a one-time state instead of credentials, so it is not authenticated here.
OAUTH_CALLBACK_PATH = "/oauth/callback"
UNKNOWN_SESSION = "unknown or ended session (Mcp-Session-Id); start a new one with initialize"

__all__ = ["HttpError", "HttpFrontend", "LegacySession", "SseSession"]


class CurrentPolicy:
    """The gateway's policy as it is now, for the console: a reload swaps the policy, and the console's next
    decision is the new policy's (whether there is a policy at all changes only with a restart)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def authorize_admin(self, identity: Identity, action: str, operation: str = "") -> Any:
        return self._gateway.policy.authorize_admin(identity, action, operation)  # type: ignore[union-attr]

    def record_admin_action(self, identity: Identity, operation: str, target: str | None, decision: Any,
                            outcome: int = 0) -> None:
        self._gateway.policy.record_admin_action(identity, operation, target, decision, outcome)  # type: ignore[union-attr]


class HttpFrontend:
    def __init__(self, gateway: Gateway, settings: HttpConfig, *, bound_to_loopback: bool,
                 auth: HttpAuth | None = None, callback: Callable[[Scope, Receive, Send], Awaitable[None]] | None
                 = None, session_keys: KeyRing | None = None) -> None:
        self.gateway = gateway
        # Tracing or JSON logs: a POST's trace context headers go with the messages it carries.
        self._observed = gateway.observer is not None
        self.settings = settings
        # Who is calling: the auth table's methods, or http.identity_header, or everyone the configured identity.
        self.auth = auth if auth is not None else build_http_auth(
            None, identity_header=settings.identity_header, identity=gateway.identity)
        self._callback = callback
        self.admission = Admission(gateway, settings, self.auth, bound_to_loopback=bound_to_loopback)
        self.answers = Answers(settings)
        self._metadata = orjson.dumps(self.auth.metadata) if self.auth.metadata is not None else None
        self.sessions: dict[str, LegacySession] = {}
        self.sse_sessions: dict[str, SseSession] = {}
        shared = gateway.state if gateway.state.shared else None
        # Both kinds, by holder: the gateway's bound and each caller's quota (counted in the store replicas share).
        self.quotas = SessionQuotas(settings, shared)
        # Sessions any replica continues: only with a store other replicas see, and keys to seal the records.
        self.records = (SessionRecords(shared, session_keys, settings.session_idle_timeout)
                        if shared is not None and session_keys is not None else None)
        if shared is not None and session_keys is None:
            log.warning("the state store is shared, but http.session_key_files is empty: a handshake-era session "
                        "continues only on the replica that made it (a load balancer must keep each client on one)")
        self._ended_elsewhere: asyncio.Task[None] | None = None
        self._cancelled_elsewhere: asyncio.Task[None] | None = None
        self._relaying: asyncio.Task[None] | None = None  # retries of 2026-07-28 calls held here, from other replicas
        # Answer streams' keys begin with it where replicas share sessions: a key tells which replica ran the call.
        self.replica_tag = secrets.token_hex(4) if self.records is not None else ""
        self._settling: set[asyncio.Task[None]] = set()
        self.modern = ModernPosts(gateway, self.admission, self.answers, self.quotas, self._place_for)
        self._reaper: asyncio.Task[None] | None = None
        # The web console at /admin: the same authenticator logs a browser in, Cedar decides, the policy audits.
        source = gateway.config.source
        self.console = ConsoleApp(console(), CredentialLogin(self.auth.authenticator),
                                  CurrentPolicy(gateway) if gateway.policy is not None else None,
                                  ConsoleData(gateway.config, only_pid=os.getpid(),
                                              pins_of=str(source) if source is not None else "",
                                              live=_live_window(gateway),
                                              reload_here=partial(gateway.reload, cause="the console")))
        if gateway.metrics is not None:
            gateway.metrics.sessions["streamable_http"] = lambda: len(self.sessions)
            gateway.metrics.sessions["sse"] = lambda: len(self.sse_sessions)

    # ------------------------------------------------------------------------------------------ lifetime
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._reaper = loop.create_task(self._reap_idle_sessions())
        if self.records is not None:
            self._ended_elsewhere = loop.create_task(self._listen(
                self.records, ENDED_CHANNEL, self._ended_elsewhere_heard,
                "not told of sessions ended on other replicas (a copy here lasts until its next refresh finds its "
                "record gone)"))
            self._cancelled_elsewhere = loop.create_task(self._listen(
                self.records, CANCELLED_CHANNEL, self._cancelled_elsewhere_heard,
                "not told of cancellations sent to other replicas"))
            relay = self.modern.relay = InputRelay(self.records.store, self.records.keys)
            self._relaying = loop.create_task(relay.serve(self.gateway.inputs.holds, self.modern.run_relayed))

    async def stop(self) -> None:
        """End every stream and session, cancelling what they have in flight. Sessions other replicas may continue
        are only let go here (their records stay)."""
        for task in (self._reaper, self._ended_elsewhere, self._cancelled_elsewhere, self._relaying):
            if task is not None:
                task.cancel()
        for stream in list(self.answers.streams):
            stream.finish()
        await asyncio.gather(*(self.end_session(s, everywhere=self.records is None)
                               for s in list(self.sessions.values())),
                             *(s.connection.closed() for s in list(self.sse_sessions.values())),
                             return_exceptions=True)
        await self.auth.close()

    async def end_session(self, session: LegacySession, *, everywhere: bool = True) -> None:
        """End ``session`` here and, ``everywhere``, on every replica (its record deleted, its quota place given
        back once); otherwise only this replica's copy goes, and another replica may continue it."""
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]
            self.quotas.release(session.holder, session)
            if everywhere:
                try:
                    ended = True if self.records is None else await self.records.end(session.id)
                    if ended:
                        await self.quotas.give_back(session.holder)
                except StateUnavailable as exc:  # its record and quota place expire by themselves
                    log.warning("session %s… ended here, but the shared state could not be told: %s",
                                session.id[:8], exc)
        await session.close()

    def settled(self, session: LegacySession, stream_key: str) -> None:
        """A call recorded as pending was answered (or given up): its record goes, in the background."""
        if self.records is None:
            return
        task = asyncio.get_running_loop().create_task(self._forget_pending(self.records, session.id, stream_key))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    @staticmethod
    async def _forget_pending(records: SessionRecords, session_id: str, stream_key: str) -> None:
        try:
            await records.answered(session_id, stream_key)
        except StateUnavailable as exc:  # it expires with the session's idle timeout
            log.warning("session %s…: could not record that a call was answered: %s", session_id[:8], exc)

    @staticmethod
    async def _listen(records: SessionRecords, channel: str, heard: Callable[[bytes], Awaitable[None]],
                      missed: str) -> None:
        """What other replicas tell every replica on ``channel``, each message to ``heard``, for as long as the
        frontend runs: listened to again when the subscription ends or the store comes back."""
        while True:
            try:
                subscription = await records.store.subscribe(channel)
                try:
                    async for message in subscription:
                        await heard(message)
                finally:
                    await subscription.aclose()
            except StateUnavailable as exc:
                log.warning("%s: %s", missed, exc)
            await asyncio.sleep(1.0)

    async def _ended_elsewhere_heard(self, message: bytes) -> None:
        """A session DELETEd on another replica: this replica's copy goes too (what it still runs is cancelled)."""
        session = self.sessions.get(message.decode("ascii", "replace"))
        if session is not None:
            log.info("session %s… was ended on another replica", session.id[:8])
            await self.end_session(session, everywhere=False)

    async def _cancelled_elsewhere_heard(self, message: bytes) -> None:
        """A client's notifications/cancelled that reached another replica: cancelled here when this replica runs
        the request (the replica that took it checked the session was the caller's)."""
        try:
            heard = orjson.loads(message)
            session = self.sessions.get(heard["session"])
            frame = heard["notification"].encode()
            request_id = orjson.loads(frame)["params"]["requestId"]
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, UnicodeError):
            return
        if session is not None and is_valid_id(request_id) and request_id in session.exchanges:
            session.feed(frame)
            session.withdraw(request_id)

    def _holder(self, identity: Identity, peer: str) -> Holder:
        return holder_of(identity, peer, authenticated=self.auth.required, settings=self.settings)

    async def _place_for(self, identity: Identity, peer: str, top: Peeked, held: Held) -> Holder:
        """Count ``held``, a new session (or listen stream) opened by ``top``, against its holder's quota and the
        gateway's bound, and return the holder; a refusal over the caller's own quota is audited."""
        holder = self._holder(identity, peer)
        try:
            await self.quotas.admit(holder, held, top.id)
        except HttpError as refusal:
            if refusal.status == 429:
                self.admission.audit_refusal(identity, top, "admission", holder.setting, refusal.message,
                                             refusal.code)
            raise
        return holder

    async def _reap_idle_sessions(self) -> None:
        timeout = self.settings.session_idle_timeout
        while True:
            await asyncio.sleep(min(60.0, timeout / 4))
            now = time.monotonic()
            for session in list(self.sessions.values()):
                ends = session.ends_by_itself_at(timeout)
                if ends is not None and now > ends:
                    if await self._used_elsewhere(session):
                        await self.end_session(session, everywhere=False)
                        continue
                    log.info("session %s… ended after %.0f s without requests", session.id[:8], timeout)
                    await self.end_session(session)

    async def _used_elsewhere(self, session: LegacySession) -> bool:
        """Whether another replica has kept the record of a session quiet here alive (or cannot tell: then only
        this copy goes, and the record expires by itself if nobody uses it)."""
        if self.records is None:
            return False
        try:
            return await self.records.exists(session.id)
        except StateUnavailable:
            return True

    # ------------------------------------------------------------------------------------------ ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = headers_of(scope)
        try:
            path, method = scope["path"], scope["method"]
            if path in HEALTH_PATHS:
                # For probes, whatever Host they send (a kubelet's is the pod's address): unauthenticated, they
                # name nothing a page could use.
                await answer_health(self.gateway, path, method, send)
                return
            peer = self.admission.admit(scope, headers)
            if path in MCP_PATHS:
                identity = await self.admission.authenticate(scope, headers, "mcp", peer)
                if method == "POST":
                    if self._observed:
                        take_trace_context(headers)
                    await self._post(scope, headers, identity, peer, receive, send)
                elif method == "GET":
                    await self._get(headers, identity, receive, send)
                elif method == "DELETE":
                    await self._delete(headers, identity, send)
                else:
                    raise HttpError(405, -32600, f"{method} is not used on /mcp (POST, GET or DELETE)",
                                    headers=((b"allow", b"GET, POST, DELETE"),))
            elif path == "/sse" and method == "GET":
                await self._sse_open(headers, await self.admission.authenticate(scope, headers, "sse", peer), peer,
                                     receive, send)
            elif path == "/messages" and method == "POST":
                if self._observed:
                    take_trace_context(headers)
                await self._sse_post(scope, headers, await self.admission.authenticate(scope, headers, "messages", peer),
                                     receive, send)
            elif path == METRICS_PATH and self.gateway.metrics is not None:
                await self._metrics(scope, headers, peer, method, send)
            elif path in self.auth.metadata_paths and self._metadata is not None:
                await self._resource_metadata(method, send)
            elif path == OAUTH_CALLBACK_PATH and self._callback is not None:
                await self._callback(scope, receive, send)
            elif is_console_path(path):
                await self.console(scope, receive, send, headers=headers, peer=peer,
                                   site=self.admission.site(scope, headers))
            else:
                raise HttpError(404, -32600, f"nothing at {path}; the MCP endpoint is /mcp (or /sse for HTTP+SSE)")
        except HttpError as exc:
            await json_response(send, exc.status, error_body(exc.request_id, exc.code, exc.message, exc.data),
                                exc.headers)
        except Gone:
            pass  # the client left while sending its request: nobody to answer
        except StateUnavailable as exc:
            log.warning("refused %s %s: %s", scope.get("method"), scope.get("path"), exc)
            try:
                await json_response(send, 503, error_body(None, -32000, f"the gateway's shared state cannot be "
                                                                        f"reached ({exc}); retry later"),
                                    ((b"retry-after", str(self.settings.retry_after_seconds).encode()),))
            except RuntimeError:
                pass  # its response had begun (a stream)
        except Exception:  # noqa: BLE001 - a fault of Bastion's is a JSON-RPC error, never the server's plain 500
            log.exception("internal error while answering %s %s", scope.get("method"), scope.get("path"))
            try:
                await json_response(send, 500, error_body(None, -32603, "internal error in Bastion"))
            except RuntimeError:
                pass  # its response had begun (a stream): the server ends the connection, as it must


    async def _metrics(self, scope: Scope, headers: dict[str, str], peer: str, method: str, send: Send) -> None:
        """``/metrics`` for identities the policy lets ``view_metrics``; a refusal is audited (a scrape allowed is
        not: one every few seconds would bury the trail)."""
        identity = await self.admission.authenticate(scope, headers, "metrics", peer)
        policy = self.gateway.policy
        if policy is None:
            raise HttpError(403, -32600, "the policy is off, so nobody may read /metrics here: configure a policy, "
                                         "or [metrics] listen for a listener of their own")
        decision = policy.authorize_admin(identity, "view_metrics")
        if not decision.allowed:
            policy.record_admin_action(identity, "view_metrics", METRICS_PATH, decision, 403)
            log.info("refused /metrics to %s: %s", identity.describe(), decision.reason or decision.rule)
            raise HttpError(403, -32600, f"{identity.name} may not read the metrics (Cedar action view_metrics)")
        await answer_metrics(self.gateway, method, send)

    async def _resource_metadata(self, method: str, send: Send) -> None:
        """The Protected Resource Metadata (RFC 9728): public, and readable from a browser-based client."""
        if method not in ("GET", "HEAD"):
            raise HttpError(405, -32600, f"{method} is not used on the resource metadata (GET)",
                            headers=((b"allow", b"GET"),))
        assert self._metadata is not None
        await json_response(send, 200, self._metadata, ((b"access-control-allow-origin", b"*"),), cache="public, max-age=300")


    # ------------------------------------------------------------------------------ Streamable HTTP
    async def _post(self, scope: Scope, headers: dict[str, str], identity: Identity, peer: str, receive: Receive,
                    send: Send) -> None:
        accept = headers.get("accept")
        if not (accepts(accept, "application/json") or accepts(accept, "text/event-stream")):
            raise HttpError(406, -32600, "the Accept header must admit application/json or text/event-stream")
        body, top, message = await read_message(headers, receive, self.settings.max_body_bytes,
                                                self.settings.body_timeout, self.gateway.config.max_message_bytes)
        session_id = headers.get("mcp-session-id")
        if session_id is not None:
            session = await self._session(session_id, identity, headers)
            self.admission.check_method_scopes(identity, top)
            await self._legacy_post(session, body, message, top, headers, receive, send)
        elif is_modern(headers.get("mcp-protocol-version")) and top.kind in ("request", "notification"):
            # The header decides first, as on a server of both eras: a 2026-07-28 initialize is a removed method.
            await self.modern.post(body, top, message, headers, identity, peer, receive, send)
        elif top.method == "initialize":
            self.admission.check_method_scopes(identity, top)
            session = LegacySession(self, identity, self._holder(identity, peer))
            try:
                await self._place_for(identity, peer, top, session)
            except BaseException:
                await session.close()
                raise
            self.sessions[session.id] = session
            await self._legacy_post(session, body, message, top, headers, receive, send)
        elif top.kind in ("request", "notification") and is_modern_first_message(
                top.method or "", top.params if isinstance(top.params, dict) else None):
            await self.modern.post(body, top, message, headers, identity, peer, receive, send)
        else:
            raise HttpError(400, -32600, "no Mcp-Session-Id header: start a session with initialize, or send a "
                                         "2026-07-28 request (params._meta names its protocol version)", top.id)

    async def _session(self, session_id: str, identity: Identity, headers: dict[str, str]) -> LegacySession:
        session = self.sessions.get(session_id)
        if session is None and self.records is not None:
            session = await self._take_up(self.records, session_id, identity)
        if session is None:
            raise HttpError(404, -32600, UNKNOWN_SESSION)
        _claim(session, session_id, identity)
        version = headers.get("mcp-protocol-version")
        if version is not None and version not in LEGACY_VERSIONS:
            raise HttpError(400, -32600, f"MCP-Protocol-Version {version!r} is not a version of a session "
                                         f"({', '.join(LEGACY_VERSIONS)})")
        session.last_seen = time.monotonic()
        if self.records is not None and session.shared and not session.connection.protocol.initialized:
            # Its handshake may have ended on another replica (round robin sends initialize to one and
            # notifications/initialized to the next): the record says; read only until this copy knows.
            await self._follow(self.records, session)
        if self.records is not None and session.last_seen - session.saved_at > self.records.refresh_seconds:
            await self._refresh(self.records, session)
        return session

    async def _follow(self, records: SessionRecords, session: LegacySession) -> None:
        """Take what other replicas wrote to the session's record since this copy last wrote or read it (the
        client's notifications/initialized, its log level), unless this copy changed since (then its own
        change is the newer and is written with the next save)."""
        try:
            record = await records.load(session.id)
        except StateUnavailable as exc:
            log.warning("session %s…: its record could not be read: %s", session.id[:8], exc)
            return
        if record is None or record == session.saved or session.record() != session.saved:
            return
        session.connection.protocol.follow(initialized=record.initialized, log_level=record.log_level)
        session.saved = record

    async def _take_up(self, records: SessionRecords, session_id: str, identity: Identity) -> LegacySession | None:
        """A session another replica made (or this one let go of), from its record: None when there is none, or
        when another caller presents it (told apart from an unknown session by nothing)."""
        record = await records.load(session_id)
        if record is None or not record.presented_by(identity):
            if record is not None:
                log.info("refused a request on session %s…: it belongs to another caller", session_id[:8])
            return None
        taken = self.sessions.get(session_id)  # another request took it up while this one read the record
        if taken is not None:
            return taken
        session = LegacySession(self, identity, record.holder, (session_id, record))
        self.sessions[session_id] = session
        self.quotas.take(record.holder, session)  # this replica's bound; the holder's quota counted it already
        log.info("session %s… continues on this replica (made on another)", session_id[:8])
        return session

    async def _refresh(self, records: SessionRecords, session: LegacySession) -> None:
        """Keep a session in use alive in the store; one whose record is gone was ended on another replica (or
        expired there): this copy ends too, and the request is answered as for an unknown session."""
        session.saved_at = time.monotonic()
        if not session.shared:
            return  # too large to share: nothing in the store to keep alive, or to find gone
        try:
            if not await records.exists(session.id):
                await self.end_session(session, everywhere=False)
                raise HttpError(404, -32600, UNKNOWN_SESSION)
            await self._follow(records, session)  # a log level set through another replica is not written back
            await self._save(records, session)
            await self.quotas.refresh(session.holder)
        except StateUnavailable as exc:
            # This replica's copy goes on serving its client; the next refresh tries again.
            log.warning("session %s…: its record could not be refreshed: %s", session.id[:8], exc)

    async def _save(self, records: SessionRecords, session: LegacySession) -> None:
        record = session.record()
        session.shared = await records.save(session.id, record)
        if not session.shared and session.saved != record:
            log.warning("session %s…: its client's info and capabilities make a record over %d bytes, so only this "
                        "replica continues it", session.id[:8], MAX_RECORD_BYTES)
        session.saved, session.saved_at = record, time.monotonic()

    def _answers_another_replica(self, session: LegacySession, answered: Any) -> bool:
        """Whether a client's answer is to a request of Bastion's that another replica sent (its id is Bastion's,
        not this replica's)."""
        protocol = session.connection.protocol
        return (self.records is not None and isinstance(answered, str) and answered.startswith("bastion-")
                and not answered.startswith(protocol.outgoing_prefix) and not protocol.expects(answered))

    @staticmethod
    async def _relay_cancel(records: SessionRecords, session: LegacySession, body: bytes) -> None:
        try:
            await records.relay_cancel(session.id, body)
        except StateUnavailable as exc:
            log.warning("session %s…: a cancellation of a request another replica runs could not be passed on: %s",
                        session.id[:8], exc)

    async def _save_if_changed(self, records: SessionRecords, session: LegacySession) -> None:
        """Write the record when what another replica needs changed (the handshake, initialized, the log level)."""
        if not session.closing and session.record() != session.saved:
            try:
                await self._save(records, session)
            except StateUnavailable as exc:
                log.warning("session %s…: its record could not be written, so only this replica continues it for "
                            "now: %s", session.id[:8], exc)


    async def _legacy_post(self, session: LegacySession, body: bytes, decoded: dict[str, Any], top: Peeked,
                           headers: dict[str, str], receive: Receive, send: Send) -> None:
        session_header = ((b"mcp-session-id", session.id.encode()),)
        if top.kind == "response" and self._answers_another_replica(session, top.id):
            assert self.records is not None
            await self.records.relay_answer(session.id, body)
            await empty_response(send, 202, session_header)
            return
        if top.kind != "request":
            session.feed(body, decoded=decoded)
            if self.records is not None:
                await self._save_if_changed(self.records, session)
            if top.method == "notifications/cancelled" and isinstance(top.params, dict):
                cancelled = top.params.get("requestId")
                if self.records is not None and is_valid_id(cancelled) and cancelled not in session.exchanges:
                    await self._relay_cancel(self.records, session, body)
                session.withdraw(cancelled)
            await empty_response(send, 202, session_header)
            return
        if top.id in session.exchanges:
            raise HttpError(400, -32600, f"request id {top.id!r} is already in flight in this session", top.id)
        release, busy = self.admission.gate_request(top, session.identity)
        if busy is not None:
            await json_response(send, 200, orjson.dumps({"jsonrpc": "2.0", "id": top.id, "error": busy}),
                        (*session_header, (b"retry-after", str(self.admission.gate.retry_after).encode())))
            return
        accepts_sse = accepts(headers.get("accept"), "text/event-stream") and bool(headers.get("accept"))
        if accepts_sse and session.streams_resumable:
            exchange = session.resumable_exchange(top.id, release)
            detach: Callable[[], None] | None = lambda: session.detach(exchange)
        else:
            exchange, detach = Exchange(top.id, accepts_sse=accepts_sse, release=release), None
        session.exchanges[top.id] = exchange
        meta = top.params.get("_meta") if isinstance(top.params, dict) else None
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if is_valid_id(token):  # a token is a string or an integer; an object would not hash, and true is 1
            session.progress[token] = exchange
        try:
            session.feed(body, decoded, exchange)
            if self.records is not None:  # with the memory store, not even a coroutine more per request
                await self._save_if_changed(self.records, session)
        except BaseException:
            session.abandon(exchange)  # a request that failed to start holds neither its id nor its server's slot
            raise
        await self.answers.answer(exchange, receive, send, session_header, lambda: session.abandon(exchange),
                                  detach=detach, forget=lambda: session.forget(exchange),
                                  streaming=self._pending(session, exchange) if self.records is not None else None)

    def _pending(self, session: LegacySession, exchange: Exchange) -> Callable[[], Awaitable[None]]:
        async def record() -> None:
            assert self.records is not None and exchange.stream_key is not None
            try:
                await self.records.pending(session.id, exchange.stream_key, exchange.request_id)
                exchange.pending = True
            except StateUnavailable as exc:
                log.warning("session %s…: a call's stream is not recorded for other replicas: %s", session.id[:8], exc)
        return record


    async def _get(self, headers: dict[str, str], identity: Identity, receive: Receive, send: Send) -> None:
        session_id = headers.get("mcp-session-id")
        if session_id is None:
            if is_modern(headers.get("mcp-protocol-version")):
                raise HttpError(405, -32600, "2026-07-28 has no GET stream; use subscriptions/listen",
                                headers=((b"allow", b"POST"),))
            raise HttpError(400, -32600, "GET /mcp opens a session's stream: it needs the Mcp-Session-Id header")
        if not accepts(headers.get("accept"), "text/event-stream"):
            raise HttpError(406, -32600, "the GET stream is text/event-stream; the Accept header refuses it")
        session = await self._session(session_id, identity, headers)
        resume = headers.get("last-event-id", "")
        if "." in resume:  # the id of a call's answer stream (the GET stream's ids are plain numbers)
            key, _, after = resume.partition(".")
            if key not in session.resumable and self.records is not None and event_number(after) is not None:
                lost, request_id = await self.records.lost(session.id, key)
                if lost:
                    log.info("session %s…: request %r's stream was resumed here; the replica running it stopped",
                             session.id[:8], request_id)
                    await self.answers.answer_lost(session, key, request_id, event_number(after) or 0, send)
                    return
            await self.answers.resume(session, resume, receive, send)
            return
        if session.get_stream is not None:
            session.get_stream.finish()  # a client that reconnects may not have been seen to leave; the new one wins
        if self.records is not None:
            await self._shared_get_stream(self.records, session, event_number(resume), receive, send)
            return
        start = event_number(resume)
        if start is None:
            start = session.outbox.delivered
        stream = SseStream(send, limit=self.settings.stream_buffer_messages,
                           byte_limit=self.settings.stream_buffer_bytes, heartbeat=self.settings.heartbeat_seconds,
                           headers=((b"mcp-session-id", session.id.encode()),), on_sent=session.outbox.sent,
                           notice=self.answers.overflow_notice("messages after it were dropped; open the stream again"))
        if session.streams_resumable:
            stream.push(priming_event(str(start), RETRY_MS))
        for seq, frame in session.outbox.after(start):
            stream.push(sse_event(frame, str(seq)), seq)
        session.get_stream = stream
        try:
            await self.answers.stream_until_gone(stream, receive)
        finally:
            if session.get_stream is stream:
                session.get_stream = None
            session.last_seen = time.monotonic()

    async def _shared_get_stream(self, records: SessionRecords, session: LegacySession, start: int | None,
                                 receive: Receive, send: Send) -> None:
        """The GET stream of a session replicas share: its messages come from the session's log in the store, where
        every replica puts them, numbered there; ``Last-Event-ID`` resumes after that number on any replica, and
        without one the stream begins with what comes next."""
        if start is None:
            start = await records.newest_event(session.id)
        stream = SseStream(send, limit=self.settings.stream_buffer_messages,
                           byte_limit=self.settings.stream_buffer_bytes, heartbeat=self.settings.heartbeat_seconds,
                           headers=((b"mcp-session-id", session.id.encode()),),
                           notice=self.answers.overflow_notice("messages after it were dropped; open the stream again"))
        if session.streams_resumable:
            stream.push(priming_event(str(start), RETRY_MS))
        session.get_stream = stream
        feeder = asyncio.ensure_future(self._feed_from_store(records, session, stream, start))
        try:
            await self.answers.stream_until_gone(stream, receive)
        finally:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)
            if session.get_stream is stream:
                session.get_stream = None
            session.last_seen = time.monotonic()

    @staticmethod
    async def _feed_from_store(records: SessionRecords, session: LegacySession, stream: SseStream,
                               after: int) -> None:
        try:
            async for number, frame in records.events(session.id, after):
                if not stream.push(sse_event(frame, str(number)), number):
                    return
        except StateUnavailable as exc:
            log.warning("session %s…: its GET stream ends, the shared state cannot be reached: %s",
                        session.id[:8], exc)
        stream.finish()  # the client reconnects with Last-Event-ID, on whichever replica

    async def _delete(self, headers: dict[str, str], identity: Identity, send: Send) -> None:
        session_id = headers.get("mcp-session-id")
        if session_id is None:
            raise HttpError(400, -32600, "DELETE /mcp ends a session: it needs the Mcp-Session-Id header")
        session = await self._session(session_id, identity, headers)
        await self.end_session(session)
        await empty_response(send, 200)

    # ------------------------------------------------------------------------------ HTTP+SSE (2024-11-05)
    async def _sse_open(self, headers: dict[str, str], identity: Identity, peer: str, receive: Receive,
                        send: Send) -> None:
        if not accepts(headers.get("accept"), "text/event-stream"):
            raise HttpError(406, -32600, "GET /sse is text/event-stream; the Accept header refuses it")
        holder = self._holder(identity, peer)
        stream = SseStream(send, limit=self.settings.stream_buffer_messages,
                           byte_limit=self.settings.stream_buffer_bytes, heartbeat=self.settings.heartbeat_seconds,
                           notice=self.answers.overflow_notice("this session ends; connect again", event="message"))
        session = SseSession(self, identity, holder, stream)
        try:
            await self.quotas.admit(holder, session)
        except BaseException:
            await session.connection.closed()
            raise
        self.sse_sessions[session.id] = session
        stream.push(sse_event(f"/messages?session_id={session.id}".encode(), event="endpoint"))
        try:
            await self.answers.stream_until_gone(stream, receive)
        finally:
            self.sse_sessions.pop(session.id, None)
            self.quotas.release(holder, session)
            await self.quotas.give_back(holder)
            log.debug("HTTP+SSE session %s… ended: its stream closed", session.id[:8])
            for release in session.releases.values():
                release()
            await session.connection.closed()

    async def _sse_post(self, scope: Scope, headers: dict[str, str], identity: Identity, receive: Receive,
                        send: Send) -> None:
        session_id = (parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_id") or [None])[0]
        if session_id is None:
            raise HttpError(400, -32600, "POST /messages needs the session_id the endpoint event named")
        session = self.sse_sessions.get(session_id)
        if session is None:
            raise HttpError(404, -32600, "unknown or ended session_id; open a new stream with GET /sse")
        _claim(session, session_id, identity)
        body, top, decoded = await read_message(headers, receive, self.settings.max_body_bytes,
                                                self.settings.body_timeout, self.gateway.config.max_message_bytes)
        self.admission.check_method_scopes(identity, top)
        if top.kind == "request":
            release, busy = self.admission.gate_request(top, identity)
            if busy is not None:
                session.stream.push(sse_event(orjson.dumps({"jsonrpc": "2.0", "id": top.id, "error": busy}),
                                              event="message"))
                await empty_response(send, 202)
                return
            if release is not nothing:
                session.releases[top.id] = release
        session.connection.feed(body, decoded)
        await empty_response(send, 202)


def _claim(session: LegacySession | SseSession, session_id: str, identity: Identity) -> None:
    """A request on ``session`` must come from the caller that opened it; the same caller with another credential (a
    refreshed or stepped-up token) is who the session acts for from here on."""
    if identity != session.identity:
        log.info("refused a request on session %s…: it belongs to another caller", session_id[:8])
        raise HttpError(403, -32600, "this session belongs to another caller")
    if identity is not session.identity:
        session.renew(identity)


def _live_window(gateway: Gateway) -> LiveWindow | None:
    """The console's live figures over the gateway's metrics (none when ``[metrics] enabled = false``)."""
    metrics = gateway.metrics
    if metrics is None:
        return None
    def inside() -> int:  # calls at their servers, and those still on their way (approval, a server's start)
        at_servers, on_the_way = metrics.calls_now()
        return sum(at_servers.values()) + sum(on_the_way.values())

    return LiveWindow(metrics.totals, inside)
