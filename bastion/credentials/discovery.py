"""Where a remote MCP server's authorization lives, found as the MCP authorization specification says a client finds it.

1. The server's 401 names its Protected Resource Metadata (RFC 9728) in ``WWW-Authenticate: Bearer
   resource_metadata="..."``; without it the client tries the well-known URL with the server's path
   (``/.well-known/oauth-protected-resource/mcp``), then the one at the root. The document's ``resource`` must be
   the server Bastion is talking to (its URL, or a parent of it on the same origin): metadata naming another
   resource is refused, so a server cannot send the user to authorize Bastion for something else.
2. The metadata names the authorization servers; the first one's metadata is read at RFC 8414's well-known URL
   (inserted before the issuer's path), then OpenID Connect's inserted the same way, then OpenID Connect's appended
   to the path. A document whose ``issuer`` is not exactly the issuer the URL was built from is not used (RFC 8414
   section 3.3): an attacker's metadata cannot redirect the token request.

The functions read; they decide nothing about flows (bastion/credentials/oauth_client.py does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2

from bastion.transport.credentials import CredentialsError

_MAX_DOCUMENT = 64 * 1024  # a metadata document larger than this is not one
# One auth-param of a challenge: name=token or name="quoted string" (RFC 9110 section 11.2).
_PARAM = re.compile(r'([A-Za-z0-9_.-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,"]+))')


@dataclass(frozen=True)
class Challenge:
    """What a ``WWW-Authenticate: Bearer ...`` header asks for."""

    resource_metadata: str | None = None
    scope: tuple[str, ...] = ()
    error: str | None = None

    @classmethod
    def parse(cls, header: str | None) -> "Challenge":
        """The Bearer challenge's parameters (other schemes in the same header are ignored)."""
        if not header:
            return cls()
        start = re.search(r"(?i)(?:^|,)\s*bearer\b", header)
        if start is None:
            return cls()
        rest = header[start.end():]
        # Another scheme's challenge begins where a bare token is followed by a space and not by "=".
        following = re.search(r",\s*[A-Za-z][A-Za-z0-9_-]*\s+(?![=\s])[A-Za-z0-9_-]+\s*=", rest)
        if following is not None:
            rest = rest[:following.start()]
        params: dict[str, str] = {}
        for match in _PARAM.finditer(rest):
            value = match.group(2) if match.group(2) is not None else match.group(3)
            params.setdefault(match.group(1).lower(), re.sub(r"\\(.)", r"\1", value))
        scope = tuple(params["scope"].split()) if params.get("scope") else ()
        return cls(params.get("resource_metadata"), scope, params.get("error"))


@dataclass(frozen=True)
class ProtectedResource:
    """A server's Protected Resource Metadata (RFC 9728), the part a client uses."""

    resource: str
    authorization_servers: tuple[str, ...]
    scopes_supported: tuple[str, ...] | None = None


