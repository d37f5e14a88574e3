"""Who holds the HTTP frontend's sessions, and how many each may. Every session of both kinds (a handshake-era
Streamable HTTP session, an HTTP+SSE stream's) counts against ``http.max_sessions`` and against its holder's quota:
an authenticated identity's (``http.max_sessions_per_identity``), or, without authentication, where every caller is
the configured identity, its client address's (``http.max_sessions_per_address``; an IPv6 address by its /64, the
block one host is usually given). A new session past either is refused before it is made; the quota frees when a
session ends.

With a store replicas share (``gateway.state.shared``), a holder's sessions are counted in it, on whichever replica
they were made (``StateStore.add`` with the quota as its limit), so that the quota holds across replicas; the count
expires ``http.session_idle_timeout`` after its last change or refresh, so that the sessions of a replica that died
without giving theirs back free their places. ``http.max_sessions`` stays a bound of each replica's own: it is what
one process may hold in memory.

A full gateway evicts nobody: a session is its caller's state (remembered approvals, subscriptions, calls it may
resume), and letting a newcomer end a stranger's session would turn the bound into a way to disturb other
callers. The quota is what keeps the bound from being one caller's to fill."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from bastion.config import HttpConfig
from bastion.frontends.http.wire import HttpError
from bastion.model import Identity
from bastion.state import StateStore, StateUnavailable

log = logging.getLogger("bastion.http")


@dataclass(frozen=True, slots=True)
class Holder:
    """Whose quota a session counts against."""

    key: tuple[str, ...]
    who: str  # in words, for the refusal and the log
    setting: str  # the key that sets the quota
    limit: int


class Held(Protocol):
    id: str

    def ends_by_itself_at(self, idle_timeout: float) -> float | None:
        """When (``time.monotonic``) the session would end without its client doing anything, or None."""


def address_block(address: str) -> str:
    """What one client address counts as: an IPv4 address itself (also written as IPv4-mapped IPv6), an IPv6 one
    its /64; anything that is not an IP address (a Unix socket's peer) as it is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return str(ip)


def holder_of(identity: Identity, peer: str, *, authenticated: bool, settings: HttpConfig) -> Holder:
    """An authenticated caller is held to its identity's quota: by name, method and issuer (the groups and scopes of
    one credential may differ from the next one's of the same caller). Without authentication every caller is the
    same configured identity, so its address is what tells callers apart."""
    if authenticated:
        return Holder(("identity", identity.authenticated_by, identity.issuer or "", identity.name),
                      identity.describe(), "http.max_sessions_per_identity", settings.max_sessions_per_identity)
    block = address_block(peer)
    return Holder(("address", block), f"address {block}", "http.max_sessions_per_address",
                  settings.max_sessions_per_address)


QUOTA_KEY = "http-sessions-held:"


def quota_key(holder: Holder) -> str:
    """The store key of a holder's count: a digest, so that a name or an issuer holding ":" or "*" can neither
    reach another holder's count nor any other key."""
    return QUOTA_KEY + hashlib.sha256(repr(holder.key).encode()).hexdigest()[:40]


class SessionQuotas:
    """The open sessions by holder, and the refusals of a new one past a holder's quota or the gateway's bound;
    ``shared``, the store replicas share that counts each holder's sessions (None: this process counts them)."""

    def __init__(self, settings: HttpConfig, shared: StateStore | None = None) -> None:
        self.settings = settings
        self.shared = shared
        self._held: dict[tuple[str, ...], dict[str, Held]] = {}
        self.total = 0

    async def admit(self, holder: Holder, session: Held, request_id: Any = None) -> None:
        """Count ``session`` against its holder's quota and the gateway's bound, or raise the refusal."""
        if self.shared is None:
            self.check(holder, request_id)
            self.take(holder, session)
            return
        self._check_bound(request_id)
        try:
            counted = await self.shared.add(quota_key(holder), 1, limit=holder.limit,
                                            seconds=self.settings.session_idle_timeout)
        except StateUnavailable as exc:
            raise HttpError(503, -32000, f"a new session cannot be counted against {holder.who}'s quota "
                                         f"({holder.setting}): {exc}; retry later", request_id,
                            ((b"retry-after", str(self.settings.retry_after_seconds).encode()),)) from None
        if counted is None:
            self._refuse(holder, holder.limit, self._held.get(holder.key, {}).values(), request_id)
        self.take(holder, session)

    async def give_back(self, holder: Holder) -> None:
        """One of the holder's sessions ended for good (on any replica): its place in the shared count is free."""
        if self.shared is None:
            return
        try:
            await self.shared.add(quota_key(holder), -1)
        except StateUnavailable as exc:  # the count expires by itself a session_idle_timeout after its last change
            log.warning("could not give back a session of %s to its quota: %s", holder.who, exc)

    async def refresh(self, holder: Holder) -> None:
        """A session of the holder's is alive: its count outlives the idle timeout from now."""
        if self.shared is not None:
            await self.shared.add(quota_key(holder), 0, seconds=self.settings.session_idle_timeout)

    def held_by(self, holder: Holder) -> int:
        return len(self._held.get(holder.key, ()))

    def check(self, holder: Holder, request_id: Any = None) -> None:
        """Raise the refusal of one more session for ``holder``: its own quota first (429: this caller's usage, which
        it can free itself), then the gateway's bound (503: nobody gets one until some session ends)."""
        held = self._held.get(holder.key, {})
        if len(held) >= holder.limit:
            self._refuse(holder, len(held), held.values(), request_id)
        self._check_bound(request_id)

    def _refuse(self, holder: Holder, count: int, sessions: Any, request_id: Any) -> NoReturn:
        retry = self._retry_after(sessions)
        log.info("refused a new session to %s: it holds %d, its quota (%s)", holder.who, count, holder.setting)
        raise HttpError(429, -32000, f"{holder.who} has {count} sessions open, the most one "
                                         f"{'identity' if holder.key[0] == 'identity' else 'client address'} may "
                                         f"keep ({holder.setting}); end one (DELETE /mcp, or close an HTTP+SSE "
                                         f"or subscriptions/listen stream) or retry in {retry} s", request_id,
                            ((b"retry-after", str(retry).encode()),),
                            {"retryAfterSeconds": retry, "setting": holder.setting, "limit": holder.limit})

    def _check_bound(self, request_id: Any) -> None:
        if self.total >= self.settings.max_sessions:
            retry = self.settings.retry_after_seconds
            raise HttpError(503, -32000, f"{self.settings.max_sessions} sessions are open, the most this gateway keeps "
                                         f"(http.max_sessions); retry in {retry} s", request_id,
                            ((b"retry-after", str(retry).encode()),),
                            {"retryAfterSeconds": retry, "setting": "http.max_sessions",
                             "limit": self.settings.max_sessions})

    def take(self, holder: Holder, session: Held) -> None:
        self._held.setdefault(holder.key, {})[session.id] = session
        self.total += 1

    def release(self, holder: Holder, session: Held) -> None:
        """The session ended (DELETE, idle expiry, its stream closed): its place is free. Once per session."""
        held = self._held.get(holder.key)
        if held is None or held.pop(session.id, None) is None:
            return
        self.total -= 1
        if not held:
            del self._held[holder.key]

    def _retry_after(self, sessions: Any) -> int:
        """Seconds until one of the holder's sessions would end by itself (the quietest handshake-era session with no
        stream or call open); ``session_idle_timeout`` when none would (an open stream ends only when it closes)."""
        timeout = self.settings.session_idle_timeout
        now = time.monotonic()
        ends = [end for s in sessions if (end := s.ends_by_itself_at(timeout)) is not None]
        return max(1, math.ceil(min(ends, default=now + timeout) - now))
