"""The authenticator's interface: what one request presents, what it is answered with when refused, and the
chain that asks each configured method in turn."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from bastion.model import Identity


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
    """A request refused before it reaches the gateway: its HTTP status (401 or 403), the words for the client, and
    the ``WWW-Authenticate`` challenge (RFC 6750 / RFC 9728) the answer carries. The message never repeats the
    credential, and says nothing that helps an attacker tell a bad signature from an unknown key."""

    status: int
    message: str
    www_authenticate: str | None = None
    error: str = "invalid_token"  # RFC 6750: invalid_request, invalid_token, insufficient_scope

    def __str__(self) -> str:
        return self.message


class AuthMethod(Protocol):
    """One way of authenticating (OAuth bearer tokens, API keys, client certificates)."""

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


@dataclass
class AuthenticatorChain:
    """The first method whose kind of credential a request presents decides it; a request that presents none is
    refused with 401 and every method's challenge."""

    methods: Sequence[AuthMethod]
    _challenges: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        self._challenges = tuple(c for c in (m.challenge() for m in self.methods) if c)

    async def authenticate(self, credentials: Credentials) -> Identity:
        for method in self.methods:
            if method.presented(credentials):
                return await method.authenticate(credentials)
        raise AuthFailure(401, "authentication required: present a bearer token, an API key or a client "
                               "certificate, as this gateway's auth configuration asks",
                          ", ".join(self._challenges) or None, "invalid_request")
