"""Token buckets per principal, per tool and per server, with an injected clock for tests.

Limits name principals by name (``match``); buckets are kept per caller key, which also tells apart callers of one
name from different issuers or methods (see ``interceptors.principal_key``)."""

from __future__ import annotations

import fnmatch
import math
import re
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from bastion.policy.config import RateLimitConfig

RATE_LIMITED = -32000


@dataclass(slots=True)
class TokenBucket:
    rate: float
    burst: float
    tokens: float
    updated: float

    def take(self, now: float) -> float:
        """Take one token; returns 0 when granted, else the seconds until one is available."""
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


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
    """Checks every matching limit; a call is admitted only when all of them have a token."""

    def __init__(self, limits: Sequence[RateLimitConfig], clock: Callable[[], float] = time.monotonic) -> None:
        self._limits = tuple(limits)
        # Per limit, what the hot path needs: its scope, a compiled pattern (None for "*", which every
        # subject matches) and whether each principal has a bucket of its own.
        self._plans = tuple(
            (
                index,
                limit.scope,
                None if limit.match == "*" else re.compile(fnmatch.translate(limit.match)),
                limit.per_principal or limit.scope == "principal",
            )
            for index, limit in enumerate(self._limits)
        )
        self._clock = clock
        self._buckets: dict[tuple[int, str, str], TokenBucket] = {}
        self._rules = tuple(f"rate:{limit.scope}:{limit.match}" for limit in self._limits)
        # The buckets a (principal, server, tool) draws from, found once: matching patterns and building
        # keys on every call would cost more than taking the tokens.
        self._routes: dict[tuple[str, str, str], tuple[tuple[int, TokenBucket], ...]] = {}

    @property
    def limits(self) -> tuple[RateLimitConfig, ...]:
        return self._limits

    def _route(self, principal: str, server: str, tool: str, now: float,
               who: str) -> tuple[tuple[int, TokenBucket], ...]:
        route = []
        for index, scope, matcher, own_bucket in self._plans:
            subject = principal if scope == "principal" else server if scope == "server" else f"{server}/{tool}"
            if matcher is not None and not matcher.match(subject):
                continue
            key = (index, who if scope == "principal" else subject, who if own_bucket else "")
            bucket = self._buckets.get(key)
            if bucket is None:
                limit = self._limits[index]
                bucket = self._buckets[key] = TokenBucket(limit.rate, limit.burst, limit.burst, now)
            route.append((index, bucket))
        if len(self._routes) > 4096:
            self._routes.clear()  # the buckets themselves stay in ``_buckets``
        found = self._routes[(who, server, tool)] = tuple(route)
        return found

    def check(self, principal: str, server: str, tool: str, who: str | None = None) -> RateVerdict:
        """``principal`` is what limits match; ``who`` (default: the name) keys the caller's own buckets."""
        if not self._plans:
            return _ADMITTED
        now = self._clock()
        who = principal if who is None else who
        route = self._routes.get((who, server, tool))
        if route is None:
            route = self._route(principal, server, tool, now, who)
        wait, refused = 0.0, -1
        taken: list[TokenBucket] = []
        for index, bucket in route:
            delay = bucket.take(now)
            if delay > 0:
                if delay > wait:
                    wait, refused = delay, index
            else:
                taken.append(bucket)
        if wait > 0:
            # A refused call must not spend tokens from the buckets that did admit it.
            for bucket in taken:
                bucket.tokens = min(bucket.burst, bucket.tokens + 1.0)
            return RateVerdict(wait, self._rules[refused])
        return _ADMITTED
