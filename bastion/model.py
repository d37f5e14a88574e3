"""The vocabulary every part of Bastion shares: who a client is, a tool in the catalog, a client's session, a request
on its way through the interceptor chain, and the error that refuses one.

It imports nothing else of Bastion, so the pure deciders (policy, guards, search) and the gateway can all speak
it without depending on one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence

import msgspec

_decode_name = msgspec.json.Decoder(str).decode


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is on the other side of a frontend connection: the configured identity of a stdio client, or the
    principal an HTTP request authenticated as (see ``bastion/auth``).

    Two identities are the same caller when name, groups, issuer and method agree; the scopes and claims of one
    token may differ from the next token's of the same caller, so they take no part in equality."""

    name: str
    groups: tuple[str, ...] = ()
    # how it was established: "configured" (stdio, or HTTP without authentication), "header"
    # (http.identity_header), "oauth", "api_key", "mtls"
    authenticated_by: str = "configured"
    issuer: str | None = None  # the token's issuer (oauth), None otherwise
    scopes: frozenset[str] = field(default=frozenset(), compare=False)
    # the attributes auth.claims names (tenant, custom claims), as the policy's principal attributes
    claims: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # the bearer token this request presented, kept only as the subject of an RFC 8693 token exchange upstream;
    # never forwarded, never logged, never written
    subject_token: str | None = field(default=None, compare=False, hash=False, repr=False)

    def record(self) -> dict[str, Any]:
        """Who, as audit and approval records name the caller: name, groups, method and issuer (when there is
        one); never the token, and not the claims (they may be personal data the policy alone needs)."""
        who: dict[str, Any] = {"name": self.name, "groups": list(self.groups), "authenticated_by": self.authenticated_by}
        if self.issuer is not None:
            who["issuer"] = self.issuer
        return who

    def describe(self) -> str:
        """Who, in words for a log line or an approval prompt: ``alice (oauth, https://id.example.com)``."""
        how = self.authenticated_by if self.issuer is None else f"{self.authenticated_by}, {self.issuer}"
        return f"{self.name} ({how})"


class ClientChannel(Protocol):
    """What an interceptor may ask of the connected client (for example, human approval)."""

    def supports(self, capability: str) -> bool:
        """True when the client declared ``capability`` (``"sampling"``, ``"elicitation"``, ``"roots"``)."""

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Send a server→client request (legacy era only) and return its result, or raise GatewayError."""

    def list_changed(self, method: str) -> None:
        """Tell the client a list changed (``notifications/tools/list_changed`` …), in its era's way."""

    def notify(self, method: str, params: Mapping[str, Any] | None) -> None:
        """Send the client a notification (``notifications/progress``, ``notifications/message``) now; the
        caller has checked that its era and log level take it."""


@dataclass(slots=True)
class Session:
    """One client connection (legacy era) or one request's envelope (modern era)."""

    identity: Identity
    era: str  # "legacy" or "modern"
    protocol_version: str
    client_capabilities: Mapping[str, Any]
    client_info: Mapping[str, Any] | None = None
    session_id: str = ""
    client: ClientChannel | None = None
    # Facts interceptors keep for the life of the session (remembered approvals, counters).
    facts: dict[str, Any] = field(default_factory=dict)
    # The host API and ``bastion tools`` find tools themselves: the exposure modes, which are for MCP clients, pass
    # their requests as they are (every other interceptor sees them as any client's).
    finds_tools_itself: bool = False
    # The client reaches Bastion over the network (HTTP): what answers there is most often an agent, not a person.
    over_network: bool = False


@dataclass(frozen=True, slots=True)
class ToolEntry:
    """A tool as the federated catalog knows it."""

    exposed_name: str  # the name the client sees, e.g. "git__git_status"
    server: str  # configured server name
    original_name: str  # the name the upstream server uses
    definition: Mapping[str, Any]  # the upstream Tool object, with ``name`` rewritten to exposed_name
    server_trust: str = "untrusted"
    # Bastion counts it read-only whatever the server's trust: a reference package's read, or a plausible claim held
    # still by pinning (bastion/clients/known_tools.py).
    reads_only: bool = False
    # The client's file approves it in advance (autoApprove / alwaysAllow): no guardrail asks about it either.
    pre_approved: bool = False


class CatalogView(Protocol):
    def tool(self, exposed_name: str) -> ToolEntry | None:
        """The tool a client would reach under ``exposed_name``, or None."""

    def tools(self) -> Sequence[ToolEntry]:
        """Every tool in the federated catalog, in a stable order: a new sequence whenever the catalog changes,
        never one changed in place, so a caller can tell that nothing changed by identity."""


# ``session.facts[WITHHELD_TOOLS]``: per screen that withholds definitions from lists (pinning, the metadata scan), the
# exposed names of the tools it left out of this session's latest tools/list; it refuses calls to them itself. The
# search exposure passes a ``call_tool`` of such a name on, so the call gets that screen's refusal (what was withheld
# and how a person reviews it) rather than "unknown tool"; a name no screen withheld stays unknown.
WITHHELD_TOOLS = "screens.withheld_tools"


def withheld_tools(session: "Session") -> frozenset[str]:
    """The tools some screen withheld from this session's latest tools/list (see ``WITHHELD_TOOLS``)."""
    by_screen = session.facts.get(WITHHELD_TOOLS) or {}
    return frozenset().union(*by_screen.values()) if by_screen else frozenset()


