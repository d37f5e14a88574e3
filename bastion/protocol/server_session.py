"""One client of Bastion, as the server side of MCP sees it: sans-I/O, in the manner of h11.

A ``ServerSession`` takes what a client sent (frames, or messages already parsed) and returns events: replies
to send at once, and the requests the caller has to serve. It decides everything that depends on the protocol
alone: which era the client speaks (from its first message), the handshake-era lifecycle, the 2026-07-28
per-request envelope, log levels of both eras, ``subscriptions/listen`` streams, which answers are to requests
Bastion sent the client, and how a result is written for the client's era. It performs no I/O, awaits nothing
and reads no clock; whatever takes time (waiting for servers, the interceptor chain, the servers themselves) is
the driver's (``bastion.frontends.connection``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from bastion.protocol import jsonrpc
from bastion.protocol.jsonrpc import (
    ErrorResponse,
    InvalidFrame,
    Message,
    Notification,
    Request,
    Response,
    is_valid_id,
    parse_message,
    read_frame,
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

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
CACHEABLE = frozenset({"tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"})
LISTEN_KEYS = {
    "notifications/tools/list_changed": "toolsListChanged",
    "notifications/prompts/list_changed": "promptsListChanged",
    "notifications/resources/list_changed": "resourcesListChanged",
}
_LISTEN_CAPABILITY = {"toolsListChanged": "tools", "promptsListChanged": "prompts", "resourcesListChanged": "resources"}
_OUTGOING_PREFIX = "bastion-"
_MODERN_META_PREFIX = "io.modelcontextprotocol/"


# ------------------------------------------------------------------------------------------- events
# Resources one client connection may be subscribed to at once (a listen's resourceSubscriptions, or a handshake-era
# session's resources/subscribe): each is a subscription Bastion keeps and, on the first subscriber, asks a server for.
MAX_SUBSCRIPTIONS = 1000

@dataclass(frozen=True, slots=True)
class Send:
    """Send ``message`` to the client now."""

    message: Message


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close the transport (after what was sent before it)."""


@dataclass(frozen=True, slots=True)
class Invalid:
    """The client sent something that is not a message; any answer it is owed came as a ``Send`` before this."""

    reason: str


@dataclass(frozen=True, slots=True)
class Initialize:
    """A handshake-era ``initialize``: answer it with ``ServerSession.initialize_result`` once the servers the
    client's start waits for are in."""

    request: Request
    protocol_version: str
    client_capabilities: Mapping[str, Any]
    client_info: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class Serve:
    """A request for the gateway to serve, with what its era says about the client.

    For a handshake-era client the capabilities and client info are those of its ``initialize``, and
    ``log_level`` is the level it set (``debug`` until it sets one: handshake-era servers send every level
    until then); for a 2026-07-28 client they come from the request's own envelope.
    """

    request: Request
    era: str
    protocol_version: str
    client_capabilities: Mapping[str, Any]
    client_info: Mapping[str, Any] | None
    log_level: str | None


@dataclass(frozen=True, slots=True)
class Discover:
    """A 2026-07-28 ``server/discover``: answer it with ``ServerSession.discover_result``."""

    request: Request


@dataclass(frozen=True, slots=True)
class Listen:
    """A 2026-07-28 ``subscriptions/listen``: agree to it with ``ServerSession.listen_opened``."""

    request: Request
    wanted: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Cancel:
    """The client gave up on one of its requests (which then gets no answer)."""

    request_id: Any
    params: Mapping[str, Any] | None = field(default=None, compare=False)  # the notification's, for the chain


@dataclass(frozen=True, slots=True)
class RootsChanged:
    """The client's roots changed (``notifications/roots/list_changed``)."""

    params: Mapping[str, Any] | None = field(default=None, compare=False)  # the notification's, for the chain


@dataclass(frozen=True, slots=True)
class Notified:
    """Any other notification of the client's (``notifications/initialized``, a cancel of nothing in flight, one
    the session has no use for): it still passes the gateway's chain."""

    method: str
    params: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class Answered:
    """The client answered a request Bastion sent it (``ServerSession.outgoing_request``)."""

    request_id: str
    answer: Response | ErrorResponse


@dataclass(frozen=True, slots=True)
class UnknownAnswer:
    """A response to no request Bastion has outstanding with the client: ignored."""

    request_id: Any


