"""What a log line says about the request it was written during, and the W3C trace context a client sent.

Both are context variables, so they follow a request into every Task it starts and no further. Nothing here imports
OpenTelemetry: a JSON log line gets the trace id from what the request step put here, which with tracing off is
the trace id of the client's own ``traceparent`` (checked against the W3C form, never echoed as it came).
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from bastion.model import GatewayRequest, ToolEntry

# The W3C Trace Context and Baggage keys, as HTTP headers (lower case) and as a 2026-07-28 request's ``_meta`` keys.
TRACE_KEYS = ("traceparent", "tracestate", "baggage")
# The W3C limits a receiver must accept are far below this: anything longer is not a trace context but an attack.
MAX_TRACE_VALUE = 8192
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
_ZERO_TRACE = "0" * 32


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """The request a log line is written during: the client's id for it, who asks, and for a call its server and
    tool (the catalog's names, never the client's text), and the trace it belongs to."""

    request_id: Any
    identity: str
    server: str | None
    tool: str | None
    trace_id: str | None

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"request_id": self.request_id, "identity": self.identity}
        if self.trace_id is not None:
            out["trace_id"] = self.trace_id
        if self.server is not None:
            out["server"] = self.server
        if self.tool is not None:
            out["tool"] = self.tool
        return out


REQUEST: ContextVar[RequestFacts | None] = ContextVar("bastion_request", default=None)
# The trace context headers of the HTTP request a client's message came in (set by the HTTP frontend only while
# tracing or JSON logs are on): what a request's ``_meta`` does not carry is taken from there.
INCOMING_TRACE: ContextVar[Mapping[str, str] | None] = ContextVar("bastion_incoming_trace", default=None)


def take_trace_context(headers: Mapping[str, str]) -> None:
    """Keep the trace context headers of the HTTP request being handled (``headers`` by lower-case name) for the
    messages it carries: the Tasks they run in start from this context."""
    INCOMING_TRACE.set(trace_carrier(headers) or None)


def trace_carrier(source: Mapping[str, Any] | None) -> dict[str, str]:
    """The trace context keys of ``source`` (headers, or a request's ``_meta``) that are well formed; anything else
    is ignored, as the W3C specifications ask of a malformed header. Checked here, before OpenTelemetry's
    propagators see them: they log a malformed value they are given, which would let a client write in the log."""
    if not source:
        return {}
    carrier: dict[str, str] = {}
    for key, well_formed in _WELL_FORMED.items():
        value = source.get(key)
        if type(value) is str and len(value) <= MAX_TRACE_VALUE and value.isascii() and well_formed(value.strip()):
            carrier[key] = value.strip()
    return carrier


def _traceparent_ok(value: str) -> bool:
    return _TRACEPARENT.fullmatch(value) is not None and not value.startswith("ff")


def _tracestate_ok(value: str) -> bool:
    # W3C Trace Context: at most 32 list members, each key=value of the grammar; 512 characters is what
    # OpenTelemetry keeps.
    members = [member.strip(" \t") for member in value.split(",")]
    members = [member for member in members if member]
    return len(value) <= 512 and len(members) <= 32 and all(_TRACESTATE_MEMBER.fullmatch(m) for m in members) \
        and len({m.split("=", 1)[0] for m in members}) == len(members)


def _baggage_ok(value: str) -> bool:
    # W3C Baggage: at most 180 list members of 4,096 bytes each, 8,192 in all, each a key=value with properties.
    members = [member.strip(" \t") for member in value.split(",")]
    return len(members) <= 180 and all(len(m) <= 4096 and _BAGGAGE_MEMBER.fullmatch(m) for m in members)


_TRACESTATE_MEMBER = re.compile(r"([a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
                                r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_BAGGAGE_VALUE = r"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*"
_BAGGAGE_MEMBER = re.compile(rf"{_TOKEN}[ \t]*=[ \t]*{_BAGGAGE_VALUE}(?:[ \t]*;[ \t]*{_TOKEN}(?:[ \t]*=[ \t]*"
                             rf"{_BAGGAGE_VALUE})?)*")
_WELL_FORMED = {"traceparent": _traceparent_ok, "tracestate": _tracestate_ok, "baggage": _baggage_ok}


def meta_carrier(params: Mapping[str, Any]) -> dict[str, str]:
    meta = params.get("_meta")
    return trace_carrier(meta) if isinstance(meta, dict) else {}


def client_trace_id(carrier: Mapping[str, str]) -> str | None:
    """The trace id of the ``traceparent`` in ``carrier`` (as ``trace_carrier`` took it), else None."""
    found = _TRACEPARENT.fullmatch(carrier.get("traceparent", ""))
    if found is None or found.group(1) == _ZERO_TRACE:
        return None
    return found.group(1)


def call_entry(message: GatewayRequest) -> ToolEntry | None:
    """The catalog's tool a ``tools/call`` names, None for any other request or a name no tool has (its params may
    be the client's bytes still: ``GatewayRequest.target`` reads the name from them, and they stay so)."""
    return message.target if message.method == "tools/call" else None


def facts_of(message: GatewayRequest, trace_id: str | None) -> RequestFacts:
    entry = call_entry(message)
    return RequestFacts(message.request_id, message.session.identity.name, entry.server if entry else None,
                        entry.exposed_name if entry else None, trace_id)


Handler = Callable[[GatewayRequest], Awaitable[Any]]
Hook = Callable[[GatewayRequest, Handler], Awaitable[Any]]


class RequestLogContext:
    """The chain's observer when logs are JSON and tracing is off: each client request's facts for its log lines.
    The chain is given it only then, so a gateway that writes human logs pays nothing per message."""

    # A call's name and ``_meta`` only: a call that has a ``_meta`` is decoded anyway, and a name is read from the
    # client's bytes, so params nothing else reads stay those bytes.
    reads_params = False
    reads_results = False  # it reads no result: a call's result may stay the server's bytes

    def request(self, handle: Handler, method: str) -> Handler:
        async def with_facts(message: GatewayRequest) -> Any:
            carrier = meta_carrier(message.params) or trace_carrier(INCOMING_TRACE.get())
            token = REQUEST.set(facts_of(message, client_trace_id(carrier)))
            try:
                return await handle(message)
            finally:
                REQUEST.reset(token)

        return with_facts

    def step(self, interceptor: Any, hook: Hook) -> Hook:
        return hook

    def upstream(self, forward: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        return forward

    def span(self, name: str, **attributes: Any) -> Any:
        from contextlib import nullcontext

        return nullcontext()

    async def aclose(self) -> None:
        return None