def note_withheld_tools(session: "Session", screen: str, names: frozenset[str]) -> None:
    """Record which tools ``screen`` withheld from the tools/list it just served this session."""
    session.facts.setdefault(WITHHELD_TOOLS, {})[screen] = names


# ``session.facts[TAINTED_BY]``: the servers whose content this session has received and that taints it (an open-world,
# network-reaching or marked server's, or content the injection scan flagged), each with the first such content, in
# the order they came.
TAINTED_BY = "guardrails.tainted_by"


@dataclass(frozen=True, slots=True)
class TaintSource:
    """The first content of one server that tainted a session: which server, what it answered, and why it counts."""

    server: str
    target: str  # the request it answered, e.g. "tools/call web__fetch"
    reason: str  # why it counts: "untrusted server", "it fetches content others wrote", what the scan flagged, ...

    def describe(self) -> str:
        return f"the answer to {self.target} from server '{self.server}' ({self.reason})"


@dataclass(frozen=True, slots=True)
class CallInFlight:
    """A client's call a server is working on when that server asks the client something (sampling, elicitation)."""

    method: str
    request_id: Any  # the id the client used


# Which way a message goes, and what kind it is: the chain is compiled per direction, kind and method.
TO_SERVER = "to_server"  # from a client (or the host API) toward the servers
TO_CLIENT = "to_client"  # from a server toward a client
REQUEST = "request"  # answered: the result or error comes back through the same interceptors, the other way
NOTIFICATION = "notification"  # not answered: an interceptor passes it on, rewrites it, or drops it


@dataclass(slots=True)
class GatewayRequest:
    """One message on its way through the interceptor chain, resolved once where it entered: which way it goes
    (``direction``), whether it is a request or a notification (``kind``), its method and params, the client
    session it belongs to, and for a message from a server, that server. A request's answer (its result, or the
    ``GatewayError`` it raises) travels back through the same interceptors."""

    method: str
    params: dict[str, Any]
    session: Session
    catalog: CatalogView
    request_id: Any = None  # the id the client used
    log_level: str | None = None  # modern clients opt in to log messages per request
    server: str | None = None  # a request or notification from a server toward clients: the server that sent it
    # A server's request toward a client: that client's calls the sending server is working on (empty when it asks
    # outside any of them), so a guardrail can tell a request a call caused from an unsolicited one.
    calls_in_flight: tuple[CallInFlight, ...] = ()
    # A person approved this very call in the policy's approval stage (not an earlier approval remembered).
    person_approved: bool = False
    direction: str = TO_SERVER
    kind: str = REQUEST
    # Where the chain's last step hands the message (the client a server's request or notification is for, or what a
    # client's notification does); None for a client's request, which the gateway routes to its server.
    deliver: "Handler | None" = field(default=None, repr=False)
    # A 2026-07-28 client's retry that brings its answers to the questions its call's server asked: it passes the
    # chain as a request of its own, and its last step resumes the call, which passed the chain already (the policy
    # checks it again but neither counts it against a rate limit nor asks a person again).
    continues: bool = False
    # A server's request Bastion answers itself (the server's ping; a method Bastion relays to no client, answered
    # -32601): its last step asks no client, so the policy has nothing to authorize (and audits no ping).
    answered_by_bastion: bool = False
    # The tool a tools/call names, looked up once for every interceptor and the route (see ``target``).
    _target: tuple[Any, "ToolEntry | None"] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def target(self) -> "ToolEntry | None":
        """The catalog's tool this ``tools/call`` names now, or None: looked up once per name, so an interceptor
        that rewrites the name (the search exposure's ``call_tool``) is never judged on the tool it replaced. The
        name may still be the client's JSON bytes (``msgspec.Raw``: a route where nothing reads the params), decoded
        here once for every reader."""
        name = self.params.get("name")
        cached = self._target
        if cached is not None and cached[0] is name:
            return cached[1]
        if type(name) is msgspec.Raw:
            try:
                decoded = _decode_name(name)
            except msgspec.ValidationError:  # not a string: the router answers it
                decoded = None
            entry = self.catalog.tool(decoded) if decoded is not None else None
        else:
            entry = self.catalog.tool(name) if type(name) is str else None
        self._target = (name, entry)
        return entry


class GatewayError(Exception):
    """Refuses a request with a JSON-RPC error; the frontend turns it into the error response."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    @classmethod
    def from_error(cls, error: Mapping[str, Any]) -> "GatewayError":
        """The same refusal as a JSON-RPC error object received from a peer."""
        return cls(error.get("code", -32603), error.get("message", ""), error.get("data"))

    def to_error(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


Handler = Callable[[GatewayRequest], Awaitable[dict[str, Any]]]


class Interceptor(Protocol):
    """One step of the chain every message passes, both ways (``bastion.gateway.pipeline``).

    Either a callable ``(message, call_next)``, which sees every message of every kind, or an object with hooks by
    kind, ``on_request`` and ``on_notification`` (same signature), which sees every message of the kinds it has a
    hook for. Either way a message of any direction, unless it narrows that with ``methods`` (the only methods it
    looks at) or ``directions`` (``TO_SERVER``, ``TO_CLIENT``)."""

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> dict[str, Any]: ...
