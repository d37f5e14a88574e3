"""Opaque (or any) access tokens checked by asking their issuer (RFC 7662): the answer must say active, name this
gateway's resource in aud and the issuer in iss (when it says one), and be within exp and nbf. An active answer is
reused for ``introspection_cache_seconds`` and never past the token's exp; a refusal is not remembered, so a
token the issuer did not know a moment ago is asked about again."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any, Callable, Mapping

import httpx2

from bastion.auth.base import AuthFailure
from bastion.auth.jwks import IssuerEndpoints
from bastion.auth.jwt import check_times, named_audiences

log = logging.getLogger("bastion.auth")

CACHE_ENTRIES = 4096
# Introspections one issuer is asked at once; past them a request waits, and past WAITING it is refused at once, so
# that a flood of made-up opaque tokens costs the issuer a bounded number of requests, not one per token sent.
IN_FLIGHT = 16
WAITING = 64


def _unavailable() -> AuthFailure:
    return AuthFailure(503, "the authorization server cannot be asked about this token right now; retry later",
                       None, "temporarily_unavailable", "introspection_unavailable")


def _inactive(reason: str, message: str = "the access token is not active") -> AuthFailure:
    return AuthFailure(401, message, None, "invalid_token", reason)


class Introspector:
    def __init__(self, issuer: str, endpoints: IssuerEndpoints, client: httpx2.AsyncClient, *,
                 audiences: frozenset[str],
                 client_id: str | None, client_secret: str | None, cache_seconds: float, skew: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.issuer = issuer
        self._endpoints = endpoints
        self._client = client
        self._audiences = audiences
        self._auth = (client_id, client_secret) if client_id is not None and client_secret is not None else None
        self._cache_seconds = cache_seconds
        self._skew = skew
        self._clock = clock
        # token -> (claims, reuse until, wall clock); oldest first, evicted in O(1)
        self._cache: OrderedDict[str, tuple[Mapping[str, Any], float]] = OrderedDict()
        self.asked = 0  # how many times the endpoint was asked (benchmarks and tests read it)
        self._slots = asyncio.Semaphore(IN_FLIGHT)
        self._waiting = 0

    async def validate(self, token: str) -> Mapping[str, Any]:
        now = self._clock()
        cached = self._cache.get(token)
        if cached is not None:
            claims, until = cached
            if now < until:
                return claims
            del self._cache[token]
        claims = await self._ask(token)
        self._check(claims, now)
        until = now + self._cache_seconds
        exp = claims.get("exp")
        if isinstance(exp, (int, float)):
            until = min(until, exp)
        if until > now:
            if len(self._cache) >= CACHE_ENTRIES:
                self._cache.popitem(last=False)
            self._cache[token] = (claims, until)
        return claims

    async def _ask(self, token: str) -> Mapping[str, Any]:
        if self._slots.locked() and self._waiting >= WAITING:
            log.warning("issuer %s: %d introspections are waiting already; this one is refused", self.issuer,
                        self._waiting)
            raise _unavailable()
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        try:
            return await self._ask_now(token)
        finally:
            self._slots.release()

    async def _ask_now(self, token: str) -> Mapping[str, Any]:
        endpoint = await self._endpoints.introspection_endpoint()
        if endpoint is None:
            raise _unavailable()
        self.asked += 1
        try:
            response = await self._client.post(endpoint, data={"token": token, "token_type_hint": "access_token"},
                                               auth=self._auth, headers={"accept": "application/json"})
        except httpx2.HTTPError as exc:
            log.warning("issuer %s: its introspection endpoint could not be asked (%s)", self.issuer,
                        type(exc).__name__)
            raise _unavailable() from None
        if response.status_code in (401, 403):
            log.error("issuer %s: its introspection endpoint refused this gateway's credentials (HTTP %d); check "
                      "client_id and client_secret in its auth.issuers entry", self.issuer, response.status_code)
            raise _unavailable()
        if response.status_code != 200:
            log.warning("issuer %s: its introspection endpoint answered HTTP %d", self.issuer, response.status_code)
            raise _unavailable()
        try:
            claims = response.json()
        except ValueError:
            claims = None
        if not isinstance(claims, dict):
            log.warning("issuer %s: its introspection endpoint answered something other than a JSON object",
                        self.issuer)
            raise _unavailable()
        return claims

    def _check(self, claims: Mapping[str, Any], now: float) -> None:
        if claims.get("active") is not True:
            raise _inactive("inactive")
        if claims.get("iss", self.issuer) != self.issuer:
            raise _inactive("wrong_issuer", "the access token was not issued by an authorization server this gateway "
                                            "trusts")
        if self._audiences.isdisjoint(named_audiences(claims)):
            raise _inactive("wrong_audience", "the access token was not issued for this resource (its aud does not "
                                              "name it)")
        try:
            check_times(claims, now=now, skew=self._skew, exp_required=False)
        except AuthFailure as failure:
            raise _inactive(failure.reason, failure.message) from None
