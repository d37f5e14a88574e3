"""The headers of the MCP HTTP wire an upstream request carries: the session's (``Mcp-Session-Id``, the negotiated
``MCP-Protocol-Version``) and what a 2026-07-28 request mirrors from its body (``Mcp-Method``, ``Mcp-Name``, and
``Mcp-Param-*`` for the arguments a tool's schema marks ``x-mcp-header``), encoded to survive an HTTP field."""

from __future__ import annotations

from typing import Any, Mapping

from bastion.protocol.versions import META_PROTOCOL_VERSION

SESSION_HEADER = "mcp-session-id"
PROTOCOL_VERSION_HEADER = "mcp-protocol-version"
METHOD_HEADER = "mcp-method"
NAME_HEADER = "mcp-name"
_NAME_PARAMS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


def encode_header_value(value: str) -> str:
    """A value that survives an HTTP field as written, or the protocol's ``=?base64?…?=`` form when it would not."""
    if value.isascii() and value.isprintable() and value == value.strip() and not value.startswith("=?base64?"):
        return value
    import base64

    return f"=?base64?{base64.b64encode(value.encode('utf-8')).decode('ascii')}?="


def x_mcp_headers(schema: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], str]:
    """The properties of a tool's input schema annotated ``x-mcp-header``, by their path of ``properties`` keys."""
    found: dict[tuple[str, ...], str] = {}
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if isinstance(properties, dict):
        for key, child in properties.items():
            if not isinstance(child, dict):
                continue
            token = child.get("x-mcp-header")
            if isinstance(token, str) and token:
                found[(*path, key)] = token
            found.update(x_mcp_headers(child, (*path, key)))
    return found


def param_headers(annotated: Mapping[tuple[str, ...], str], arguments: Mapping[str, Any]) -> dict[str, str]:
    """The ``Mcp-Param-*`` headers a call mirrors from its arguments: each annotated value present (``true`` and
    ``false`` for booleans), encoded for a header; a value that is absent, null or not a scalar sends none."""
    headers: dict[str, str] = {}
    for path, token in annotated.items():
        value: Any = arguments
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, bool):
            rendered = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            rendered = str(value)
        else:
            continue
        headers[f"Mcp-Param-{token}"] = encode_header_value(rendered)
    return headers


def mirrored_headers(headers: dict[str, str], message: Mapping[str, Any],
                     annotated: Mapping[str, Mapping[tuple[str, ...], str]]) -> None:
    """Add to ``headers`` what a 2026-07-28 request mirrors from its body: its version, method and name, and for a
    ``tools/call`` of a tool in ``annotated`` (its arguments marked ``x-mcp-header``, by tool) those arguments. A
    request of a session (no version in its ``_meta``) mirrors nothing."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
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
