"""Metadata both ways: the Protected Resource Metadata (RFC 9728) this gateway publishes, and the authorization
server metadata (RFC 8414, OpenID Connect Discovery) it reads to find an issuer's keys and endpoints."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence
from urllib.parse import urlsplit, urlunsplit

import httpx2

log = logging.getLogger("bastion.auth")

WELL_KNOWN_RESOURCE = "/.well-known/oauth-protected-resource"


def resource_metadata_url(resource: str) -> str:
    """Where a resource's metadata lives (RFC 9728 section 3.1): the well-known prefix goes between the host and
    the resource's path, so https://mcp.example.com/mcp has https://mcp.example.com/.well-known/oauth-protected-
    resource/mcp."""
    parts = urlsplit(resource)
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, WELL_KNOWN_RESOURCE + path, parts.query, ""))


def resource_metadata_paths(resource: str | None) -> frozenset[str]:
    """The request paths the metadata is served at: the root well-known path, the path the resource's own URL
    gives (as the MCP specification asks, clients try it first), and /mcp's."""
    paths = {WELL_KNOWN_RESOURCE, WELL_KNOWN_RESOURCE + "/mcp"}
    if resource is not None:
        paths.add(urlsplit(resource_metadata_url(resource)).path)
    return frozenset(paths)


def protected_resource_metadata(resource: str, authorization_servers: Sequence[str],
                                scopes_supported: Sequence[str]) -> dict[str, Any]:
    document: dict[str, Any] = {
        "resource": resource,
        "authorization_servers": list(authorization_servers),
        "bearer_methods_supported": ["header"],
        "resource_name": "Bastion MCP gateway",
    }
    if scopes_supported:
        document["scopes_supported"] = list(scopes_supported)
    return document


def discovery_urls(issuer: str) -> list[str]:
    """The metadata URLs of an issuer, in the order the MCP specification tries them: RFC 8414 with the well-known
    part inserted before the issuer's path, then OpenID Connect inserted, then OpenID Connect appended."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")

    def at(p: str) -> str:
        return urlunsplit((parts.scheme, parts.netloc, p, "", ""))

    if not path:
        return [at("/.well-known/oauth-authorization-server"), at("/.well-known/openid-configuration")]
    return [at(f"/.well-known/oauth-authorization-server{path}"), at(f"/.well-known/openid-configuration{path}"),
            at(f"{path}/.well-known/openid-configuration")]


class MetadataUnavailable(Exception):
    """No metadata URL of an issuer answered with a document for that very issuer."""


@dataclass(frozen=True, slots=True)
class IssuerMetadata:
    issuer: str
    jwks_uri: str | None
    introspection_endpoint: str | None


async def discover(client: httpx2.AsyncClient, issuer: str) -> IssuerMetadata:
    """The issuer's metadata from the first URL that serves it; a document naming another issuer is not used
    (RFC 8414 section 3.3: it could be anyone's)."""
    for url in discovery_urls(issuer):
        try:
            response = await client.get(url, headers={"accept": "application/json"})
        except httpx2.HTTPError as exc:
            log.warning("issuer %s: its metadata at %s could not be read (%s)", issuer, url, type(exc).__name__)
            continue
        if response.status_code != 200:
            continue
        try:
            document = response.json()
        except ValueError:
            continue
        if not isinstance(document, dict):
            continue
        if document.get("issuer") != issuer:
            log.warning("issuer %s: the metadata at %s names another issuer; it is not used", issuer, url)
            continue
        jwks = document.get("jwks_uri")
        introspection = document.get("introspection_endpoint")
        return IssuerMetadata(issuer, jwks if isinstance(jwks, str) else None,
                              introspection if isinstance(introspection, str) else None)
    raise MetadataUnavailable(issuer)
