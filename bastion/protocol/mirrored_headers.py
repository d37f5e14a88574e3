"""What a 2026-07-28 request's headers mirror of its body, as both sides of the wire read it (SEP-2243): which of a
tool's arguments its input schema marks ``x-mcp-header``, how an argument's value is written in its
``Mcp-Param-*`` header, and the ``=?base64?…?=`` form of a value an HTTP field would not carry as written. Bastion's
HTTP client writes these headers, its HTTP frontend checks them: one rule for both."""

from __future__ import annotations

import base64
from typing import Any, Mapping

_BASE64_HEAD, _BASE64_TAIL = "=?base64?", "?="


def annotated_params(schema: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], str]:
    """The properties of a tool's input schema annotated ``x-mcp-header``, by their path of ``properties`` keys."""
    found: dict[tuple[str, ...], str] = {}
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if isinstance(properties, Mapping):
        for key, child in properties.items():
            if not isinstance(child, Mapping):
                continue
            token = child.get("x-mcp-header")
            if isinstance(token, str) and token:
                found[(*path, key)] = token
            found.update(annotated_params(child, (*path, key)))
    return found


def argument_at(arguments: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` in a call's arguments, None where it is absent."""
    value = arguments
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def rendered(value: Any) -> str | None:
    """An argument as its header writes it (``true`` and ``false`` for booleans), None for one no header carries
    (absent, null, or not a scalar)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    return None


def encode_header_value(value: str) -> str:
    """A value that survives an HTTP field as written, or the protocol's ``=?base64?…?=`` form when it would not."""
    if value.isascii() and value.isprintable() and value == value.strip() and not value.startswith(_BASE64_HEAD):
        return value
    return f"{_BASE64_HEAD}{base64.b64encode(value.encode('utf-8')).decode('ascii')}{_BASE64_TAIL}"


def decode_header_value(value: str | None) -> str | None:
    """A header value as sent, or the text of a ``=?base64?...?=`` one; None for a malformed one."""
    if value is None or not (value.startswith(_BASE64_HEAD) and value.endswith(_BASE64_TAIL)):
        return value
    try:
        return base64.b64decode(value[len(_BASE64_HEAD):-len(_BASE64_TAIL)], validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
