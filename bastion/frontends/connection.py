"""One client connection to Bastion, whatever the transport: a thin driver of the sans-I/O server session
(``bastion.protocol.server_session``). The session decides what the client's messages mean; this driver runs
what takes time (waiting for servers, the gateway's pipeline) and sends what the session says to send. The
transport feeds it frames and gives it a way to send them; each frame is handed over with the message it is, so
that a transport routing frames (the HTTP frontend: which POST an answer ends, which a progress message is about)
never reads one again."""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any, Awaitable, Callable, Coroutine, Mapping

from bastion.gateway.core import SERVER_INFO, Gateway
from bastion.gateway.pipeline import InOrder
from bastion.model import NOTIFICATION, TO_SERVER, GatewayError, GatewayRequest, Identity, Session
from bastion.protocol import jsonrpc
from bastion.protocol.jsonrpc import (
    ErrorResponse,
    Outgoing,
    RawResponse,
    Request,
    Response,
    raw_request_of,
    read_frame,
)
from bastion.protocol.lifecycle import State
from bastion.protocol.server_session import (
    Answered,
    Cancel,
    CloseConnection,
    Discover,
    Event,
    Initialize,
    Invalid,
    Listen,
    Notified,
    RootsChanged,
    Send,
    Serve,
    ServerSession,
    UnknownAnswer,
)

log = logging.getLogger("bastion.frontend")


