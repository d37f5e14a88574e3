"""Protocol versions of both eras, negotiation, and the modern per-request envelope."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from bastion.protocol.jsonrpc import (
    INVALID_PARAMS,
    MISSING_CLIENT_CAPABILITY,
    UNSUPPORTED_PROTOCOL_VERSION,
    error,
)

LEGACY_VERSIONS: tuple[str, ...] = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN_VERSIONS: tuple[str, ...] = ("2026-07-28",)
LATEST_LEGACY = LEGACY_VERSIONS[-1]
LATEST_MODERN = MODERN_VERSIONS[-1]

META_PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
META_LOG_LEVEL = "io.modelcontextprotocol/logLevel"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
META_SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"

DISCOVER = "server/discover"


def negotiate_legacy(requested: Any) -> str:
    """The version a legacy server answers ``initialize`` with: the client's, if supported, else our latest."""
    if isinstance(requested, str) and requested in LEGACY_VERSIONS:
        return requested
    return LATEST_LEGACY


def is_modern(version: Any) -> bool:
    return isinstance(version, str) and version in MODERN_VERSIONS


def is_modern_first_message(method: str, params: Mapping[str, Any] | None) -> bool:
    """Whether a connection's first message puts it in the modern (stateless) era.

    A request that names a protocol version in ``_meta`` — even one we do not support, which is then answered
    with -32022 — or that is ``server/discover`` is modern; everything else is the legacy handshake.
    """
    if method == DISCOVER:
        return True
    meta = (params or {}).get("_meta")
    return isinstance(meta, dict) and META_PROTOCOL_VERSION in meta


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a modern request says about its sender, read from ``params._meta``."""

    protocol_version: str
    client_capabilities: Mapping[str, Any]
    client_info: Mapping[str, Any] | None
    log_level: str | None


def read_envelope(params: Mapping[str, Any] | None) -> Envelope | dict[str, Any]:
    """The envelope of a modern request, or the JSON-RPC error object to answer it with."""
    meta = (params or {}).get("_meta")
    if not isinstance(meta, dict):
        meta = {}
    version = meta.get(META_PROTOCOL_VERSION)
    if version is None:
        return error(INVALID_PARAMS, f"missing _meta[{META_PROTOCOL_VERSION!r}]")
    if not is_modern(version):
        return error(
            UNSUPPORTED_PROTOCOL_VERSION,
            f"unsupported protocol version {version!r}",
            {"supported": list(MODERN_VERSIONS), "requested": version},
        )
    capabilities = meta.get(META_CLIENT_CAPABILITIES)
    if not isinstance(capabilities, dict):
        return error(INVALID_PARAMS, f"missing or invalid _meta[{META_CLIENT_CAPABILITIES!r}]: it must be an object")
    client_info = meta.get(META_CLIENT_INFO)
    log_level = meta.get(META_LOG_LEVEL)
    return Envelope(
        protocol_version=version,
        client_capabilities=capabilities,
        client_info=client_info if isinstance(client_info, dict) else None,
        log_level=log_level if isinstance(log_level, str) else None,
    )


def missing_capability(capability: str) -> dict[str, Any]:
    """The -32021 error for a request that needs a client capability the client did not declare."""
    return error(
        MISSING_CLIENT_CAPABILITY,
        f"this request needs the client capability {capability!r}",
        {"requiredCapabilities": {capability: {}}},
    )


def modern_meta(capabilities: Mapping[str, Any], client_info: Mapping[str, Any], log_level: str | None = None) -> dict[str, Any]:
    """The ``_meta`` a modern request carries on Bastion's upstream side."""
    meta: dict[str, Any] = {
        META_PROTOCOL_VERSION: LATEST_MODERN,
        META_CLIENT_CAPABILITIES: dict(capabilities),
        META_CLIENT_INFO: dict(client_info),
    }
    if log_level is not None:
        meta[META_LOG_LEVEL] = log_level
    return meta


def is_complete(result: Mapping[str, Any]) -> bool:
    """A result is complete unless it says ``input_required`` (an absent resultType means complete)."""
    return result.get("resultType", "complete") != "input_required"
