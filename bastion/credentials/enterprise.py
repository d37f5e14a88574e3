"""Enterprise-managed authorization (``type = "enterprise_managed"``; the MCP extension of SEP-990, the IETF draft
"Identity Assertion Authorization Grant"): the enterprise's identity provider decides which MCP servers a user may
reach, without a consent screen per server.

1. At the identity provider's token endpoint, the user's identity assertion (an ID token: ``idp.subject_token``, or
   the caller's own bearer token) is exchanged (RFC 8693) for an Identity Assertion JWT Authorization Grant
   (ID-JAG, ``urn:ietf:params:oauth:token-type:id-jag``) whose audience is the MCP server's authorization server
   and whose resource is the MCP server.
2. At the MCP server's authorization server (``issuer``, else the one its protected resource metadata names), the
   ID-JAG is the assertion of a JWT bearer grant (RFC 7523), with Bastion's client authentication there; the
   answer is the access token the MCP server takes.

The identity assertion is sent only to the configured identity provider, never to anything the MCP server
publishes; the ID-JAG goes only to the authorization server it names. The access token is kept in memory and
obtained again (both steps) ``refresh_before`` seconds before it expires, or once after a 401.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Mapping

from bastion.transport.credentials import CredentialsError
from bastion.credentials.client_credentials import (FRESH_TOKEN_SECONDS, TokenEndpoint, challenge_scopes,
                                                    renewal_margin)
from bastion.credentials.config import IdentityProvider, UpstreamAuth
from bastion.credentials.store import TokenSet

log = logging.getLogger("bastion.credentials")

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ID_JAG = "urn:ietf:params:oauth:token-type:id-jag"
SUBJECT_TOKEN_TYPES = {"id_token": "urn:ietf:params:oauth:token-type:id_token",
                       "saml2": "urn:ietf:params:oauth:token-type:saml2",
                       "access_token": "urn:ietf:params:oauth:token-type:access_token"}


def identity_provider_endpoint(idp: IdentityProvider, where: str) -> TokenEndpoint:
    """The identity provider's token endpoint, with Bastion's client there (basic with a secret, else public)."""
    as_client = UpstreamAuth.model_construct(
        type="client_credentials", issuer=idp.issuer, token_endpoint=idp.token_endpoint, client_id=idp.client_id,
        client_secret=idp.client_secret, ca_file=idp.ca_file, private_key_file=None, private_key_id=None,
        signing_algorithm=None, token_endpoint_auth_method="client_secret_basic" if idp.client_secret else "none")
    return TokenEndpoint(as_client, f"{where}.idp")


class EnterpriseManaged:
    """``UpstreamCredentials`` of one user (or of Bastion, with a configured identity assertion) at one server."""

    def __init__(self, server: str, user: str, auth: UpstreamAuth, resource: str, endpoint: TokenEndpoint,
                 idp: TokenEndpoint, subject_token: str | None, clock: Callable[[], float] = time.time) -> None:
        assert auth.idp is not None
        self.server = server
        self.user = user
        self._auth = auth
        self._resource = resource
        self._endpoint = endpoint  # the MCP server's authorization server
        self._idp = idp
        self._subject = subject_token
        self._clock = clock
        self._tokens: TokenSet | None = None
        self._scopes = list(auth.scopes)
        self._margin = auth.refresh_before
        self._obtained_at = float("-inf")
        self._renewing = asyncio.Lock()

    def present(self, subject_token: str | None) -> None:
        """The caller's latest validated token: the identity assertion a new exchange is made with."""
        if subject_token and self._auth.idp is not None and self._auth.idp.subject_token is None:
            self._subject = subject_token

    async def headers(self) -> Mapping[str, str]:
        tokens = self._tokens
        if tokens is None and not self._endpoint.known:
            try:
                await self._endpoint.url()
            except CredentialsError as exc:
                log.info("server %s: %s; asking the server", self.server, exc)
                return {}  # the first request goes without: its 401 names the server's metadata
        if tokens is None or tokens.expires_within(self._margin, self._clock()):
            tokens = await self._renew(tokens)
        return {"Authorization": tokens.authorization()}

    async def refused(self, status: int, www_authenticate: str | None) -> bool:
        if status == 401 and self._tokens is None and not self._endpoint.known:
            await self._endpoint.url(www_authenticate)
        if status == 403:
            missing = [scope for scope in challenge_scopes(www_authenticate) if scope not in self._scopes]
            if not missing:
                return False
            self._scopes += missing
            log.info("server %s: asks for scope %s; asking for a grant with it for %s", self.server,
                     " ".join(missing), self.user)
        elif status != 401:
            return False
        elif self._clock() - self._obtained_at < FRESH_TOKEN_SECONDS:
            log.warning("server %s: refused %s's token just issued (401); check servers.%s.auth.resource and "
                        "scopes", self.server, self.user, self.server)
            return False
        stale = self._tokens
        try:
            fresh = await self._renew(stale, force=True)
        except CredentialsError as exc:
            log.warning("server %s: no new token for %s: %s", self.server, self.user, exc)
            return False
        return stale is None or fresh.access_token != stale.access_token

    async def _renew(self, seen: TokenSet | None, force: bool = False) -> TokenSet:
        async with self._renewing:
            current = self._tokens
            usable = current is not None and not current.expires_within(self._margin, self._clock())
            if usable and (current is not seen or not force):
                return current  # type: ignore[return-value]
            grant = await self._identity_grant()
            form = {"grant_type": JWT_BEARER, "assertion": grant}
            if self._scopes:
                form["scope"] = " ".join(self._scopes)
            tokens = await self._endpoint.grant(form, f"the JWT bearer grant for {self.user} (the ID-JAG)")
            self._tokens = tokens
            self._obtained_at = self._clock()
            self._margin = renewal_margin(tokens, self._auth.refresh_before, self._clock())
            log.info("server %s: obtained a token for %s by enterprise-managed authorization", self.server, self.user)
            return tokens

    async def _identity_grant(self) -> str:
        """Step 1: the user's identity assertion exchanged at the identity provider for an ID-JAG naming the MCP
        server's authorization server and the MCP server."""
        idp = self._auth.idp
        assert idp is not None
        if not self._subject:
            raise CredentialsError(f"this server takes enterprise-managed authorization, and {self.user} presented no "
                                   "identity assertion: call through `bastion serve --http` with a bearer token of "
                                   f"the identity provider, or set servers.{self.server}.auth.idp.subject_token")
        await self._endpoint.url()  # the authorization server's issuer is the grant's audience
        audience = self._endpoint.issuer
        if audience is None:
            raise CredentialsError(f"servers.{self.server}.auth: the authorization server's issuer is not known (only "
                                   f"its token_endpoint is configured): set servers.{self.server}.auth.issuer")
        resource = self._auth.resource or self._endpoint.published_resource or self._resource
        form = {"grant_type": TOKEN_EXCHANGE, "requested_token_type": ID_JAG, "subject_token": self._subject,
                "subject_token_type": SUBJECT_TOKEN_TYPES[idp.subject_token_type], "audience": audience,
                "resource": resource}
        if self._scopes:
            form["scope"] = " ".join(self._scopes)
        answer = await self._idp.grant(form, f"exchanging {self.user}'s identity assertion at the identity provider")
        return answer.access_token