class ClientConnection:
    """Implements ``ClientChannel`` for interceptors that need to ask the client something."""

    def __init__(
        self,
        gateway: Gateway,
        send: Callable[[bytes, Outgoing], None],
        *,
        identity: Identity,
        close: Callable[[], None] = lambda: None,
        drain: Callable[[], Awaitable[None]] | None = None,
        era: str | None = None,
        over_network: bool = False,
    ) -> None:
        self.id = gateway.connection_id()
        self.gateway = gateway
        self.identity = identity
        self._over_network = over_network
        self.protocol = ServerSession(server_info=SERVER_INFO, max_message_bytes=gateway.config.max_message_bytes,
                                      era=era)
        self._send_bytes = send
        metrics = gateway.metrics
        if metrics is not None:  # the bytes each way, counted where they cross; nothing at all with metrics off
            transport = "http" if over_network else "stdio"
            self._send_bytes = metrics.counting_sent(transport, send)
            self.feed = metrics.counting_received(transport, self.feed)  # type: ignore[method-assign]
        self._close_transport = close
        self._drain = drain
        self._session: Session | None = None  # legacy: one for the connection, from its initialize
        self._running: dict[Any, asyncio.Task[None]] = {}  # requests in flight, by the client's id
        self._outgoing: dict[str, asyncio.Future[Response | ErrorResponse]] = {}
        # Requests a client pipelines behind its initialize wait for the handshake (and the servers it waits for).
        self._handshake = asyncio.Event()
        # Once a handshake-era session is established: a tools/call's arguments may stay the bytes the client sent.
        self._takes_raw_calls = False
        # A modern client's first wait for the servers; False once its first request found nothing to wait for.
        self._servers_waited: asyncio.Future[None] | bool | None = None
        self._taking_up: asyncio.Task[None] | None = None  # a session restored from a replica's record, until ready
        # The client's notifications an interceptor looks at pass the chain one after another, in the client's order.
        self._notices = InOrder("the client")
        self._max_bytes = gateway.config.max_message_bytes
        self._loop = asyncio.get_running_loop()
        gateway.attach(self)

    @property
    def era(self) -> str | None:
        return self.protocol.era

    @property
    def log_level(self) -> str | None:
        """The level a handshake-era client set with ``logging/setLevel``; None until it sets one (it gets every
        level until then)."""
        return self.protocol.log_level

    @property
    def session(self) -> Session:
        """The handshake-era session (what its interceptors remember lives there), or one for a connection
        without a handshake."""
        return self._session or self._anonymous_session()

    # ------------------------------------------------------------------------------------------ input
    def feed(self, frame: bytes, decoded: Any = None) -> None:
        """One frame from the client; ``decoded``, when the transport has read it already (an HTTP body), is what
        ``read_frame`` made of it, which the session then takes instead of reading the frame again. Whatever the
        transport, a frame has the one verdict ``read_frame`` gives before anything else reads it."""
        # The gateway's own verdict read each time: a reload may put a reader of the params on a call's route.
        if self._takes_raw_calls and self.gateway.takes_raw_params and self.protocol.lifecycle.state is State.ACTIVE:
            if decoded is None:
                decoded = read_frame(frame, self._max_bytes)
            if type(decoded) is dict and decoded.get("method") == "tools/call" and self._raw_call(frame, decoded):
                return
        self._act(self.protocol.receive_frame(frame, decoded))

    def frame_too_large(self, size: int) -> None:
        self._act(self.protocol.frame_too_large(size))

    def _act(self, events: list[Event]) -> None:
        for event in events:
            kind = type(event)
            if kind is Serve:
                self._on_serve(event)  # type: ignore[arg-type]
            elif kind is Send:
                self._send(event.message)  # type: ignore[union-attr]
            elif kind is Initialize:
                self._run(self._initialize(event), event.request.id)  # type: ignore[union-attr]
            elif kind is Discover:
                self._run(self._answer(event.request, self._discover(event)), event.request.id)  # type: ignore[union-attr]
            elif kind is Listen:
                self._run(self._answer(event.request, self._listen(event)), event.request.id)  # type: ignore[union-attr]
            elif kind is Cancel:
                self._notified("notifications/cancelled", event.params,  # type: ignore[union-attr]
                               partial(self._cancel, event.request_id))  # type: ignore[union-attr]
            elif kind is Notified:
                self._notified(event.method, event.params, None)  # type: ignore[union-attr]
            elif kind is Answered:
                future = self._outgoing.pop(event.request_id, None)  # type: ignore[union-attr]
                if future is not None and not future.done():
                    future.set_result(event.answer)  # type: ignore[union-attr]
            elif kind is RootsChanged:
                self._notified("notifications/roots/list_changed", event.params,  # type: ignore[union-attr]
                               self._roots_changed)
            elif kind is CloseConnection:
                self._close_transport()
            elif kind is Invalid:
                log.warning("client sent an invalid frame: %s", event.reason)  # type: ignore[union-attr]
            elif kind is UnknownAnswer:
                log.warning("client answered unknown request id %r; ignored", event.request_id)  # type: ignore[union-attr]

    def _notified(self, method: str, params: Mapping[str, Any] | None, effect: Callable[[], None] | None) -> None:
        """A notification of the client's: through the chain, then ``effect`` (what it does, if anything). Where no
        interceptor is on its route, the effect is at once."""
        route = self.gateway.chain.route(TO_SERVER, NOTIFICATION, method)
        if route.empty:
            if effect is not None:
                effect()
            return

        async def deliver(_: GatewayRequest) -> dict[str, Any]:
            if effect is not None:
                effect()
            return {}

        message = GatewayRequest(method, dict(params) if params is not None else {}, self.session, self.gateway.catalog,
                                 kind=NOTIFICATION, deliver=deliver)
        self._notices.pass_on(route.handle, message)

    async def notifications_passed(self) -> None:
        """Wait until the client's notifications so far have passed the chain (for a transport that acknowledges a
        notification once it has)."""
        pending = self._notices.pending()
        if pending is not None:
            await asyncio.wait([pending])

    def _cancel(self, request_id: Any) -> None:
        task = self._running.get(request_id)
        if task is not None:
            task.cancel()

    def _roots_changed(self) -> None:
        # Pooled servers' instances of this client are told too; another caller's instances are not theirs.
        own = [pool.instance(self.session) for pool in self.gateway.pools.values()]
        for upstream in [*self.gateway.upstreams.values(), *own]:
            if upstream is not None and "roots" in upstream.client_capabilities:
                upstream.notify("notifications/roots/list_changed", None)

    def _on_serve(self, event: Serve) -> None:
        self._run(self._answer(event.request, self._serve(event)), event.request.id)

    def _raw_call(self, frame: bytes, decoded: dict[str, Any]) -> bool:
        """Take a tools/call with its params decoded one level deep, each value still the JSON the client sent,
        when nothing in the gateway's chain reads a call's params: its arguments then reach the server as those
        bytes (integers wider than 64 bits, key order, number spelling kept). ``decoded`` is the frame as
        ``read_frame`` read it: only a frame it accepted as a valid request is read again for its raw params, so
        the verdict is the same as on the session's path. False leaves the frame to the session, which also
        answers every refusal; a ``_meta`` (a progress token to remap) is always decoded."""
        request = raw_request_of(frame, decoded, self._max_bytes)
        if request is None or "_meta" in request.params:  # type: ignore[operator]
            return False
        self._act(self.protocol.receive(request))
        return True

    def _run(self, coroutine: Coroutine[Any, Any, None], request_id: Any) -> None:
        # A real Task: asyncio.timeout, TaskGroup, anyio and the clients built on them work on a request's path. An
        # eager Task (Python 3.12+) may have answered by the time it is made: it is not kept then.
        task = self._loop.create_task(coroutine)
        if not task.done():
            self._running[request_id] = task

    # ---------------------------------------------------------------------------------------- serving
    async def _answer(self, message: Request, reply: Awaitable[jsonrpc.Message | RawResponse | None]) -> None:
        """Send what ``reply`` makes of one request, whatever happens on the way."""
        try:
            answer = await reply
            if answer is not None:
                if type(answer) is RawResponse:  # a result only passed through: the server's bytes, under our id
                    frame = answer.reframed(message.id)
                    self._send_frame(frame, RawResponse(message.id, answer.result, frame))
                else:
                    self._send(answer)
                if self._drain is not None:
                    await self._drain()
        except asyncio.CancelledError:
            pass  # a cancelled request gets no answer
        except Exception:  # noqa: BLE001 - one failing request must never take the connection down
            log.exception("internal error while serving %s", message.method)
            self._send(ErrorResponse(message.id, jsonrpc.error(jsonrpc.INTERNAL_ERROR, "internal error in Bastion")))
        finally:
            self._running.pop(message.id, None)
            self.protocol.request_done(message.id)

    async def _initialize(self, event: Initialize) -> None:
        async def answer() -> jsonrpc.Message:
            try:
                self._session = Session(self.identity, "legacy", event.protocol_version, event.client_capabilities,
                                        event.client_info, self.id, client=self, over_network=self._over_network)
                # It takes every log level until it sets one: servers asked for less by other clients are asked again.
                self.gateway.log_levels.client_joined()
                self.gateway.start()  # already started with Bastion, unless this frontend runs without serve_stdio
                await self.gateway.wait_ready()

                async def answer_it(_: GatewayRequest) -> dict[str, Any]:
                    return self.protocol.initialize_result(event.request, self.gateway.server_capabilities(),
                                                           self.gateway.instructions()).result

                return await self._answered_by_session(event.request, self._session, answer_it)
            finally:
                self._handshake.set()
                self._takes_raw_calls = self.gateway.takes_raw_params

        await self._answer(event.request, answer())

    def restore(self, protocol_version: str, client_capabilities: Mapping[str, Any],
                client_info: Mapping[str, Any] | None, *, initialized: bool, log_level: str | None) -> None:
        """Continue a handshake-era session begun in another process (a replica): the protocol state as the record
        of it says, the session the interceptors see, and the servers of this process, as for a new client's; the
        client's initialize is not replayed to anything."""
        self.protocol.restore(protocol_version, client_capabilities, client_info, initialized=initialized,
                              log_level=log_level)
        self._session = Session(self.identity, "legacy", self.protocol.protocol_version,
                                self.protocol.client_capabilities, self.protocol.client_info, self.id, client=self,
                                over_network=self._over_network)
        self.gateway.log_levels.client_joined()
        self.gateway.start()
        self._takes_raw_calls = self.gateway.takes_raw_params
        # Its requests wait for this process's servers, as a new client's initialize does.
        self._taking_up = self._loop.create_task(self._servers_then_serve())

    async def _servers_then_serve(self) -> None:
        try:
            await self.gateway.wait_ready()
        finally:
            self._handshake.set()

    def _serve(self, event: Serve) -> Awaitable[jsonrpc.Message | RawResponse]:
        """What answers a request (a plain function handing back the coroutine that does: no layer of its own
        per request)."""
        if event.era == "modern":
            return self._serve_modern(event)
        if not self._handshake.is_set() and event.request.method != "ping":
            return self._serve_after_handshake(event)
        return self._dispatch(event.request, self._session or self._anonymous_session(), event.log_level)

    async def _serve_after_handshake(self, event: Serve) -> jsonrpc.Message | RawResponse:
        await self._handshake.wait()
        return await self._dispatch(event.request, self._session or self._anonymous_session(), event.log_level)

    async def _serve_modern(self, event: Serve) -> jsonrpc.Message:
        waiting = self._servers_wait()
        if waiting is not None:
            await waiting
        session = Session(self.identity, "modern", event.protocol_version, event.client_capabilities,
                          event.client_info, self.id, client=self, over_network=self._over_network)
        return await self._dispatch_modern(event.request, session, event.log_level)

    def _anonymous_session(self) -> Session:
        return Session(self.identity, self.era or "legacy", "", {}, None, self.id, client=self,
                       over_network=self._over_network)

    async def _discover(self, event: Discover) -> jsonrpc.Message:
        waiting = self._servers_wait()
        if waiting is not None:
            await waiting

        async def answer_it(_: GatewayRequest) -> dict[str, Any]:
            return self.protocol.discover_result(event.request, self.gateway.server_capabilities(),
                                                 self.gateway.instructions()).result

        return await self._answered_by_session(event.request, self.session, answer_it)

    async def _answered_by_session(self, request: Request, session: Session,
                                   answer_it: Callable[[GatewayRequest], Awaitable[dict[str, Any]]]) -> jsonrpc.Message:
        """A request the session answers itself, through the chain like any other (an interceptor may rewrite the
        answer, the instructions in it say, or refuse it)."""
        message = GatewayRequest(request.method, dict(request.params or {}), session, self.gateway.catalog,
                                 request_id=request.id, deliver=answer_it)
        try:
            result = await self.gateway.handle(message)
        except GatewayError as exc:
            return ErrorResponse(request.id, exc.to_error())
        return Response(request.id, result)

    def _servers_wait(self) -> Awaitable[None] | None:
        """What a modern client's request waits for first, None for nothing: its first request waits, as a legacy
        client's initialize does, for servers still starting (at most ``ready_timeout``); its later requests do not,
        and late servers join with list_changed. Once every server has settled nothing is waited for (a 2026-07-28
        HTTP client's every POST is a first request, and a wait costs Tasks)."""
        waited = self._servers_waited
        if waited is False:
            return None
        if waited is None:
            self.gateway.start()  # already started with Bastion, unless this frontend runs without serve_stdio
            if self.gateway.servers_settled():
                # Its later requests do not wait either, not even while a list_changed's fetch is under way.
                self._servers_waited = False
                return None
            waited = self._servers_waited = asyncio.ensure_future(self.gateway.wait_ready())
        return None if waited.done() else asyncio.shield(waited)

    async def _dispatch(self, message: Request, session: Session,
                        log_level: str | None) -> jsonrpc.Message | RawResponse:
        # The params were decoded for this request alone, so interceptors may rewrite them in place.
        params = message.params if message.params is not None else {}
        request = GatewayRequest(message.method, params, session, self.gateway.catalog,
                                 request_id=message.id, log_level=log_level)
        try:
            result = await self.gateway.handle(request)
        except GatewayError as exc:
            return ErrorResponse(message.id, exc.to_error())
        if type(result) is RawResponse:
            return result
        return self.protocol.result(message.id, message.method, result)

    async def _dispatch_modern(self, message: Request, session: Session, log_level: str | None) -> jsonrpc.Message:
        """A 2026-07-28 request runs in a Task of its own, which outlives the request when its server asks for
        input: the request is answered ``input_required``, and the client's retry (naming the call by the
        ``requestState`` it was given) brings the answers and waits for the rest."""
        params = message.params if message.params is not None else {}
        bridge = self.gateway.inputs
        state = params.get("requestState")
        target = (message.method, params.get("name") if "name" in params else params.get("uri"))
        try:
            if bridge.is_ours(state):
                # The retry passes the chain too, as a request that continues the call; its last step resumes it.
                resumed: list[Any] = []

                async def resume(_: GatewayRequest) -> dict[str, Any]:
                    resumed.append(bridge.resume(state, self.identity, params.get("inputResponses"), target))
                    return {}

                answered = await self.gateway.handle(GatewayRequest(
                    message.method, params, session, self.gateway.catalog, request_id=message.id,
                    log_level=log_level, continues=True, deliver=resume))
                if not resumed:  # an interceptor answered it itself
                    return self.protocol.result(message.id, message.method, answered)
                call = resumed[0]
            else:
                request = GatewayRequest(message.method, params, session, self.gateway.catalog,
                                         request_id=message.id, log_level=log_level)
                handling = asyncio.ensure_future(self.gateway.handle(request))
                call = bridge.begin(self.identity, session.client_capabilities, handling, (self.id, message.id),
                                    target)
        except GatewayError as exc:
            return ErrorResponse(message.id, exc.to_error())
        attention = call.wait_for_attention()
        handling = call.handling
        # The call's end, like a question of its server, draws attention: one future to wait on, no asyncio.wait.
        draw_attention = attention.done() or handling.done() or _draw_attention_on_end(handling, attention)
        try:
            if not handling.done():
                await attention
        except asyncio.CancelledError:
            if not call.parked:  # the client gave up on the call itself, not on a request that answered for it
                handling.cancel()
            raise
        finally:
            attention.cancel()
            if draw_attention is not True:
                handling.remove_done_callback(draw_attention)
        if call.handling.done():
            if call.handling.cancelled():
                return ErrorResponse(message.id, jsonrpc.error(
                    jsonrpc.REQUEST_TIMEOUT, "the call was given up while it waited for the client's input"))
            try:
                result = call.handling.result()
            except GatewayError as exc:
                return ErrorResponse(message.id, exc.to_error())
            return self.protocol.result(message.id, message.method, result)
        questions = call.open_questions()
        bridge.park(call)
        return self.protocol.result(message.id, message.method, {
            "resultType": "input_required", "inputRequests": questions, "requestState": call.token})

    async def _listen(self, event: Listen) -> jsonrpc.Message:
        waiting = self._servers_wait()
        if waiting is not None:
            await waiting
        # Its last step keeps the stream open until the client cancels it or leaves: only a refusal, or an
        # interceptor's own answer, ends it with a response.
        return await self._answered_by_session(event.request, self.session, lambda _: self._keep_listening(event))

    async def _keep_listening(self, event: Listen) -> dict[str, Any]:
        agreed, acknowledged = self.protocol.listen_opened(event, self.gateway.server_capabilities())
        for uri in agreed.get("resourceSubscriptions", ()):
            try:
                await self.gateway.handle(GatewayRequest(
                    "resources/subscribe", {"uri": uri}, self._anonymous_session(), self.gateway.catalog))
            except GatewayError as exc:
                log.info("subscription to %s refused: %s", uri, exc.message)
        self._send(acknowledged)
        await asyncio.Event().wait()  # the stream stays open until the client cancels it or leaves
        return {}

    # ---------------------------------------------------------------------------- gateway → client
    def notify(self, method: str, params: Mapping[str, Any] | None) -> None:
        self._send(jsonrpc.Notification(method, dict(params) if params is not None else None))

    def list_changed(self, method: str) -> None:
        for notification in self.protocol.list_changed(method):
            self._send(notification)

    def resource_updated(self, params: Mapping[str, Any]) -> None:
        for notification in self.protocol.resource_updated(params):
            self._send(notification)

    def log_message(self, params: Mapping[str, Any]) -> None:
        for notification in self.protocol.log_message(params):
            self._send(notification)

    def wants(self, kind: str) -> bool:
        """Whether this client asked for notifications of ``kind`` that have no origin (``"logs"``, or a
        list_changed method)."""
        return self.protocol.wants(kind)

    # ClientChannel
    def supports(self, capability: str) -> bool:
        session = self._session
        return session is not None and capability in session.client_capabilities

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        if self.era != "legacy":
            raise GatewayError(jsonrpc.METHOD_NOT_FOUND, f"{method} cannot be sent to a 2026-07-28 client")
        # A server may ask while the client's initialize waits for the others; nothing may reach the client first.
        await self._handshake.wait()
        outgoing = self.protocol.outgoing_request(method, params)
        future: asyncio.Future[Response | ErrorResponse] = asyncio.get_running_loop().create_future()
        self._outgoing[outgoing.id] = future  # type: ignore[index]
        self._send(outgoing)
        try:
            answer = await future
        except asyncio.CancelledError:
            self._outgoing.pop(outgoing.id, None)  # type: ignore[arg-type]
            self._send(self.protocol.outgoing_abandoned(outgoing.id))  # type: ignore[arg-type]
            raise
        if isinstance(answer, ErrorResponse):
            raise GatewayError.from_error(answer.error)
        return answer.result

    # ------------------------------------------------------------------------------------------ output
    def _send(self, message: jsonrpc.Message) -> None:
        try:
            self._send_frame(jsonrpc.encode(message), message)
        except TypeError as exc:  # a value orjson cannot encode (e.g. an oversized integer from a server)
            log.error("could not encode a message for the client: %s", exc)
            if isinstance(message, Response):
                self._send(ErrorResponse(message.id, jsonrpc.error(jsonrpc.INTERNAL_ERROR, f"unencodable result: {exc}")))

    def _send_frame(self, frame: bytes, message: Outgoing) -> None:
        try:
            self._send_bytes(frame, message)
        except (ConnectionError, RuntimeError, OSError) as exc:
            log.info("client connection lost while sending: %s", exc)

    async def closed(self) -> None:
        """The transport is gone: abort everything this client started and release what it held."""
        self.protocol.connection_lost()
        self._notices.close()
        if self._taking_up is not None:
            self._taking_up.cancel()
        running = list(self._running.values())
        if running:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        for future in self._outgoing.values():
            future.cancel()
        self._outgoing.clear()
        self.gateway.detach(self)


def _draw_attention_on_end(handling: asyncio.Future[Any], attention: asyncio.Future[None]) -> Callable[..., None]:
    """Make ``handling``'s end complete ``attention``; returns the callback, for removing it."""
    def on_end(_: asyncio.Future[Any]) -> None:
        if not attention.done():
            attention.set_result(None)

    handling.add_done_callback(on_end)
    return on_end
