"""A 2026-07-28 POST on the HTTP frontend: a request (or notification) that is a gateway connection of its own,
with no session; its envelope and the headers that mirror it checked, its scopes, its server's in-flight slot, and
its answer as JSON or an SSE stream."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import orjson

from bastion.frontends.connection import ClientConnection
from bastion.frontends.http.admission import Admission
from bastion.frontends.http.answers import STATUS_FOR_CODE, Answers
from bastion.frontends.http.exchanges import Exchange, Peeked, answer_to
from bastion.frontends.http.guards import accepts, modern_header_mismatch, param_header_mismatch
from bastion.frontends.http.input_relay import InputRelay
from bastion.frontends.http.quotas import Held, Holder, SessionQuotas
from bastion.frontends.http.wire import HttpError, Receive, Send, empty_response, json_response
from bastion.gateway.core import Gateway
from bastion.model import Identity
from bastion.protocol.jsonrpc import Outgoing
from bastion.protocol.versions import META_CLIENT_CAPABILITIES, META_PROTOCOL_VERSION

# A 2026-07-28 answer's HTTP status follows its error code (a JSON answer; a stream has begun with 200 already).
MODERN_STATUS_FOR_CODE = {-32700: 400, -32600: 400, -32602: 400, **STATUS_FOR_CODE, -32601: 404}
ENVELOPE_KEYS = (META_PROTOCOL_VERSION, META_CLIENT_CAPABILITIES)
# How long a retry relayed to the replica holding its call waits for that call's next answer: a bound for a replica
# that stops while it runs the retry (one that is gone already is known at once).
RETRY_WAIT = 900.0
REMOVED_IN_MODERN = frozenset({"initialize", "ping", "logging/setLevel", "resources/subscribe",
                               "resources/unsubscribe"})


@dataclass(eq=False, slots=True)
class OpenListen:
    """A ``subscriptions/listen`` stream, held against its caller's session quota while it is open: it is state the
    gateway keeps for as long as the client likes, as a session is."""

    id: str

    def ends_by_itself_at(self, idle_timeout: float) -> float | None:
        return None  # an open stream ends only when its client closes it


class ModernPosts:
    """The 2026-07-28 POSTs, each its own gateway connection while it runs."""

    def __init__(self, gateway: Gateway, admission: Admission, answers: Answers, quotas: SessionQuotas,
                 place_for: Callable[[Identity, str, Peeked, Held], Awaitable[Holder]]) -> None:
        self.gateway = gateway
        self.admission = admission
        self.answers = answers
        self.quotas = quotas
        self.place_for = place_for
        self.connections: set[ClientConnection] = set()
        # With replicas sharing sessions: retries of calls another replica holds go there (input_relay.py).
        self.relay: InputRelay | None = None

    def _param_header_mismatch(self, params: dict[str, Any], headers: dict[str, str]) -> str | None:
        name = params.get("name")
        entry = self.gateway.catalog.tool(name) if isinstance(name, str) else None
        if entry is None:
            return None  # the gateway answers an unknown tool
        return param_header_mismatch(entry.definition.get("inputSchema"), params.get("arguments"), headers)

    async def post(self, body: bytes, top: Peeked, message: dict[str, Any], headers: dict[str, str],
                   identity: Identity, peer: str, receive: Receive, send: Send) -> None:
        """``message`` is the body as ``read_message`` read it, which the connection takes as it is."""
        if top.kind == "notification":
            # It passes the chain like any client's notification (cancellation itself travels as a closed stream on
            # HTTP), then is acknowledged; a notification has no reply to carry a refusal.
            connection = ClientConnection(self.gateway, lambda frame, message: None, identity=identity, era="modern",
                                          over_network=True)
            try:
                connection.feed(body, message)
                await connection.notifications_passed()
            finally:
                await connection.closed()
            await empty_response(send, 202)
            return
        params = top.params if isinstance(top.params, dict) else {}
        meta = params.get("_meta")
        missing = [key for key in ENVELOPE_KEYS if key not in meta] if isinstance(meta, dict) else list(ENVELOPE_KEYS)
        if missing:  # the envelope first, then the headers that mirror it (the order of the SDK's checks)
            raise HttpError(400, -32602, f"params._meta lacks {', '.join(missing)}: every 2026-07-28 request carries "
                                         "its protocol version and client capabilities", top.id)
        mismatch = modern_header_mismatch(message, headers, meta.get(META_PROTOCOL_VERSION))
        if mismatch is None and top.method == "tools/call":
            mismatch = self._param_header_mismatch(params, headers)
        if mismatch is not None:
            self.admission.audit_refusal(identity, top, "admission", "http.header-mismatch", mismatch, -32020)
            raise HttpError(400, -32020, mismatch, top.id)
        if top.method in REMOVED_IN_MODERN:
            raise HttpError(404, -32601, f"{top.method} does not exist in 2026-07-28 (it has no handshake, sessions or "
                                         "session-wide log level)", top.id)
        self.admission.check_method_scopes(identity, top)
        if top.method == "subscriptions/listen":
            listen = OpenListen(secrets.token_hex(8))
            holder = await self.place_for(identity, peer, top, listen)
            try:
                await self._run(body, top, message, headers, identity, receive, send)
            finally:
                self.quotas.release(holder, listen)
                await self.quotas.give_back(holder)
            return
        if self.relay is not None and self._held_elsewhere(params.get("requestState")):
            answer = await self.relay.ask(identity, body, RETRY_WAIT)
            if answer is not None:
                error = orjson.loads(answer).get("error")
                code = error.get("code") if isinstance(error, dict) else None
                await json_response(send, MODERN_STATUS_FOR_CODE.get(code, 200) if isinstance(code, int) else 200,
                                    answer)
                return
        await self._run(body, top, message, headers, identity, receive, send)

    def _held_elsewhere(self, state: Any) -> bool:
        inputs = self.gateway.inputs
        return inputs.is_ours(state) and not inputs.holds(state)

    async def run_relayed(self, identity: Identity, body: bytes) -> bytes:
        """A retry another replica received, of a call held here: run as if it had come here; its answer."""
        final: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        def route(frame: bytes, message: Outgoing) -> None:
            if answer_to(message)[0] and not final.done():
                final.set_result(frame)

        connection = ClientConnection(self.gateway, route, identity=identity, close=lambda: None, over_network=True)
        self.connections.add(connection)
        try:
            connection.feed(body)
            return await final
        finally:
            self.connections.discard(connection)
            await connection.closed()

    async def _run(self, body: bytes, top: Peeked, message: dict[str, Any], headers: dict[str, str],
                   identity: Identity, receive: Receive, send: Send) -> None:
        release, busy = self.admission.gate_request(top, identity)
        if busy is not None:
            await json_response(send, 200, orjson.dumps({"jsonrpc": "2.0", "id": top.id, "error": busy}),
                        ((b"retry-after", str(self.admission.gate.retry_after).encode()),))
            return
        exchange = Exchange(top.id, accepts_sse=accepts(headers.get("accept"), "text/event-stream") and
                            bool(headers.get("accept")), release=release)

        def route(frame: bytes, message: Outgoing) -> None:
            final, _, error_code = answer_to(message)
            exchange.deliver(frame, final, error_code)

        connection = ClientConnection(self.gateway, route, identity=identity, close=lambda: None, over_network=True)
        self.connections.add(connection)
        try:
            connection.feed(body, message)
            await self.answers.answer(exchange, receive, send, (), exchange.release, MODERN_STATUS_FOR_CODE)
        finally:
            self.connections.discard(connection)
            await connection.closed()  # a closed stream cancels what the request still runs