Event = Union[Send, CloseConnection, Invalid, Initialize, Serve, Discover, Listen, Cancel, RootsChanged, Notified,
              Answered, UnknownAnswer]


@dataclass(slots=True)
class _Handshake:
    protocol_version: str
    client_capabilities: Mapping[str, Any]
    client_info: Mapping[str, Any] | None


@dataclass(slots=True)
class _Listen:
    agreed: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- session
class ServerSession:
    """The protocol state of one client connection (a handshake-era session, or a 2026-07-28 client's requests
    on one transport)."""

    def __init__(self, *, server_info: Mapping[str, Any], max_message_bytes: int = jsonrpc.DEFAULT_MAX_MESSAGE_BYTES,
                 era: str | None = None) -> None:
        self.server_info = dict(server_info)
        self.max_message_bytes = max_message_bytes
        self.era: str | None = era  # "legacy" or "modern", from the first message unless the transport knows
        self.lifecycle = ServerLifecycle()
        self.log_level: str | None = None  # the handshake era's logging/setLevel
        self._handshake: _Handshake | None = None
        self._answered_initialize = False
        self._in_flight: set[Any] = set()  # ids of the client's requests being served
        self._listens: dict[Any, _Listen] = {}  # 2026-07-28 subscriptions/listen in force, by request id
        self._log_opt_ins: dict[Any, str] = {}  # 2026-07-28 requests in flight that asked for logs: id -> level
        self._outgoing: set[str] = set()  # ids of Bastion's requests the client has not answered
        # What those ids begin with: replicas sharing a session each use their own, so that one tells the answers
        # to its own requests from another's.
        self.outgoing_prefix = _OUTGOING_PREFIX
        self._outgoing_ids = itertools.count(1)

    # ---------------------------------------------------------------------------------------- input
    def receive_frame(self, frame: bytes, decoded: Any = None) -> list[Event]:
        """One frame as the client sent it (without its newline); ``decoded``, when given, is what ``read_frame``
        made of it (its value, or why it is refused), already done by the transport: it is classified without
        reading the bytes again. Every frame has the one verdict ``read_frame`` gives, whoever read it."""
        if not frame or frame.isspace():  # a blank line is no message; isspace stops at the first other byte
            return []
        if decoded is None or len(frame) > self.max_message_bytes:
            decoded = read_frame(frame, self.max_message_bytes)
        message = decoded if type(decoded) is InvalidFrame else parse_message(decoded)
        if isinstance(message, InvalidFrame):
            events: list[Event] = [] if message.reply is None else [Send(message.reply)]
            events.append(Invalid(message.reason))
            return events
        return self.receive(message)

    def frame_too_large(self, size: int) -> list[Event]:
        """The transport dropped a frame over the size limit."""
        return [Send(ErrorResponse(None, jsonrpc.error(
            jsonrpc.INVALID_REQUEST,
            f"message of at least {size} bytes exceeds the limit of {self.max_message_bytes} bytes")))]

    def receive(self, message: Message) -> list[Event]:
        """One parsed message from the client."""
        if self.era is None and isinstance(message, (Request, Notification)):
            self.era = "modern" if is_modern_first_message(message.method, message.params) else "legacy"
        if self.era == "legacy":
            verdict = self.lifecycle.receive(message)
            if verdict.action is not Action.ACCEPT:
                events: list[Event] = [] if verdict.reply is None else [Send(verdict.reply)]
                if verdict.action is Action.REJECT_AND_CLOSE:
                    events.append(CloseConnection())
                return events
        kind = type(message)
        if kind is Request:
            return self._request(message)  # type: ignore[arg-type]
        if kind is Notification:
            return self._notification(message)  # type: ignore[arg-type]
        return self._response(message)  # type: ignore[arg-type]

    def _request(self, message: Request) -> list[Event]:
        if message.id in self._in_flight:
            return [Send(ErrorResponse(message.id, jsonrpc.error(
                jsonrpc.INVALID_REQUEST, f"request id {message.id!r} is already in flight")))]
        if self.era == "modern":
            return self._modern_request(message)
        return self._legacy_request(message)

    def _legacy_request(self, message: Request) -> list[Event]:
        params = message.params or {}
        if message.method == "initialize":
            capabilities = params.get("capabilities") if isinstance(params.get("capabilities"), dict) else {}
            client_info = params.get("clientInfo") if isinstance(params.get("clientInfo"), dict) else None
            version = negotiate_legacy(params.get("protocolVersion"))
            self._handshake = _Handshake(version, capabilities, client_info)
            self._in_flight.add(message.id)
            return [Initialize(message, version, capabilities, client_info)]
        if message.method == "logging/setLevel":
            level = params.get("level")
            if level not in LOG_LEVELS:
                return [Send(ErrorResponse(message.id, jsonrpc.error(
                    jsonrpc.INVALID_PARAMS, f"invalid log level {level!r}")))]
            self.log_level = level  # and forwarded, for the servers' own filtering
        handshake = self._handshake or _Handshake("", {}, None)
        self._in_flight.add(message.id)
        return [Serve(message, "legacy", handshake.protocol_version, handshake.client_capabilities,
                      handshake.client_info, self.log_level or "debug")]

    def _modern_request(self, message: Request) -> list[Event]:
        envelope = read_envelope(message.params)
        if not isinstance(envelope, Envelope):
            return [Send(ErrorResponse(message.id, envelope))]
        if message.method == "subscriptions/listen":
            wanted = (message.params or {}).get("notifications")
            wanted = wanted if isinstance(wanted, dict) else {}
            uris = wanted.get("resourceSubscriptions")
            if isinstance(uris, list) and len(uris) > MAX_SUBSCRIPTIONS:
                return [Send(ErrorResponse(message.id, jsonrpc.error(
                    jsonrpc.INVALID_PARAMS, f"a listen may subscribe to at most {MAX_SUBSCRIPTIONS} resources; "
                                            f"this one names {len(uris)}")))]
            self._in_flight.add(message.id)
            return [Listen(message, wanted)]
        self._in_flight.add(message.id)
        if message.method == DISCOVER:
            return [Discover(message)]
        if envelope.log_level is not None:
            self._log_opt_ins[message.id] = envelope.log_level
        return [Serve(message, "modern", envelope.protocol_version, envelope.client_capabilities,
                      envelope.client_info, envelope.log_level)]

    def _notification(self, message: Notification) -> list[Event]:
        if message.method == "notifications/cancelled":
            request_id = (message.params or {}).get("requestId")
            # Only an id (a string or an integer) names a request: an object would not hash, and true or 1.0 would
            # cancel request 1 as equal to it.
            if is_valid_id(request_id):
                self._listens.pop(request_id, None)
                if request_id in self._in_flight:
                    return [Cancel(request_id, message.params)]
        elif message.method == "notifications/roots/list_changed":
            return [RootsChanged(message.params)]
        return [Notified(message.method, message.params)]

    def _response(self, message: Response | ErrorResponse) -> list[Event]:
        if isinstance(message.id, str) and message.id in self._outgoing:
            self._outgoing.discard(message.id)
            return [Answered(message.id, message)]
        return [UnknownAnswer(message.id)]

    def request_started(self, request_id: Any) -> bool:
        """A request the driver read itself (a fast path that skips ``receive``): held in flight like the
        others. False when its id is already in flight (``receive`` then refuses it)."""
        if request_id in self._in_flight:
            return False
        self._in_flight.add(request_id)
        return True

    def request_done(self, request_id: Any) -> None:
        """The driver is done with a request (answered, cancelled or failed): its id may be used again."""
        self._in_flight.discard(request_id)
        self._log_opt_ins.pop(request_id, None)
        self._listens.pop(request_id, None)

    def in_flight(self) -> frozenset[Any]:
        return frozenset(self._in_flight)

    # -------------------------------------------------------------------------------- handshake era
    @property
    def client_capabilities(self) -> Mapping[str, Any]:
        """What a handshake-era client declared at its ``initialize`` (nothing before it, or in the 2026 era)."""
        return self._handshake.client_capabilities if self._handshake is not None else {}

    @property
    def client_info(self) -> Mapping[str, Any] | None:
        return self._handshake.client_info if self._handshake is not None else None

    @property
    def protocol_version(self) -> str:
        return self._handshake.protocol_version if self._handshake is not None else ""

    def initialize_result(self, request: Request, capabilities: Mapping[str, Any],
                          instructions: str | None) -> Response:
        """The answer to ``initialize``. Nothing else may reach the client before it: notifications wait for it."""
        result: dict[str, Any] = {
            "protocolVersion": self.protocol_version or negotiate_legacy(None),
            "capabilities": dict(capabilities),
            "serverInfo": self.server_info,
        }
        if instructions:
            result["instructions"] = instructions
        self._answered_initialize = True
        return Response(request.id, result)

    def restore(self, protocol_version: str, client_capabilities: Mapping[str, Any],
                client_info: Mapping[str, Any] | None, *, initialized: bool, log_level: str | None) -> None:
        """Take up a handshake-era session another process began (a replica of the gateway): its handshake is
        done (answered, and ``initialized`` when the client said so), nothing of it is replayed."""
        self.era = "legacy"
        self._handshake = _Handshake(protocol_version, dict(client_capabilities), client_info)
        self._answered_initialize = True
        self.lifecycle.state = State.ACTIVE if initialized else State.INITIALIZING
        self.log_level = log_level if log_level in LOG_LEVELS else None

    def follow(self, *, initialized: bool, log_level: str | None) -> None:
        """What the client said to another process of the gateway (a replica) since this one took the session up:
        ``notifications/initialized`` (a handshake is never undone), the log level it set last."""
        if initialized and self._answered_initialize and self.lifecycle.state is State.INITIALIZING:
            self.lifecycle.state = State.ACTIVE
        self.log_level = log_level if log_level in LOG_LEVELS else None

    @property
    def initialized(self) -> bool:
        """Whether the client has said ``notifications/initialized`` (its session is in use)."""
        return self.lifecycle.state is State.ACTIVE

    @property
    def ready_for_notifications(self) -> bool:
        """A handshake-era client may pipeline notifications/initialized before it has read the initialize
        result; nothing may reach it ahead of that result."""
        return self._answered_initialize and self.lifecycle.state is State.ACTIVE

    @property
    def handshake_answered(self) -> bool:
        return self._answered_initialize

    def connection_lost(self) -> None:
        self.lifecycle.transport_dropped()
        self._outgoing.clear()

    # ---------------------------------------------------------------------------------- 2026-07-28
    def discover_result(self, request: Request, capabilities: Mapping[str, Any],
                        instructions: str | None) -> Response:
        result: dict[str, Any] = {"supportedVersions": list(MODERN_VERSIONS), "capabilities": dict(capabilities)}
        if instructions:
            result["instructions"] = instructions
        return Response(request.id, self.modern_result(DISCOVER, result))

    def listen_opened(self, listen: Listen, capabilities: Mapping[str, Any]) -> tuple[dict[str, Any], Notification]:
        """What the gateway agrees to send on a listen stream (only kinds its capabilities have), and the
        acknowledgement that opens it. The resource URIs agreed are the driver's to subscribe to."""
        agreed: dict[str, Any] = {}
        for key, capability in _LISTEN_CAPABILITY.items():
            if listen.wanted.get(key) and capability in capabilities:
                agreed[key] = True
        uris = listen.wanted.get("resourceSubscriptions")
        if isinstance(uris, list) and "resources" in capabilities:
            agreed["resourceSubscriptions"] = list(dict.fromkeys(u for u in uris if isinstance(u, str)))
        if listen.request.id in self._in_flight:  # not cancelled meanwhile
            self._listens[listen.request.id] = _Listen(agreed)
        return agreed, Notification("notifications/subscriptions/acknowledged",
                                    {"notifications": agreed, "_meta": {META_SUBSCRIPTION_ID: listen.request.id}})

    def modern_result(self, method: str, result: Mapping[str, Any]) -> dict[str, Any]:
        """A result as a 2026-07-28 client reads it: a result type, Bastion's server info, cache hints."""
        out = dict(result)
        out.setdefault("resultType", "complete")
        meta = dict(out.get("_meta") or {})
        meta[META_SERVER_INFO] = self.server_info
        out["_meta"] = meta
        if method in CACHEABLE or method == DISCOVER:
            # Lists are filtered per identity by policy, so they may never be shared across identities.
            out.setdefault("ttlMs", 0)
            out["cacheScope"] = "private"
        return out

    # ---------------------------------------------------------------------------------------- output
    def result(self, request_id: Any, method: str, result: Mapping[str, Any]) -> Response:
        """A gateway result as this client's era writes it."""
        if self.era == "modern":
            return Response(request_id, self.modern_result(method, result))
        return Response(request_id, legacy_result(result))

    def list_changed(self, method: str) -> list[Notification]:
        """A list changed: a handshake-era client is told once it is ready, a 2026-07-28 client on each listen
        stream that asked for that kind."""
        if self.era == "legacy":
            return [Notification(method, None)] if self.ready_for_notifications else []
        key = LISTEN_KEYS.get(method)
        return [Notification(method, {"_meta": {META_SUBSCRIPTION_ID: listen_id}})
                for listen_id, listen in self._listens.items() if key is not None and listen.agreed.get(key)]

    def resource_updated(self, params: Mapping[str, Any]) -> list[Notification]:
        """A resource changed; the caller has checked that this client subscribed to it (handshake era), or the
        listen streams that cover its URI say so (2026-07-28)."""
        if self.era == "legacy":
            return [Notification("notifications/resources/updated", dict(params))] if self.ready_for_notifications else []
        uri = params.get("uri")
        # The server's own _meta goes on as it came (a sequence of its own in it lets a client check the order);
        # only the subscription id is Bastion's.
        meta = params.get("_meta")
        kept = meta if isinstance(meta, dict) else {}
        return [Notification("notifications/resources/updated",
                             {**params, "_meta": {**kept, META_SUBSCRIPTION_ID: listen_id}})
                for listen_id, listen in self._listens.items() if uri in listen.agreed.get("resourceSubscriptions", ())]

    def log_message(self, params: Mapping[str, Any]) -> list[Notification]:
        """A server's log message: to a handshake-era client at or above its level (every level until it sets
        one), to a 2026-07-28 client while one of its requests asks for that level."""
        level = params.get("level")
        if self.era == "legacy":
            if not self.ready_for_notifications:
                return []
            if self.log_level is None or at_least(level, self.log_level):
                return [Notification("notifications/message", dict(params))]
            return []
        if any(at_least(level, wanted) for wanted in self._log_opt_ins.values()):
            return [Notification("notifications/message", dict(params))]
        return []

    def wants(self, kind: str) -> bool:
        """Whether this client asked for notifications of ``kind`` without an origin: ``"logs"``, or a list
        changed notification's method."""
        if kind == "logs":
            return (self.era == "legacy" and self.ready_for_notifications) or bool(self._log_opt_ins)
        if self.era == "legacy":
            return self.ready_for_notifications
        key = LISTEN_KEYS.get(kind)
        return any(listen.agreed.get(key) for listen in self._listens.values()) if key else False

    def outgoing_request(self, method: str, params: Mapping[str, Any]) -> Request:
        """A request from Bastion to the client (sampling, elicitation, roots: handshake era only), under an id
        of Bastion's own that its answer is told apart by."""
        request_id = f"{self.outgoing_prefix}{next(self._outgoing_ids)}"
        self._outgoing.add(request_id)
        return Request(request_id, method, dict(params))

    def expects(self, request_id: Any) -> bool:
        """Whether ``request_id`` is one of Bastion's requests to the client that awaits its answer."""
        return isinstance(request_id, str) and request_id in self._outgoing

    def outgoing_abandoned(self, request_id: str) -> Notification:
        """Bastion no longer wants the answer to one of its requests: the cancellation to tell the client."""
        self._outgoing.discard(request_id)
        return Notification("notifications/cancelled", {"requestId": request_id})


def legacy_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the 2026-07-28 envelope fields a modern server adds; a handshake-era client has no use for them."""
    if "resultType" not in result and "_meta" not in result:
        return result if type(result) is dict else dict(result)
    out = {k: v for k, v in result.items() if k != "resultType"}
    meta = out.get("_meta")
    if isinstance(meta, dict):
        meta = {k: v for k, v in meta.items() if not k.startswith(_MODERN_META_PREFIX)}
        if meta:
            out["_meta"] = meta
        else:
            del out["_meta"]
    return out


def at_least(level: Any, threshold: str) -> bool:
    """Whether a log message at ``level`` passes ``threshold``; a level Bastion does not know always passes."""
    try:
        return LOG_LEVELS.index(level) >= LOG_LEVELS.index(threshold)
    except ValueError:
        return True
