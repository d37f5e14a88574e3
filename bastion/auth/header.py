"""``http.identity_header``: a request header whose value is the caller's name, believed as it is. It proves
nothing, so it is for a gateway on loopback or behind a proxy that authenticates and sets the header; it cannot be
combined with the methods that do prove something (a client could otherwise name anyone)."""

from __future__ import annotations

from bastion.auth.base import AuthFailure, Credentials
from bastion.model import Identity


class HeaderIdentity:
    def __init__(self, header: str) -> None:
        self.header = header
        self._key = header.lower()
        self.asks = f"the {header} header, which names the caller (http.identity_header)"

    def presented(self, credentials: Credentials) -> bool:
        return bool(credentials.headers.get(self._key, "").strip())

    def challenge(self) -> str | None:
        return None

    async def authenticate(self, credentials: Credentials) -> Identity:
        value = credentials.headers.get(self._key, "").strip()
        if not value:
            raise AuthFailure(401, f"the {self.header} header is missing; it names the caller (http.identity_header)",
                              None, "invalid_request", "no_credentials")
        return Identity(value, (), "header")
