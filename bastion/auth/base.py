"""The authenticator's interface: what one request presents, what it is answered with when refused, and the
chain that asks each configured method in turn."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from bastion.model import Identity

# An API key is a bearer credential too; its prefix tells the chain it is a key and not an OAuth access token.
API_KEY_PREFIX = "bst_"
# RFC 6750 section 2.1: b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


@dataclass(frozen=True, slots=True)
class Credentials:
    """What one HTTP request presents, as the frontend read it."""

    headers: Mapping[str, str]  # names lower-cased
    route: str  # "mcp" (Streamable HTTP), "sse" or "messages" (HTTP+SSE)
    peer_address: str = ""
    # the TLS client certificate the handshake verified against http.client_ca_file, in ssl.getpeercert() form;
    # None without TLS or without a certificate
    peer_certificate: Mapping[str, Any] | None = None


@dataclass(slots=True)
class AuthFailure(Exception):
    """A request refused before it reaches the gateway: its HTTP status (400, 401, 403 or 503), the words for the
    client, and the ``WWW-Authenticate`` challenge (RFC 6750 / RFC 9728) the answer carries. The message never
    repeats the credential, and says nothing that helps an attacker tell a bad signature from an unknown key.
    ``reason`` is a short kind ("expired", "bad_signature", ...) for the log line, never shown to the client."""

    status: int
    message: str
    www_authenticate: str | None = None
    error: str = "invalid_token"  # RFC 6750: invalid_request, invalid_token, insufficient_scope
    reason: str = ""

    def __str__(self) -> str:
        return self.message


def authorization(credentials: Credentials) -> tuple[str, str] | None:
    """The Authorization header as (scheme lower-cased, the rest), or None when there is none."""
    value = credentials.headers.get("authorization")
    if value is None:
        return None
    scheme, _, rest = value.strip().partition(" ")
    return scheme.lower(), rest.strip()


def bearer_token(credentials: Credentials, max_bytes: int = 16384) -> str | None:
    """The request's bearer token (RFC 6750 section 2.1), None when it presents none; AuthFailure 400 when the
    header is malformed (several values, no token, characters a token cannot have) or the token is too long."""
    found = authorization(credentials)
    if found is None or found[0] != "bearer":
        return None
    token = found[1]
    if len(token) > max_bytes:
        raise AuthFailure(400, f"the bearer token is longer than {max_bytes} bytes (auth.max_token_bytes)",
                          'Bearer error="invalid_request"', "invalid_request", "token_too_long")
    # A JWT's three segments are each decoded strictly as base64url later, which checks the same alphabet.
    if not (token.count(".") == 2 and token.isascii() and " " not in token) and not _B64TOKEN.fullmatch(token):
        raise AuthFailure(400, "the Authorization header is malformed: expected 'Bearer ' and one token",
                          'Bearer error="invalid_request"', "invalid_request", "malformed_header")
    return token


class AuthMethod(Protocol):
    """One way of authenticating (OAuth bearer tokens, API keys, client certificates).

    A method may also have ``asks``, a few words on what a request must present for it (e.g. "a bearer token
    from a trusted issuer"), which the chain's refusal of a request that presented nothing quotes."""

    def presented(self, credentials: Credentials) -> bool:
        """True when the request carries this method's kind of credential (so this method decides)."""

    async def authenticate(self, credentials: Credentials) -> Identity:
        """The identity the credential proves, or raise AuthFailure."""

    def challenge(self) -> str | None:
        """The WWW-Authenticate value for a request that presented nothing, or None."""


class Authenticator(Protocol):
    async def authenticate(self, credentials: Credentials) -> Identity: ...


@dataclass
class Unauthenticated:
    """No authentication configured: every request is the configured identity (loopback use, or behind a proxy
    that authenticates)."""

    identity: Identity

    async def authenticate(self, credentials: Credentials) -> Identity:
        return self.identity


REALM = "bastion"


@dataclass
class AuthenticatorChain:
    """The first method whose kind of credential a request presents decides it; a request that presents none is
    refused with 401 and every method's challenge."""

    methods: Sequence[AuthMethod]
    _challenges: tuple[str, ...] = field(init=False, default=())
    _missing: str = field(init=False, default="")

    def __post_init__(self) -> None:
        challenges = [c for c in (m.challenge() for m in self.methods) if c]
        # RFC 9110 wants a challenge on every 401; an API key travels as a bearer credential, so a gateway that
        # takes keys but no tokens still names the Bearer scheme.
        if not challenges and any(getattr(m, "bearer_credential", False) for m in self.methods):
            challenges.append(f'Bearer realm="{REALM}"')
        self._challenges = tuple(challenges)
        asks = [a for a in (getattr(m, "asks", None) for m in self.methods) if a]
        self._missing = ("authentication required: present " + " or ".join(asks) if asks else
                         "authentication required: present a bearer token, an API key or a client certificate, as "
                         "this gateway's auth configuration asks")

    async def authenticate(self, credentials: Credentials) -> Identity:
        for method in self.methods:
            if method.presented(credentials):
                return await method.authenticate(credentials)
        raise AuthFailure(401, self._missing, ", ".join(self._challenges) or None, "invalid_request", "no_credentials")
