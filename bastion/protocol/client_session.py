"""Bastion's side of the conversation with one upstream server, as plain objects: no I/O, no clock, no tasks.

``ClientSession`` decides what the handshake sends and what its answers mean (the ``server/discover`` probe of a
2026-07-28 server, the legacy ``initialize`` when the probe is refused or unanswered), stamps outgoing requests
for the server's era, keeps their correlation (fresh ids and progress tokens on this hop, deadlines passed in)
and reads what the server sends into events. Whoever owns the transport sends the frames it returns and hands it
the frames that arrive, and acts on the events: answers go to whoever waits, notifications and the server's own
requests to the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Union

from bastion.protocol import jsonrpc
from bastion.protocol.correlation import Correlator, Pending
from bastion.protocol.framing import Oversize
from bastion.protocol.jsonrpc import (
    NOT_READ,
    ErrorResponse,
    InvalidFrame,
    Notification,
    RawResponse,
    Request,
    Response,
    edge_members,
    is_valid_id,
    parse_frame,
    parse_raw_response,
)
from bastion.protocol.lifecycle import ClientLifecycle, capabilities_problem
from bastion.protocol.versions import (
    DISCOVER,
    LATEST_LEGACY,
    LEGACY_VERSIONS,
    META_SERVER_INFO,
    MODERN_VERSIONS,
    modern_meta,
)

PROBE_TIMEOUT = 10.0  # legacy servers answer the probe with an error at once; silence is rare
MODERN_META_PREFIX = "io.modelcontextprotocol/"
SELF = "bastion"  # origin of the requests Bastion makes on its own behalf (the handshake, lists, the listen stream)
_ABANDONED_KEPT = 10_000  # ids given up on whose late answers are still expected; forgotten past this many

Encoder = Callable[[Any, str, Any], bytes]


# ------------------------------------------------------------------------------------------ the handshake
@dataclass(frozen=True, slots=True)
class Exchange:
    """Send this request on Bastion's own behalf and hand its answer (or its silence) back to the handshake."""

    method: str
    params: dict[str, Any]
    timeout: float | None  # None: bounded only by the server's startup_timeout


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What a completed handshake says about the server."""

    era: str  # "legacy" or "modern"
    protocol_version: str
    capabilities: dict[str, Any]
    server_info: dict[str, Any] | None
    instructions: str | None


@dataclass(frozen=True, slots=True)
class Ready:
    """The handshake is complete: send ``notify`` if any (legacy's notifications/initialized), then use the server."""

    facts: ServerFacts
    notify: Notification | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    reason: str


HandshakeStep = Union[Exchange, Ready, Failed]


class Handshake:
    """The decisions of one handshake: the era probe first unless the era is configured, then legacy if need be.

    ``first()`` gives the first step; each answer goes to ``answered`` and a step that got no answer within its
    timeout to ``timed_out``; each returns the next step, until ``Ready`` or ``Failed``.
    """

    def __init__(self, era: str, client_capabilities: Mapping[str, Any], client_info: Mapping[str, Any]) -> None:
        if era not in ("auto", "legacy", "modern"):
            raise ValueError(f"unknown era {era!r}")
        self._era = era
        self._capabilities = dict(client_capabilities)
        self._client_info = dict(client_info)
        self._lifecycle: ClientLifecycle | None = None
        self._waiting: str | None = None
        self._probe_retried = False

    def first(self) -> HandshakeStep:
        return self._initialize() if self._era == "legacy" else self._probe()

    def answered(self, answer: Response | ErrorResponse) -> HandshakeStep:
        waiting, self._waiting = self._waiting, None
        if waiting == DISCOVER:
            return self._probe_answered(answer)
        if waiting == "initialize":
            return self._initialize_answered(answer)
        return Failed(f"an answer arrived while the handshake waited for none ({waiting!r})")

    def timed_out(self) -> HandshakeStep:
        waiting, self._waiting = self._waiting, None
        if waiting == DISCOVER and self._era == "auto":
            return self._initialize()  # silence is a legacy server that ignores what it does not know
        return Failed(f"no answer to {waiting}")

    def _probe(self) -> Exchange:
        self._waiting = DISCOVER
        timeout = None if self._era == "modern" else PROBE_TIMEOUT
        return Exchange(DISCOVER, {"_meta": modern_meta(self._capabilities, self._client_info)}, timeout)

    def _probe_answered(self, answer: Response | ErrorResponse) -> HandshakeStep:
        """``server/discover`` answered with a modern version means modern; anything else, legacy.

        An unsupported-version error that lists a modern version Bastion speaks is a modern server's own answer:
        the probe is sent again, once, rather than taking the server for a legacy one."""
        if isinstance(answer, ErrorResponse) and not self._probe_retried and _offers_a_modern_version(answer):
            self._probe_retried = True
            return self._probe()
        if isinstance(answer, Response):
            result = answer.result
            versions = result.get("supportedVersions")
            if isinstance(versions, list):
                version = next((v for v in MODERN_VERSIONS if v in versions), None)
                if version is not None:
                    problem = capabilities_problem(result)
                    if problem is not None:
                        return Failed(problem)
                    meta = result.get("_meta")
                    server_info = meta.get(META_SERVER_INFO) if isinstance(meta, dict) else None
                    instructions = result.get("instructions")
                    return Ready(ServerFacts(
                        "modern", version, result.get("capabilities") or {},
                        server_info if isinstance(server_info, dict) else None,
                        instructions if isinstance(instructions, str) else None,
                    ))
        if self._era == "modern":
            return Failed("the server does not speak the 2026-07-28 protocol")
        return self._initialize()

    def _initialize(self) -> Exchange:
        self._lifecycle = ClientLifecycle(LEGACY_VERSIONS)
        self._lifecycle.start()
        self._waiting = "initialize"
        params = {"protocolVersion": LATEST_LEGACY, "capabilities": dict(self._capabilities),
                  "clientInfo": dict(self._client_info)}
        return Exchange("initialize", params, None)

    def _initialize_answered(self, answer: Response | ErrorResponse) -> HandshakeStep:
        assert self._lifecycle is not None
        problem = self._lifecycle.initialize_answered(answer)
        if problem is not None:
            return Failed(problem)
        assert isinstance(answer, Response)
        self._lifecycle.initialized_sent()
        result = answer.result
        server_info = result.get("serverInfo")
        instructions = result.get("instructions")
        return Ready(
            ServerFacts("legacy", result["protocolVersion"], result.get("capabilities") or {},
                        server_info if isinstance(server_info, dict) else None,
                        instructions if isinstance(instructions, str) else None),
            Notification("notifications/initialized", None),
        )


def _offers_a_modern_version(answer: ErrorResponse) -> bool:
    error = answer.error
    if error.get("code") != jsonrpc.UNSUPPORTED_PROTOCOL_VERSION or not isinstance(error.get("data"), dict):
        return False
    supported = error["data"].get("supported")
    return isinstance(supported, list) and any(version in MODERN_VERSIONS for version in supported)


# ------------------------------------------------------------------------------- what the server sends
@dataclass(slots=True)
class Answered:
    """The answer to a request in flight: ``message`` settles ``pending``."""

    pending: Pending
    message: Response | ErrorResponse | RawResponse


@dataclass(slots=True)
class Unmatched:
    """An answer to no request in flight; ``expected`` when it answers one given up on (or the listen stream)."""

    id: Any
    expected: bool


@dataclass(slots=True)
class ServerNotification:
    """A notification for the gateway; ``pending`` is the request it is about (progress), else None."""

    method: str
    params: dict[str, Any]
    pending: Pending | None


@dataclass(slots=True)
class ServerCancelled:
    """The server withdrew one of its own requests to the client."""

    request_id: Any


@dataclass(slots=True)
class ServerRequest:
    """A request from the server to the client (sampling, elicitation, roots, its ping, ...): the gateway answers
    it, after the interceptor chain (a ping and a method relayed to no client are answered by Bastion itself)."""

    request: Request


@dataclass(slots=True)
class Garbage:
    """A frame that is not JSON-RPC: ``reason`` says why."""

    frame: bytes
    reason: str


@dataclass(slots=True)
class Ignored:
    """A frame with nothing to do: blank, or progress for no request in flight."""


@dataclass(slots=True)
class Dropped:
    """A request or notification from the server too large to read (over ``max_message_bytes``), dropped; a request
    is owed ``reply``, the error that says so."""

    what: str  # "request" or "notification", and its method when known
    reply: bytes | None


@dataclass(slots=True)
class Unattributed:
    """A frame too large to read whose request cannot be told: whatever it answered is lost. Nothing the server
    has in flight can be trusted to be answered any more."""

    reason: str


Event = Union[Answered, Unmatched, ServerNotification, ServerCancelled, ServerRequest, Garbage, Ignored, Dropped,
              Unattributed]
_IGNORED = Ignored()


class ClientSession:
    """One upstream server's conversation: its era, its requests in flight, the meaning of what it sends."""

    def __init__(self, name: str, *, era: str = "auto", client_info: Mapping[str, Any],
                 client_capabilities: Mapping[str, Any] | None = None, max_message_bytes: int) -> None:
        self.name = name
        self.configured_era = era
        self.client_info = dict(client_info)
        self.client_capabilities: dict[str, Any] = dict(client_capabilities or {})
        self.max_message_bytes = max_message_bytes
        self.era: str | None = None if era == "auto" else era
        self.facts: ServerFacts | None = None
        self.correlator = Correlator()
        self._abandoned: set[int] = set()
        self.listen_id: int | None = None
        self._self_ids = 0

    # ----------------------------------------------------------------------------------------- handshake
    def handshake(self) -> Handshake:
        """The decisions of a new handshake. A server restarted keeps the era it was found to speak (a modern
        one that no longer answers the probe fails its start rather than turn legacy), and the facts of its last
        handshake stand until the new one completes."""
        self.listen_id = None
        return Handshake(self.era or "auto", self.client_capabilities, self.client_info)

    def adopt(self, facts: ServerFacts) -> None:
        """The handshake is complete: requests are stamped for ``facts.era`` from now on."""
        self.facts = facts
        self.era = facts.era

    @property
    def capabilities(self) -> dict[str, Any]:
        return self.facts.capabilities if self.facts is not None else {}

    # ------------------------------------------------------------------------------------------ requests
    def outgoing_params(self, params: dict[str, Any] | None, progress_token: Any = None, log_level: str | None = None,
                        client_capabilities: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A request's params as this server is sent them: a modern server's carry the envelope (the requesting
        client's capabilities, Bastion's client info, the log level); a client's own envelope and progress token
        never pass (the token is this hop's, set when the request is framed). ``params`` is never changed."""
        if params is None:
            params = {}
        if progress_token is None and self.era != "modern" and "_meta" not in params:
            return params  # nothing to rewrite
        out = dict(params)
        meta = out.get("_meta")
        meta = {k: v for k, v in meta.items() if not k.startswith(MODERN_META_PREFIX)} if isinstance(meta, dict) else {}
        meta.pop("progressToken", None)
        if self.era == "modern":
            capabilities = self.client_capabilities if client_capabilities is None else client_capabilities
            meta.update(modern_meta(capabilities, self.client_info, log_level))
        if meta or progress_token is not None:
            out["_meta"] = meta
        else:
            out.pop("_meta", None)
        return out

    def begin(self, method: str, params: dict[str, Any] | None, *, origin: Hashable = SELF, origin_id: Any = None,
              deadline: float | None = None, progress_token: Any = None, context: Any = None,
              encode: Encoder = jsonrpc.request_frame) -> tuple[Pending, bytes]:
        """Register a request and frame it under this hop's id (and progress token, put in ``params["_meta"]``,
        which ``outgoing_params`` made). Raises ``DuplicateRequestId`` for an id the origin has in flight; the
        caller ``forget``s the request if the frame cannot be sent."""
        if origin_id is None:
            self._self_ids += 1
            origin_id = f"self:{self._self_ids}"
        pending = self.correlator.register(origin, origin_id, method, deadline=deadline,
                                           progress_token=progress_token, context=context)
        if progress_token is not None and params is not None:
            params["_meta"]["progressToken"] = pending.upstream_progress_token
        try:
            frame = encode(pending.upstream_id, method, params)
        except Exception:
            self.correlator.resolve(pending.upstream_id)
            raise
        return pending, frame

    def forget(self, pending: Pending) -> None:
        """A request that never left (its frame could not be sent)."""
        self.correlator.resolve(pending.upstream_id)

    def abandon(self, pending: Pending, reason: str) -> bytes:
        """Give a request up (its caller went, or its deadline passed): the cancellation to send the server. Its
        late answer is expected, and dropped quietly."""
        if len(self._abandoned) > _ABANDONED_KEPT:
            self._abandoned.clear()
        self._abandoned.add(pending.upstream_id)
        self.correlator.resolve(pending.upstream_id)
        return jsonrpc.encode(Notification("notifications/cancelled", {"requestId": pending.upstream_id,
                                                                       "reason": reason}))

    def expired(self, now: float) -> list[Pending]:
        """The requests whose deadline has passed, taken out of the table; each is owed ``abandon`` and an error."""
        late = self.correlator.expired(now)
        for pending in late:
            if len(self._abandoned) > _ABANDONED_KEPT:
                self._abandoned.clear()
            self._abandoned.add(pending.upstream_id)
        return late

    def drain(self) -> list[Pending]:
        """The server is gone: every request in flight, taken out of the table, each owed an error."""
        self.listen_id = None
        return self.correlator.drain()

    # ------------------------------------------------------------------------------------- listen stream
    def listen_request(self, wanted: Mapping[str, Any], resources: list[str]) -> tuple[list[bytes], bool]:
        """The frames that (re)open a modern server's ``subscriptions/listen`` for ``wanted`` notifications and
        ``resources``: the cancellation of the stream it replaces, if any, and the new one. The bool says whether
        a stream is wanted at all (nothing is sent otherwise)."""
        frames: list[bytes] = []
        if self.listen_id is not None:
            previous = self.correlator.resolve(self.listen_id)
            if previous is not None:
                frames.append(jsonrpc.encode(Notification("notifications/cancelled",
                                                          {"requestId": previous.upstream_id})))
            self.listen_id = None
        notifications = dict(wanted)
        if resources:
            notifications["resourceSubscriptions"] = list(resources)
        if not any(notifications.values()):
            return frames, bool(frames)
        params = {"notifications": notifications, "_meta": modern_meta(self.client_capabilities, self.client_info)}
        pending, frame = self.begin("subscriptions/listen", params)
        self.listen_id = pending.upstream_id
        frames.append(frame)
        return frames, True

    # --------------------------------------------------------------------------------------------- reading
    def receive(self, frame: bytes) -> Event:
        """What one frame from the server means."""
        if not frame or frame.isspace():
            return _IGNORED
        answer = parse_raw_response(frame, self.max_message_bytes)
        if answer is not None:
            return self._answer(answer)
        message = parse_frame(frame, self.max_message_bytes, max_depth=None)  # a server's: orjson's bound only
        kind = type(message)
        if kind is Response or kind is ErrorResponse:
            return self._answer(message)  # type: ignore[arg-type]
        if kind is Notification:
            return self._notification(message)  # type: ignore[arg-type]
        if kind is Request:
            return ServerRequest(message)  # type: ignore[arg-type]
        assert isinstance(message, InvalidFrame)
        return Garbage(frame, message.reason)

    def oversize(self, frame: Oversize) -> Event:
        """What a frame over ``max_message_bytes`` (dropped unread) means, told from its first and last bytes.

        An answer to a request in flight is that request's error (``Answered``), saying the answer was too large; a
        request or a notification from the server is ``Dropped``; anything else is ``Unattributed``.
        """
        too_large = f"a message of {frame.size} bytes, over max_message_bytes ({frame.limit})"
        members = edge_members(frame.head, frame.tail if frame.whole else b"") or {}
        rid = members.get("id", NOT_READ)
        if "method" in members:
            what = "request" if "id" in members else "notification"
            if isinstance(members["method"], str):
                what += f" {members['method']}"
            reply = None
            if is_valid_id(rid):
                reply = jsonrpc.encode(ErrorResponse(rid, jsonrpc.error(
                    jsonrpc.INVALID_REQUEST, f"Bastion dropped {too_large} unread")))
            return Dropped(what, reply)
        if ("result" in members or "error" in members) and is_valid_id(rid):
            event = self._answer(ErrorResponse(rid, {}))
            if type(event) is Answered:
                event.message = ErrorResponse(rid, jsonrpc.error(  # type: ignore[union-attr]
                    jsonrpc.INTERNAL_ERROR, f"server {self.name!r} answered {event.pending.method} "  # type: ignore[union-attr]
                    f"with {too_large}; Bastion dropped it unread"))
            return event
        return Unattributed(f"sent {too_large}, whose request could not be told")

    def _answer(self, message: Response | ErrorResponse | RawResponse) -> Event:
        pending = self.correlator.resolve(message.id)
        if pending is None:
            if message.id in self._abandoned:
                self._abandoned.discard(message.id)  # type: ignore[arg-type]
                return Unmatched(message.id, True)
            return Unmatched(message.id, message.id == self.listen_id and message.id is not None)
        if pending.upstream_id == self.listen_id:
            self.listen_id = None  # the server ended the stream; a list_changed later reopens nothing by itself
        return Answered(pending, message)

    def _notification(self, message: Notification) -> Event:
        params = message.params or {}
        if message.method == "notifications/progress":
            pending = self.correlator.find_by_progress_token(params.get("progressToken"))
            if pending is None:
                return _IGNORED
            return ServerNotification(message.method, params, pending)
        if message.method == "notifications/cancelled":
            request_id = params.get("requestId")
            # Only an id names a request: an object would not hash where the relay is looked up, and true or 1.0
            # would cancel the relay of request 1 as equal to it.
            return ServerCancelled(request_id) if is_valid_id(request_id) else _IGNORED
        return ServerNotification(message.method, params, None)
