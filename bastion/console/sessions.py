"""The console's sessions: a login exchanges a credential (or a one-time link) for a random session id in an
HttpOnly, SameSite=Strict cookie; the session keeps who logged in and the CSRF token every act must carry. Kept in
this process's memory (a restart logs everyone out), bounded in number and in time."""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from bastion.model import Identity

COOKIE = "bastion_console"


@dataclass(frozen=True, slots=True)
class Admitted:
    """Who logged in, and the credential they presented (kept in this process's memory only, to check at each
    request that it still holds: a revoked key or an expired token ends the session)."""

    identity: Identity
    proof: str | None = field(default=None, repr=False)


@dataclass(slots=True)
class Session:
    id: str
    admitted: Admitted
    csrf: str
    expires: float
    notice: tuple[str, bool] | None = None  # what the last act said (text, done), shown once on the next page

    @property
    def identity(self) -> Identity:
        return self.admitted.identity

    def csrf_matches(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.csrf.encode())


class Sessions:
    """Open sessions by id, oldest first; past ``most`` the oldest is ended (a flood of logins cannot grow memory)."""

    def __init__(self, lifetime: float, most: int = 1000, clock: Callable[[], float] = time.monotonic) -> None:
        self._lifetime, self._most, self._clock = lifetime, most, clock
        self._open: OrderedDict[str, Session] = OrderedDict()

    def open(self, admitted: Admitted) -> Session:
        session = Session(secrets.token_urlsafe(32), admitted, secrets.token_urlsafe(32), self._clock() + self._lifetime)
        self._open[session.id] = session
        while len(self._open) > self._most:
            self._open.popitem(last=False)
        return session

    def find(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._open.get(session_id)
        if session is None:
            return None
        if self._clock() >= session.expires:
            del self._open[session_id]
            return None
        return session

    def end(self, session_id: str | None) -> None:
        if session_id:
            self._open.pop(session_id, None)


class LoginLink:
    """The one-time secret of ``bastion console``'s login link: it opens one session, then never again."""

    def __init__(self, lifetime: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.token: str | None = secrets.token_urlsafe(32)
        self._expires = clock() + lifetime
        self._clock = clock

    def redeem(self, presented: str | None) -> bool:
        token = self.token
        if token is None or presented is None or self._clock() >= self._expires:
            return False
        if not hmac.compare_digest(presented.encode(), token.encode()):
            return False
        self.token = None
        return True


def cookie_of(header: str | None) -> str | None:
    """The console's session id in a Cookie header, None when absent."""
    for part in (header or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name in (COOKIE, f"__Host-{COOKIE}"):
            return value
    return None


def set_cookie(session: Session | None, *, secure: bool, lifetime: float) -> bytes:
    """The Set-Cookie value opening ``session`` (ending the cookie when None). Under TLS the cookie is
    ``__Host-`` prefixed and Secure (bound to this host, unreadable over plain HTTP)."""
    name = f"__Host-{COOKIE}" if secure else COOKIE
    value, age = (session.id, int(lifetime)) if session is not None else ("", 0)
    # __Host- requires Path=/: the cookie then reaches /mcp too, where nothing reads it.
    path = "/" if secure else "/admin"
    return (f"{name}={value}; Path={path}; Max-Age={age}; HttpOnly; SameSite=Strict"
            + ("; Secure" if secure else "")).encode()