@dataclass(frozen=True)
class AuthorizationServer:
    """An authorization server's metadata (RFC 8414), read from a document whose issuer matched."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    registration_endpoint: str | None = None
    scopes_supported: tuple[str, ...] | None = None
    token_endpoint_auth_methods: tuple[str, ...] = ("client_secret_basic",)
    grant_types: tuple[str, ...] = ("authorization_code", "implicit")
    code_challenge_methods: tuple[str, ...] = ()
    client_id_metadata_documents: bool = False
    iss_parameter_supported: bool = False
    document: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def canonical_resource(url: str) -> str:
    """A server's URL as a resource identifier (RFC 8707, the MCP specification's canonical form): scheme and host
    lower-cased, no fragment, no trailing slash on the path."""
    parts = urlsplit(url)
    netloc = parts.netloc.lower()
    for scheme, port in (("http", ":80"), ("https", ":443")):
        if parts.scheme.lower() == scheme and netloc.endswith(port):
            netloc = netloc[: -len(port)]
    return urlunsplit((parts.scheme.lower(), netloc, parts.path.rstrip("/"), parts.query, ""))


def covers(published: str, server_url: str) -> bool:
    """Whether a resource identifier covers the server's URL: the same origin, and a path that is the server's or
    one of its parents (a server's metadata at the root of its origin names the origin)."""
    resource, server = urlsplit(canonical_resource(published)), urlsplit(canonical_resource(server_url))
    if (resource.scheme, resource.netloc) != (server.scheme, server.netloc) or resource.query:
        return False
    return server.path == resource.path or server.path.startswith(resource.path.rstrip("/") + "/")


def protected_resource_urls(server_url: str, challenge: Challenge) -> list[str]:
    """Where to look for the server's metadata, in the specification's order."""
    parts = urlsplit(server_url)
    path = parts.path.rstrip("/")
    found: list[str] = []
    if challenge.resource_metadata:
        found.append(challenge.resource_metadata)
    if path:
        found.append(urlunsplit((parts.scheme, parts.netloc, f"/.well-known/oauth-protected-resource{path}", "", "")))
    found.append(urlunsplit((parts.scheme, parts.netloc, "/.well-known/oauth-protected-resource", "", "")))
    return list(dict.fromkeys(found))


def authorization_server_urls(issuer: str) -> list[str]:
    """Where an issuer's metadata may be (the MCP specification's order for issuers with and without a path)."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    urls = [urlunsplit((parts.scheme, parts.netloc, f"/.well-known/{name}{path}", "", ""))
            for name in ("oauth-authorization-server", "openid-configuration")]
    if path:
        urls.append(urlunsplit((parts.scheme, parts.netloc, f"{path}/.well-known/openid-configuration", "", "")))
    return urls


async def _document(client: httpx2.AsyncClient, url: str) -> dict[str, Any] | None:
    """A JSON object served at ``url`` with 200, or None (absent, not JSON, too large, unreachable)."""
    try:
        response = await client.get(url, headers={"accept": "application/json"})
    except httpx2.HTTPError:
        return None
    if response.status_code != 200 or len(response.content) > _MAX_DOCUMENT:
        return None
    try:
        document = response.json()
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _strings(value: Any) -> tuple[str, ...] | None:
    if not isinstance(value, list):
        return None
    return tuple(item for item in value if isinstance(item, str))


async def discover_resource(client: httpx2.AsyncClient, server_url: str, challenge: Challenge) -> ProtectedResource:
    """The server's Protected Resource Metadata; raises CredentialsError when there is none Bastion may use."""
    for url in protected_resource_urls(server_url, challenge):
        document = await _document(client, url)
        if document is None:
            continue
        resource = document.get("resource")
        servers = _strings(document.get("authorization_servers")) or ()
        if not isinstance(resource, str) or not servers:
            continue
        if not covers(resource, server_url):
            raise CredentialsError(f"its protected resource metadata names another resource ({resource}), not "
                                   f"{server_url}: refused, as an authorization for it would not be for this server")
        return ProtectedResource(resource, servers, _strings(document.get("scopes_supported")))
    raise CredentialsError(f"it asks for authorization but publishes no protected resource metadata (looked at "
                           f"{', '.join(protected_resource_urls(server_url, challenge))})")


async def discover_authorization_server(client: httpx2.AsyncClient, issuer: str) -> AuthorizationServer:
    """The issuer's metadata from the first document whose issuer is exactly ``issuer``; raises CredentialsError."""
    mismatched: list[str] = []
    for url in authorization_server_urls(issuer):
        document = await _document(client, url)
        if document is None:
            continue
        if document.get("issuer") != issuer:
            mismatched.append(url)
            continue
        authorize, token = document.get("authorization_endpoint"), document.get("token_endpoint")
        if not isinstance(authorize, str) or not isinstance(token, str):
            continue
        registration = document.get("registration_endpoint")
        return AuthorizationServer(
            issuer=issuer, authorization_endpoint=authorize, token_endpoint=token,
            registration_endpoint=registration if isinstance(registration, str) else None,
            scopes_supported=_strings(document.get("scopes_supported")),
            token_endpoint_auth_methods=_strings(document.get("token_endpoint_auth_methods_supported"))
            or ("client_secret_basic",),
            grant_types=_strings(document.get("grant_types_supported")) or ("authorization_code", "implicit"),
            code_challenge_methods=_strings(document.get("code_challenge_methods_supported")) or (),
            client_id_metadata_documents=document.get("client_id_metadata_document_supported") is True,
            iss_parameter_supported=document.get("authorization_response_iss_parameter_supported") is True,
            document=document)
    if mismatched:
        raise CredentialsError(f"the metadata of authorization server {issuer} names another issuer (at "
                               f"{', '.join(mismatched)}): not used")
    raise CredentialsError(f"authorization server {issuer} publishes no usable metadata (looked at "
                           f"{', '.join(authorization_server_urls(issuer))})")
