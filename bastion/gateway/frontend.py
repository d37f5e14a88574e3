"""One client connection to Bastion, whatever the transport: its era, lifecycle, in-flight requests and
notifications. The transport feeds it frames and gives it a way to send them."""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from typing import Any, Awaitable, Callable, Coroutine, Mapping

from bastion.gateway.core import SERVER_INFO, Gateway
from bastion.gateway.eager import RequestRunner
from bastion.model import GatewayError, GatewayRequest, Identity, Session
from bastion.protocol import jsonrpc
from bastion.protocol.jsonrpc import (
    ErrorResponse,
    InvalidFrame,
    Notification,
    RawResponse,
    Request,
    Response,
    parse_frame,
    parse_raw_request,
)
from bastion.protocol.lifecycle import Action, ServerLifecycle, State
from bastion.protocol.versions import (
    DISCOVER,
    META_SERVER_INFO,
    META_SUBSCRIPTION_ID,
    MODERN_VERSIONS,
    Envelope,
    is_modern_first_message,
    negotiate_legacy,
    read_envelope,
)

log = logging.getLogger("bastion.frontend")

_CACHEABLE = frozenset({"tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"})
_LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


class ClientConnection:
    """Implements ``ClientChannel`` for interceptors that need to ask the client something."""

    def __init__(
        self,
        gateway: Gateway,
        send: Callable[[bytes], None],
        *,
        identity: Identity,
        close: Callable[[], None] = lambda: None,
        drain: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.id = uuid.uuid4().hex
        self.gateway = gateway
        self.identity = identity
        self.era: str | None = None
        self._send_bytes = send
        self._close_transport = close
        self._drain = drain
        self._lifecycle = ServerLifecycle()
        self._session: Session | None = None  # legacy: one for the connection
        self._running: dict[Any, RequestRunner] = {}  # requests in flight, by the client's id
        self._outgoing: dict[str, asyncio.Future[Response | ErrorResponse]] = {}
        self._outgoing_ids = itertools.count(1)
        self._listens: dict[Any, dict[str, Any]] = {}  # modern subscriptions/listen: id -> filter
        self._log_opt_ins: dict[Any, str] = {}  # modern requests in flight that opted in to logs: id -> level
        self._log_level: str | None = None  # legacy logging/setLevel
        self._answered_initialize = False  # notifications wait until the client has its initialize result
        # Requests a client pipelines behind its initialize wait for the handshake (and the servers it waits for).
        self._handshake = asyncio.Event()
        self._direct_session: Session | None = None  # a handshake-era session once its handshake is done
        self._servers_waited: asyncio.Future[None] | None = None  # a modern client's first wait for the servers
        self._max_bytes = gateway.config.max_message_bytes
        self._loop = asyncio.get_running_loop()
        gateway.attach(self)

    # ------------------------------------------------------------------------------------------ input
    def feed(self, frame: bytes) -> None:
        session = self._direct_session
        if session is not None and self._lifecycle.state is State.ACTIVE and self._forward_raw(session, frame):
            return
        if not frame or frame.isspace():  # a blank line is no message; isspace stops at the first other byte
            return
        message = parse_frame(frame, self._max_bytes)
        if isinstance(message, InvalidFrame):
            log.warning("client sent an invalid frame: %s", message.reason)
            if message.reply is not None:
                self._send(message.reply)
            return
        if self.era is None and isinstance(message, (Request, Notification)):
            self.era = "modern" if is_modern_first_message(message.method, message.params) else "legacy"
        if self.era == "legacy":
            verdict = self._lifecycle.receive(message)
            if verdict.action is not Action.ACCEPT:
                if verdict.reply is not None:
                    self._send(verdict.reply)
                if verdict.action is Action.REJECT_AND_CLOSE:
                    self._close_transport()
                return
        kind = type(message)
        if kind is Request:
            self._on_request(message)
        elif kind is Notification:
            self._on_notification(message)
        else:
            self._on_response(message)

    def frame_too_large(self, size: int) -> None:
        self._send(ErrorResponse(None, jsonrpc.error(
            jsonrpc.INVALID_REQUEST, f"message of at least {size} bytes exceeds the limit of {self._max_bytes} bytes")))

    def _on_request(self, message: Request) -> None:
        if message.id in self._running:
            self._send(ErrorResponse(message.id, jsonrpc.error(
                jsonrpc.INVALID_REQUEST, f"request id {message.id!r} is already in flight")))
            return
        session = self._direct_session
        if session is not None and message.method == "tools/call":
            call = self.gateway.forward_tool_call(session, message.id, message.params, self._log_level or "debug",
                                                  self._answer_directly)
            if call is not None:
                self._running[message.id] = call
                return
        self._run(self._serve(message), message.id)

    def _forward_raw(self, session: Session, frame: bytes) -> bool:
        """Pass a tools/call to its server with its arguments as the client sent them, when the gateway can: the
        usual request of an established handshake-era session with no interceptor. False leaves the frame to
        ``feed``'s full parse (which also answers every refusal)."""
        request = parse_raw_request(frame, self._max_bytes)
        if request is None or request.method != "tools/call" or request.id in self._running:
            return False
        call = self.gateway.forward_raw_tool_call(session, request.id, request.params, self._log_level or "debug",
                                                  self._answer_directly)
        if call is None:
            return False
        self._running[request.id] = call
        return True

    def _run(self, coroutine: Coroutine[Any, Any, None], request_id: Any) -> None:
        runner = RequestRunner(coroutine, self._loop)
        if not runner.done:  # still waiting for its answer
            self._running[request_id] = runner

    def _answer_directly(self, request_id: Any, answer: Response | ErrorResponse | None) -> None:
        """The answer to a call the gateway passed straight to its server; None when the client cancelled it."""
        call = self._running.pop(request_id, None)
        if answer is None:
            return
        if type(answer) is RawResponse:
            # Only a modern server's result has fields a handshake-era client must not see. A byte search can
            # match inside a string too, which only costs a decode.
            frame = answer.frame
            if frame.find(b'"resultType"') < 0 and frame.find(b'"_meta"') < 0:
                self._send_frame(answer.reframed(request_id))
                return
            answer = answer.decoded()
        if type(answer) is ErrorResponse:
            self._send(ErrorResponse(request_id, GatewayError.from_error(answer.error).to_error()))
            return
        result = answer.result
        if "resultType" in result or "_meta" in result:  # from a modern server
            resume = getattr(call, "resume", None)
            if result.get("resultType") == "input_required" and resume is not None:
                server, params = resume
                finish = self._finish_tool_call(request_id, server, params, result)
                self._run(self._serve(Request(request_id, "tools/call", params), finish), request_id)
                return
            result = _legacy_result(result)
        self._send(Response(request_id, result))

    def _on_notification(self, message: Notification) -> None:
        params = message.params or {}
        if message.method == "notifications/cancelled":
            request_id = params.get("requestId")
            runner = self._running.get(request_id)
            if runner is not None:
                runner.cancel()
            self._listens.pop(request_id, None)
        elif message.method == "notifications/roots/list_changed":
            for upstream in self.gateway.upstreams.values():
                if "roots" in upstream.client_capabilities:
                    upstream.notify(message.method, None)

    def _on_response(self, message: Response | ErrorResponse) -> None:
        future = self._outgoing.pop(message.id, None) if isinstance(message.id, str) else None
        if future is None:
            log.warning("client answered unknown request id %r; ignored", message.id)
            return
        if not future.done():
            future.set_result(message)

    # ---------------------------------------------------------------------------------------- serving
    async def _serve(self, message: Request, finish: Awaitable[jsonrpc.Message] | None = None) -> None:
        """Answer one request; ``finish``, when given, makes the answer (the rest of a call sent directly)."""
        try:
            if finish is not None:
                reply = await finish
            elif self.era == "modern":
                reply = await self._serve_modern(message)
            elif message.method == "initialize":
                try:
                    reply = await self._initialize(message)
                finally:
                    self._handshake.set()
                    self._direct_session = self._session if self.gateway.forwards_directly else None
            else:
                if not self._handshake.is_set() and message.method != "ping":
                    await self._handshake.wait()
                # Modern servers log only for requests that opt in. A legacy client gets every level until it sends
                # logging/setLevel (legacy servers behave that way), so its requests opt in at its level, else debug.
                reply = self._refused_log_level(message) or await self._dispatch(
                    message, self._session or self._anonymous_session(), self._log_level or "debug")
            if reply is not None:
                self._send(reply)
                if self._drain is not None:
                    await self._drain()
        except asyncio.CancelledError:
            pass  # a cancelled request gets no answer
        except Exception:  # noqa: BLE001 - one failing request must never take the connection down
            log.exception("internal error while serving %s", message.method)
            self._send(ErrorResponse(message.id, jsonrpc.error(jsonrpc.INTERNAL_ERROR, "internal error in Bastion")))
        finally:
            self._running.pop(message.id, None)
            self._log_opt_ins.pop(message.id, None)

    def _refused_log_level(self, message: Request) -> ErrorResponse | None:
        """Take the level of a legacy logging/setLevel (which is also forwarded), or refuse an invalid one."""
        if message.method != "logging/setLevel":
            return None
        level = (message.params or {}).get("level")
        if level not in _LOG_LEVELS:
            return ErrorResponse(message.id, jsonrpc.error(jsonrpc.INVALID_PARAMS, f"invalid log level {level!r}"))
        self._log_level = level
        return None

    async def _initialize(self, message: Request) -> None:
        params = message.params or {}
        capabilities = params.get("capabilities") if isinstance(params.get("capabilities"), dict) else {}
        client_info = params.get("clientInfo") if isinstance(params.get("clientInfo"), dict) else None
        version = negotiate_legacy(params.get("protocolVersion"))
        self._session = Session(self.identity, "legacy", version, capabilities, client_info, self.id, client=self)
        self.gateway.start()  # already started with Bastion, unless this frontend runs without serve_stdio
        await self.gateway.wait_ready()
        result: dict[str, Any] = {
            "protocolVersion": version,
            "capabilities": self.gateway.server_capabilities(),
            "serverInfo": SERVER_INFO,
        }
        instructions = self.gateway.instructions()
        if instructions:
            result["instructions"] = instructions
        self._send(Response(message.id, result))
        self._answered_initialize = True
        return None

    def _anonymous_session(self) -> Session:
        return Session(self.identity, self.era or "legacy", "", {}, None, self.id, client=self)

    async def _serve_modern(self, message: Request) -> jsonrpc.Message | None:
        envelope = read_envelope(message.params)
        if not isinstance(envelope, Envelope):
            return ErrorResponse(message.id, envelope)
        await self._first_request_waited()
        session = Session(self.identity, "modern", envelope.protocol_version, envelope.client_capabilities,
                          envelope.client_info, self.id, client=self)
        if message.method == DISCOVER:
            return Response(message.id, self._modern_result(message.method, {
                "supportedVersions": list(MODERN_VERSIONS),
                "capabilities": self.gateway.server_capabilities(),
                **({"instructions": i} if (i := self.gateway.instructions()) else {}),
            }))
        if message.method == "subscriptions/listen":
            return await self._listen(message)
        if envelope.log_level is not None:
            self._log_opt_ins[message.id] = envelope.log_level
        return await self._dispatch(message, session, envelope.log_level)

    async def _first_request_waited(self) -> None:
        """A modern client's first request waits, as a legacy client's initialize does, for servers still starting
        (at most ``ready_timeout``); its later requests do not, and late servers join with list_changed."""
        if self._servers_waited is None:
            self.gateway.start()  # already started with Bastion, unless this frontend runs without serve_stdio
            self._servers_waited = asyncio.ensure_future(self.gateway.wait_ready())
        await asyncio.shield(self._servers_waited)

    async def _dispatch(self, message: Request, session: Session, log_level: str | None) -> jsonrpc.Message:
        # The params were decoded for this request alone, so interceptors may rewrite them in place.
        params = message.params if message.params is not None else {}
        request = GatewayRequest(message.method, params, session, self.gateway.catalog,
                                 request_id=message.id, log_level=log_level)
        try:
            result = await self.gateway.handle(request)
        except GatewayError as exc:
            return ErrorResponse(message.id, exc.to_error())
        if self.era == "modern":
            result = self._modern_result(message.method, result)
        else:
            result = _legacy_result(result)
        return Response(message.id, result)

    async def _finish_tool_call(self, request_id: Any, server: str, params: dict[str, Any],
                                input_required: dict[str, Any]) -> jsonrpc.Message:
        """A call sent directly to a modern server that answered ``input_required``: drive its rounds there."""
        request = GatewayRequest("tools/call", params, self._session or self._anonymous_session(),
                                 self.gateway.catalog, request_id=request_id, log_level=self._log_level or "debug")
        try:
            result = await self.gateway.drive_input_required(request, server, params, input_required)
        except GatewayError as exc:
            return ErrorResponse(request_id, exc.to_error())
        return Response(request_id, _legacy_result(result))

    def _modern_result(self, method: str, result: dict[str, Any]) -> dict[str, Any]:
        result = dict(result)
        result.setdefault("resultType", "complete")
        meta = dict(result.get("_meta") or {})
        meta[META_SERVER_INFO] = SERVER_INFO
        result["_meta"] = meta
        if method in _CACHEABLE or method == DISCOVER:
            # Lists are filtered per identity by policy, so they may never be shared across identities.
            result.setdefault("ttlMs", 0)
            result["cacheScope"] = "private"
        return result

    async def _listen(self, message: Request) -> None:
        wanted = (message.params or {}).get("notifications") or {}
        caps = self.gateway.server_capabilities()
        agreed: dict[str, Any] = {}
        for key, capability in (("toolsListChanged", "tools"), ("promptsListChanged", "prompts"),
                                ("resourcesListChanged", "resources")):
            if wanted.get(key) and capability in caps:
                agreed[key] = True
        uris = wanted.get("resourceSubscriptions")
        if isinstance(uris, list) and "resources" in caps:
            agreed["resourceSubscriptions"] = [u for u in uris if isinstance(u, str)]
            for uri in agreed["resourceSubscriptions"]:
                try:
                    await self.gateway.handle(GatewayRequest(
                        "resources/subscribe", {"uri": uri}, self._anonymous_session(), self.gateway.catalog))
                except GatewayError as exc:
                    log.info("subscription to %s refused: %s", uri, exc.message)
        self._listens[message.id] = agreed
        self._notify_raw("notifications/subscriptions/acknowledged",
                         {"notifications": agreed, "_meta": {META_SUBSCRIPTION_ID: message.id}})
        await asyncio.Event().wait()  # the stream stays open until the client cancels it or leaves
        return None

    # ---------------------------------------------------------------------------- gateway → client
    def notify(self, method: str, params: Mapping[str, Any] | None) -> None:
        self._notify_raw(method, dict(params) if params is not None else None)

    def _notify_raw(self, method: str, params: dict[str, Any] | None) -> None:
        self._send(Notification(method, params))

    def list_changed(self, method: str) -> None:
        if self.era == "legacy":
            if self._legacy_ready():
                self.notify(method, None)
            return
        key = {"notifications/tools/list_changed": "toolsListChanged",
               "notifications/prompts/list_changed": "promptsListChanged",
               "notifications/resources/list_changed": "resourcesListChanged"}[method]
        for listen_id, agreed in list(self._listens.items()):
            if agreed.get(key):
                self._notify_raw(method, {"_meta": {META_SUBSCRIPTION_ID: listen_id}})

    def _legacy_ready(self) -> bool:
        # A client may pipeline notifications/initialized before it has read the initialize result; nothing
        # may reach it ahead of that result.
        return self._answered_initialize and self._lifecycle.state is State.ACTIVE

    def resource_updated(self, params: Mapping[str, Any]) -> None:
        if self.era == "legacy":
            self.notify("notifications/resources/updated", params)
            return
        uri = params.get("uri")
        for listen_id, agreed in list(self._listens.items()):
            if uri in agreed.get("resourceSubscriptions", ()):
                self._notify_raw("notifications/resources/updated",
                                 {**params, "_meta": {META_SUBSCRIPTION_ID: listen_id}})

    def log_message(self, params: Mapping[str, Any]) -> None:
        level = params.get("level")
        if self.era == "legacy":
            if not self._legacy_ready():
                return
            if self._log_level is None or _at_least(level, self._log_level):
                self.notify("notifications/message", params)
            return
        if any(_at_least(level, wanted) for wanted in self._log_opt_ins.values()):
            self.notify("notifications/message", params)

    # ClientChannel
    def supports(self, capability: str) -> bool:
        session = self._session
        return session is not None and capability in session.client_capabilities

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        if self.era != "legacy":
            raise GatewayError(jsonrpc.METHOD_NOT_FOUND, f"{method} cannot be sent to a 2026-07-28 client")
        # A server may ask while the client's initialize waits for the others; nothing may reach the client first.
        await self._handshake.wait()
        request_id = f"bastion-{next(self._outgoing_ids)}"
        future: asyncio.Future[Response | ErrorResponse] = asyncio.get_running_loop().create_future()
        self._outgoing[request_id] = future
        self._send(Request(request_id, method, dict(params)))
        try:
            answer = await future
        except asyncio.CancelledError:
            self._outgoing.pop(request_id, None)
            self._notify_raw("notifications/cancelled", {"requestId": request_id})
            raise
        if isinstance(answer, ErrorResponse):
            raise GatewayError.from_error(answer.error)
        return answer.result

    # ------------------------------------------------------------------------------------------ output
    def _send(self, message: jsonrpc.Message) -> None:
        try:
            self._send_frame(jsonrpc.encode(message))
        except TypeError as exc:  # a value orjson cannot encode (e.g. an oversized integer from a server)
            log.error("could not encode a message for the client: %s", exc)
            if isinstance(message, Response):
                self._send(ErrorResponse(message.id, jsonrpc.error(jsonrpc.INTERNAL_ERROR, f"unencodable result: {exc}")))

    def _send_frame(self, frame: bytes) -> None:
        try:
            self._send_bytes(frame)
        except (ConnectionError, RuntimeError, OSError) as exc:
            log.info("client connection lost while sending: %s", exc)

    async def closed(self) -> None:
        """The transport is gone: abort everything this client started and release what it held."""
        self._lifecycle.transport_dropped()
        runners = list(self._running.values())
        for runner in runners:
            runner.cancel()
        await asyncio.gather(*(runner.finished() for runner in runners))
        for future in self._outgoing.values():
            future.cancel()
        self._outgoing.clear()
        self.gateway.detach(self)


def _legacy_result(result: dict[str, Any]) -> dict[str, Any]:
    """Drop the 2026-07-28 envelope fields a modern server adds; a handshake-era client has no use for them."""
    if "resultType" not in result and "_meta" not in result:
        return result
    result = {k: v for k, v in result.items() if k != "resultType"}
    meta = result.get("_meta")
    if isinstance(meta, dict):
        meta = {k: v for k, v in meta.items() if not k.startswith("io.modelcontextprotocol/")}
        if meta:
            result["_meta"] = meta
        else:
            del result["_meta"]
    return result


def _at_least(level: Any, threshold: str) -> bool:
    try:
        return _LOG_LEVELS.index(level) >= _LOG_LEVELS.index(threshold)
    except ValueError:
        return True

