"""Token buckets per principal, per tool and per server, kept in the gateway's state store (bastion/state/), so that
replicas sharing one store share the buckets: a limit of burst N admits N calls in all, whichever replicas take them.

Limits name principals by name (``match``); buckets are kept per caller key, which also tells apart callers of one
name from different issuers or methods (see ``interceptors.principal_key``). A bucket's key carries a digest of its
limit (scope, match, rate, burst, per_principal), so a reload that changes a limit starts fresh buckets for it and
one that keeps it keeps them, whichever process, old runtime or new, takes the next token."""

from __future__ import annotations

import fnmatch
import hashlib
import math
import re
from dataclasses import dataclass
from typing import Sequence

from bastion.policy.config import RateLimitConfig
from bastion.state import Bucket, StateStore

RATE_LIMITED = -32000
_KEY = "rate:"  # the buckets' keys in the state store


def limit_digest(limit: RateLimitConfig) -> str:
    """A short digest of what makes a limit's buckets: the same limit, the same buckets, in any process."""
    text = repr((limit.scope, limit.match, float(limit.rate), float(limit.burst), bool(limit.per_principal)))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def bucket_key(digest: str, subject: str, who: str) -> str:
    """Of one size whatever the caller's strings hold (``:``, ``*``, anything): hashed, never joined, so that no
    subject and caller can make another pair's key."""
    named = hashlib.sha256(len(subject).to_bytes(4, "big") + subject.encode("utf-8", "surrogatepass")
                           + who.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{_KEY}{digest}:{named}"


@dataclass(frozen=True, slots=True)
class RateVerdict:
    retry_after: float = 0.0
    rule: str = ""

    @property
    def allowed(self) -> bool:
        return self.retry_after == 0.0

    @property
    def retry_after_seconds(self) -> int:
        # Whole seconds, rounded up, so a client that waits exactly this long succeeds.
        return max(1, math.ceil(self.retry_after))


_ADMITTED = RateVerdict()  # frozen: one instance serves every admitted call


class RateLimiter:
    """Checks every matching limit; a call is admitted only when all of them have a token, taken in one operation
    of the store (one round trip to Redis)."""

    def __init__(self, limits: Sequence[RateLimitConfig], store: StateStore) -> None:
        self._limits = tuple(limits)
        # Per limit, what the hot path needs: its scope, a compiled pattern (None for "*", which every
        # subject matches), whether each principal has a bucket of its own, and its buckets' digest.
        self._plans = tuple(
            (
                index,
                limit.scope,
                None if limit.match == "*" else re.compile(fnmatch.translate(limit.match)),
                limit.per_principal or limit.scope == "principal",
                limit_digest(limit),
            )
            for index, limit in enumerate(self._limits)
        )
        self._store = store
        self._rules = tuple(f"rate:{limit.scope}:{limit.match}" for limit in self._limits)
        # The buckets a (caller, server, tool) draws from, and the limit of each, found once: matching patterns
        # and hashing keys on every call would cost more than taking the tokens.
        self._routes: dict[tuple[str, str, str], tuple[tuple[Bucket, ...], tuple[int, ...]]] = {}

    @property
    def limits(self) -> tuple[RateLimitConfig, ...]:
        return self._limits

    def _route(self, principal: str, server: str, tool: str,
               who: str) -> tuple[tuple[Bucket, ...], tuple[int, ...]]:
        buckets, indexes = [], []
        for index, scope, matcher, own_bucket, digest in self._plans:
            subject = principal if scope == "principal" else server if scope == "server" else f"{server}/{tool}"
            if matcher is not None and not matcher.match(subject):
                continue
            limit = self._limits[index]
            key = bucket_key(digest, who if scope == "principal" else subject, who if own_bucket else "")
            buckets.append(Bucket(key, float(limit.rate), float(limit.burst)))
            indexes.append(index)
        if len(self._routes) > 4096:
            self._routes.clear()  # a route is found again from the limits; the buckets are the store's
        found = self._routes[(who, server, tool)] = (tuple(buckets), tuple(indexes))
        return found

    async def check(self, principal: str, server: str, tool: str, who: str | None = None) -> RateVerdict:
        """``principal`` is what limits match; ``who`` (default: the name) keys the caller's own buckets. Raises
        ``StateUnavailable`` when the store cannot be reached: the caller refuses the call."""
        who = principal if who is None else who
        route = self._routes.get((who, server, tool))
        if route is None:
            route = self._route(principal, server, tool, who)
        buckets, indexes = route
        if not buckets:
            return _ADMITTED
        taken = await self._store.take(buckets)
        if taken.granted:
            return _ADMITTED
        return RateVerdict(taken.wait, self._rules[indexes[taken.refused]])
