"""The headers of the MCP HTTP wire an upstream request carries: the session's (``Mcp-Session-Id``, the negotiated
``MCP-Protocol-Version``) and what a 2026-07-28 request mirrors from its body (``Mcp-Method``, ``Mcp-Name``, and
``Mcp-Param-*`` for the arguments a tool's schema marks ``x-mcp-header``), encoded to survive an HTTP field."""

from __future__ import annotations

from typing import Any, Mapping

from bastion.protocol.mirrored_headers import argument_at, encode_header_value, rendered
from bastion.protocol.versions import META_PROTOCOL_VERSION

SESSION_HEADER = "mcp-session-id"
PROTOCOL_VERSION_HEADER = "mcp-protocol-version"
METHOD_HEADER = "mcp-method"
NAME_HEADER = "mcp-name"
_NAME_PARAMS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


def param_headers(annotated: Mapping[tuple[str, ...], str], arguments: Mapping[str, Any]) -> dict[str, str]:
    """The ``Mcp-Param-*`` headers a call mirrors from its arguments: each annotated value present (``true`` and
    ``false`` for booleans), encoded for a header; a value that is absent, null or not a scalar sends none."""
    headers: dict[str, str] = {}
    for path, token in annotated.items():
        written = rendered(argument_at(arguments, path))
        if written is not None:
            headers[f"Mcp-Param-{token}"] = encode_header_value(written)
    return headers


def mirrored_headers(headers: dict[str, str], message: Mapping[str, Any],
                     annotated: Mapping[str, Mapping[tuple[str, ...], str]]) -> None:
    """Add to ``headers`` what a 2026-07-28 request mirrors from its body: its version, method and name, and for a
    ``tools/call`` of a tool in ``annotated`` (its arguments marked ``x-mcp-header``, by tool) those arguments. A
    request of a session (no version in its ``_meta``) mirrors nothing."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and "traceparent" in meta:
        trace_headers(headers, meta)
    version = meta.get(META_PROTOCOL_VERSION) if isinstance(meta, dict) else None
    if isinstance(version, str):  # a modern request: its routing is mirrored in headers
        assert isinstance(params, dict)
        method = message["method"]
        headers[PROTOCOL_VERSION_HEADER] = version
        headers[METHOD_HEADER] = method
        key = _NAME_PARAMS.get(method)
        value = params.get(key) if key is not None else None
        if isinstance(value, str):
            headers[NAME_HEADER] = encode_header_value(value)
        if method == "tools/call" and isinstance(value, str) and value in annotated:
            arguments = params.get("arguments")
            headers.update(param_headers(annotated[value], arguments if isinstance(arguments, dict) else {}))


# The W3C trace context a request carries in its ``_meta`` (the gateway's upstream span, with tracing on; else the
# client's own, passed on), also sent as the headers an HTTP server's instrumentation reads.
_TRACE_KEYS = ("traceparent", "tracestate", "baggage")
_MAX_TRACE_HEADER = 8192


def trace_headers(headers: dict[str, str], meta: Mapping[str, Any]) -> None:
    """Add ``meta``'s trace context keys to ``headers``: only values a header may carry as they are (printable
    ASCII, within a bound); anything else is left out rather than sent bent or refused by the HTTP client."""
    for key in _TRACE_KEYS:
        value = meta.get(key)
        if type(value) is str and len(value) <= _MAX_TRACE_HEADER and value.isascii() and value.isprintable():
            headers[key] = value
