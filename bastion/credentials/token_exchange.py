"""A per-user token for a remote server, exchanged for the caller's own (RFC 8693, ``type = "token_exchange"``).

The caller's validated bearer token (``Identity.subject_token``) is only ever the ``subject_token`` of the exchange
at the authorization server; what goes upstream is the token the exchange issued for the upstream's resource.
That token is kept in the encrypted store under the caller's name, renewed before it expires (with its refresh
token when it has one, else by exchanging the caller's latest token again), and dropped when the upstream refuses
it. ``bastion credentials revoke USER`` empties the store: the next request exchanges anew, with the caller's
current token, which the gateway has validated on that very request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Mapping

from bastion.transport.credentials import CredentialsError
from bastion.credentials.client_credentials import (FRESH_TOKEN_SECONDS, TokenEndpoint, challenge_scopes,
                                                    renewal_margin)
from bastion.credentials.config import UpstreamAuth
from bastion.credentials.store import TokenSet, TokenStore
from bastion.model import Identity

log = logging.getLogger("bastion.credentials")

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"


class TokenExchange:
    """``UpstreamCredentials`` of one caller (``user``) at one server, by RFC 8693 token exchange."""

    def __init__(self, server: str, user: str, auth: UpstreamAuth, resource: str, endpoint: TokenEndpoint,
                 store: TokenStore, subject_token: str | None, clock: Callable[[], float] = time.time) -> None:
        self.server = server
        self.user = user
        self._auth = auth
        self._resource = resource
        self._endpoint = endpoint
        self._store = store
        self._subject = subject_token
        self._clock = clock
        self._scopes = list(auth.scopes)
        self._margin = auth.refresh_before
        self._obtained_at = float("-inf")
        self._renewing = asyncio.Lock()

    def present(self, identity: Identity) -> None:
        """The caller's latest validated token: the one a new exchange is made with."""
        if identity.subject_token:
            self._subject = identity.subject_token

    async def headers(self) -> Mapping[str, str]:
        # read from the store on every request, so a revocation by `bastion credentials revoke` counts at once
        tokens = await self._store.get_async(self.server, self.user)
        if tokens is None or tokens.expires_within(self._margin, self._clock()):
            tokens = await self._renew(tokens)
        return {"Authorization": tokens.authorization()}

    async def refused(self, status: int, www_authenticate: str | None) -> bool:
        if status == 403:
            wanted = challenge_scopes(www_authenticate)
            missing = [scope for scope in wanted if scope not in self._scopes]
            if not missing:
                return False  # more of the same would be refused the same
            self._scopes += missing
            log.info("server %s: asks for scope %s; exchanging %s's token again for it", self.server,
                     " ".join(missing), self.user)
        elif status != 401:
            return False
        elif self._clock() - self._obtained_at < FRESH_TOKEN_SECONDS:
            log.warning("server %s: refused %s's token just exchanged (401); check servers.%s.auth.resource and "
                        "audience", self.server, self.user, self.server)
            return False
        stale = await self._store.get_async(self.server, self.user)
        try:
            fresh = await self._renew(stale, force=True)
        except CredentialsError as exc:
            log.warning("server %s: no new token for %s: %s", self.server, self.user, exc)
            return False
        return stale is None or fresh.access_token != stale.access_token

    async def _renew(self, seen: TokenSet | None, force: bool = False) -> TokenSet:
        async with self._renewing:
            current = await self._store.get_async(self.server, self.user)
            usable = current is not None and not current.expires_within(self._margin, self._clock())
            if usable and (current != seen or not force):
                return current  # type: ignore[return-value]  # renewed by another request meanwhile
            tokens = None
            if current is not None and current.refresh_token and not force:
                tokens = await self._refreshed(current.refresh_token)
            if tokens is None:
                tokens = await self._exchanged()
            await self._store.put_async(self.server, self.user, tokens)
            self._obtained_at = self._clock()
            self._margin = renewal_margin(tokens, self._auth.refresh_before, self._clock())
            return tokens

    async def _refreshed(self, refresh_token: str) -> TokenSet | None:
        form = {"grant_type": "refresh_token", "refresh_token": refresh_token}
        if self._scopes:
            form["scope"] = " ".join(self._scopes)
        try:
            return await self._endpoint.grant(form, f"refreshing {self.user}'s token")
        except CredentialsError as exc:
            log.info("server %s: %s; exchanging the caller's token instead", self.server, exc)
            return None

    async def _exchanged(self) -> TokenSet:
        if self._subject is None:
            raise CredentialsError(f"this server takes a token exchanged for the caller's own, and "
                                   f"{self.user} presented none: call through `bastion serve --http` with an OAuth "
                                   "bearer token (auth.issuers)")
        form = {"grant_type": GRANT_TYPE, "subject_token": self._subject, "subject_token_type": ACCESS_TOKEN_TYPE,
                "requested_token_type": ACCESS_TOKEN_TYPE, "resource": self._resource}
        if self._auth.audience:
            form["audience"] = self._auth.audience
        if self._scopes:
            form["scope"] = " ".join(self._scopes)
        tokens = await self._endpoint.grant(form, f"exchanging {self.user}'s token")
        log.info("server %s: exchanged %s's token for one of its own", self.server, self.user)
        return tokens
