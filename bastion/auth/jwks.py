"""An issuer's signing keys: where they are (configured, or read once from the issuer's metadata), fetched with a
bounded timeout and kept. A key set older than ``jwks_refresh_seconds`` is fetched again in the background while
the old keys keep working; a token whose kid is unknown fetches it again at most once per
``jwks_min_refetch_seconds`` (that is how a rotated-in key is found), and never in a loop; an issuer that is down
leaves the cached keys in use."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

import httpx2
from joserfc.jwk import JWKRegistry, Key

from bastion.auth.metadata import MetadataUnavailable, discover

log = logging.getLogger("bastion.auth")

# Which key type (and curve) each algorithm's signature is made with: a key of another type never checks a token,
# whatever its header says (the HS/RS confusion is a token that names a symmetric algorithm for an RSA key).
KEY_TYPE_OF = {"RS256": ("RSA", None), "RS384": ("RSA", None), "RS512": ("RSA", None),
               "PS256": ("RSA", None), "PS384": ("RSA", None), "PS512": ("RSA", None),
               "ES256": ("EC", "P-256"), "ES384": ("EC", "P-384"), "ES512": ("EC", "P-521"),
               "EdDSA": ("OKP", None)}


class KeysUnavailable(Exception):
    """The issuer's key set has never been fetched, and cannot be now."""


class IssuerEndpoints:
    """An issuer's jwks_uri and introspection_endpoint: as configured, or read from its metadata the first time one
    is needed (a failed read is tried again at most once per ``retry_seconds``)."""

    def __init__(self, issuer: str, client: httpx2.AsyncClient, *, jwks_uri: str | None,
                 introspection_endpoint: str | None, retry_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.issuer = issuer
        self._client = client
        self._jwks_uri = jwks_uri
        self._introspection = introspection_endpoint
        self._discovered = jwks_uri is not None and introspection_endpoint is not None
        self._retry = retry_seconds
        self._clock = clock
        self._last_attempt: float | None = None
        self._lock = asyncio.Lock()

    async def jwks_uri(self) -> str | None:
        if self._jwks_uri is None:
            await self._discover()
        return self._jwks_uri

    async def introspection_endpoint(self) -> str | None:
        if self._introspection is None:
            await self._discover()
        return self._introspection

    async def _discover(self) -> None:
        async with self._lock:
            if self._discovered:
                return
            now = self._clock()
            if self._last_attempt is not None and now - self._last_attempt < self._retry:
                return
            self._last_attempt = now
            try:
                found = await discover(self._client, self.issuer)
            except MetadataUnavailable:
                log.warning("issuer %s: no metadata found at its well-known URLs; set jwks_uri (or "
                            "introspection_endpoint) in its auth.issuers entry", self.issuer)
                return
            self._discovered = True
            self._jwks_uri = self._jwks_uri or found.jwks_uri
            self._introspection = self._introspection or found.introspection_endpoint


def import_keys(document: Any) -> dict[str, Key]:
    """The signature keys of a JWKS document by kid ("" for a key without one); keys for encryption, of an unknown
    type or malformed are left out, one bad key not spoiling the rest."""
    keys: dict[str, Key] = {}
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        return keys
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig" or entry.get("kty") not in ("RSA", "EC",
                                                                                                        "OKP"):
            continue
        public = {k: v for k, v in entry.items() if k not in ("d", "p", "q", "dp", "dq", "qi", "oth")}
        try:
            key = JWKRegistry.import_key(public)
        except Exception:  # noqa: BLE001 - joserfc raises many kinds for a malformed key; each means "unusable"
            continue
        keys[str(entry.get("kid", ""))] = key
    return keys


class JwksCache:
    def __init__(self, endpoints: IssuerEndpoints, client: httpx2.AsyncClient, *, refresh_seconds: float,
                 min_refetch_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._endpoints = endpoints
        self._client = client
        self._refresh = refresh_seconds
        self._min_refetch = min_refetch_seconds
        self._clock = clock
        self._keys: dict[str, Key] = {}
        self._fetched_at: float | None = None
        self._last_attempt: float | None = None
        self._inflight: asyncio.Task[None] | None = None
        self.fetches = 0  # how many times the key set was asked for (benchmarks and tests read it)

    def known(self, kid: str) -> bool:
        """True while a key of that kid is in the set (a token checked with a key since dropped is not reused)."""
        return kid in self._keys

    async def key(self, kid: str | None) -> Key | None:
        """The key a token's kid names, fetching the set when it was never fetched, or when the kid is unknown and
        the last fetch is at least ``min_refetch_seconds`` old; None when there is no such key."""
        if self._fetched_at is None:
            # Requests that arrive together at start wait for the one first fetch rather than fail beside it.
            if self._inflight is None and not self._may_fetch():
                raise KeysUnavailable(self._endpoints.issuer)
            await self._fetch()
            if self._fetched_at is None:
                raise KeysUnavailable(self._endpoints.issuer)
        elif (self._clock() - self._fetched_at > self._refresh and self._inflight is None
              and self._may_fetch()):
            self._inflight = asyncio.get_running_loop().create_task(self._fetch_now())
        found = self._lookup(kid)
        # A fetch already under way may bring the key (a rotation seen by several requests at once): wait for it.
        if found is None and (self._inflight is not None or self._may_fetch()):
            await self._fetch()
            found = self._lookup(kid)
        return found

    def _lookup(self, kid: str | None) -> Key | None:
        if kid is not None:
            return self._keys.get(kid)
        # A token without a kid is checked only when the issuer has exactly one key: which one is never a guess.
        return next(iter(self._keys.values())) if len(self._keys) == 1 else None

    def _may_fetch(self) -> bool:
        return self._last_attempt is None or self._clock() - self._last_attempt >= self._min_refetch

    async def _fetch(self) -> None:
        """One fetch for everyone who needs it now: a request that comes while one runs waits for that one."""
        if self._inflight is None:
            self._inflight = asyncio.get_running_loop().create_task(self._fetch_now())
        await asyncio.shield(self._inflight)

    async def _fetch_now(self) -> None:
        try:
            self._last_attempt = self._clock()
            self.fetches += 1
            uri = await self._endpoints.jwks_uri()
            if uri is None:
                return
            try:
                response = await self._client.get(uri, headers={"accept": "application/json"})
            except httpx2.HTTPError as exc:
                log.warning("issuer %s: its key set could not be fetched (%s); %s", self._endpoints.issuer,
                            type(exc).__name__, self._still())
                return
            if response.status_code != 200:
                log.warning("issuer %s: its key set answered HTTP %d; %s", self._endpoints.issuer,
                            response.status_code, self._still())
                return
            try:
                keys = import_keys(response.json())
            except ValueError:
                keys = {}
            if not keys:
                log.warning("issuer %s: its key set holds no usable signature key; %s", self._endpoints.issuer,
                            self._still())
                return
            self._keys = keys
            self._fetched_at = self._clock()
        finally:
            self._inflight = None

    def _still(self) -> str:
        return f"the {len(self._keys)} cached key(s) stay in use" if self._keys else "no token of it can be checked yet"
