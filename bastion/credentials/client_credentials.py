"""Bastion's own token for a remote server (OAuth 2.1 client credentials), and the token endpoint it shares with the
token exchange: where it is (RFC 8414 metadata, else OpenID Connect discovery), how Bastion authenticates there,
and what its answers and refusals mean.

A token is asked for on the first request and again ``refresh_before`` seconds before it expires, once however
many requests wait for it at that moment; a 401 from the upstream drops it and asks once for another.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit, urlunsplit

import httpx2

from bastion.credentials.assertion import ASSERTION_TYPE, ClientAssertion
from bastion.transport.credentials import CredentialsError
from bastion.credentials.config import UpstreamAuth
from bastion.credentials.discovery import Challenge, discover_authorization_server, discover_resource
from bastion.credentials.store import TokenSet

log = logging.getLogger("bastion.credentials")

_TIMEOUT = httpx2.Timeout(10.0)
_SCOPE_IN_CHALLENGE = re.compile(r'\bscope="([^"]*)"')
_MAX_ANSWER = 64 * 1024
# A token refused with 401 this soon after it was issued is refused for what it is (another resource, a client the
# server does not know), not for its age: asking for another at once would only ask at the rate of the requests.
FRESH_TOKEN_SECONDS = 10.0  # a token endpoint's or metadata document's answer larger than this is not one


def metadata_urls(issuer: str) -> list[str]:
    """Where an issuer's metadata may be: RFC 8414's well-known path inserted before the issuer's path, then
    OpenID Connect's inserted the same way, then appended to it (the form most OIDC providers serve)."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    inserted = [urlunsplit((parts.scheme, parts.netloc, f"/.well-known/{name}{path}", "", ""))
                for name in ("oauth-authorization-server", "openid-configuration")]
    appended = urlunsplit((parts.scheme, parts.netloc, f"{path}/.well-known/openid-configuration", "", ""))
    return list(dict.fromkeys([*inserted, appended]))


class TokenEndpoint:
    """One authorization server's token endpoint, as Bastion's client ``client_id`` uses it.

    Where it is: ``token_endpoint``; else the metadata of ``issuer``; else (``resource_url``, the upstream server's
    URL, for client credentials and enterprise-managed authorization) the authorization server that the server's
    Protected Resource Metadata names (RFC 9728: the 401's ``resource_metadata``, else the well-known URLs), whose
    own metadata must name exactly that issuer."""

    def __init__(self, auth: UpstreamAuth, where: str, client: Callable[[], httpx2.AsyncClient] | None = None,
                 resource_url: str | None = None) -> None:
        self._auth = auth
        self._where = where  # "servers.NAME.auth", for messages that name the key to fix
        self._client = client or self._new_client
        self._url: str | None = auth.token_endpoint
        self.issuer: str | None = auth.issuer  # the authorization server's identifier, once known
        self.published_resource: str | None = None  # the resource its protected resource metadata names, if read
        self._resource_url = resource_url
        self._discovery = asyncio.Lock()
        self._assertion = ClientAssertion(auth.private_key_file, auth.signing_algorithm, auth.private_key_id, where) \
            if auth.token_endpoint_auth_method == "private_key_jwt" and auth.private_key_file else None

    @property
    def known(self) -> bool:
        """Whether the endpoint is known without asking the upstream server where its authorization lives."""
        return self._url is not None or self.issuer is not None

    def _new_client(self) -> httpx2.AsyncClient:
        # A private CA replaces the system's trust store for this authorization server only; still checked.
        verify: ssl.SSLContext | bool = True
        if self._auth.ca_file:
            try:
                verify = ssl.create_default_context(cafile=self._auth.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise CredentialsError(f"{self._where}.ca_file {self._auth.ca_file} cannot be used: {exc}") from None
        return httpx2.AsyncClient(timeout=_TIMEOUT, follow_redirects=False, verify=verify)

    async def url(self, challenge: str | None = None) -> str:
        """The token endpoint; ``challenge``: the upstream's ``WWW-Authenticate``, which may name its metadata."""
        if self._url is not None:
            return self._url
        async with self._discovery:
            if self._url is None:
                if self.issuer is None:
                    await self._from_protected_resource(challenge)
                else:
                    self._url = await self._discover(self.issuer)
        assert self._url is not None
        return self._url

    async def _from_protected_resource(self, challenge: str | None) -> None:
        if self._resource_url is None:
            raise CredentialsError(f"{self._where}: no issuer or token_endpoint, and no server URL to find one from")
        try:
            async with self._client() as client:
                published = await discover_resource(client, self._resource_url, Challenge.parse(challenge))
                server = await discover_authorization_server(client, published.authorization_servers[0])
        except CredentialsError as exc:
            raise CredentialsError(f"{self._where}: the authorization server is not configured and was not found "
                                   f"from the server ({exc}); set {self._where}.issuer") from None
        self.issuer, self.published_resource, self._url = server.issuer, published.resource, server.token_endpoint
        log.info("%s: the server's protected resource metadata names authorization server %s", self._where,
                 server.issuer)

    async def _discover(self, issuer: str) -> str:
        tried = []
        async with self._client() as client:
            for url in metadata_urls(issuer):
                try:
                    response = await client.get(url, headers={"accept": "application/json"})
                except httpx2.HTTPError as exc:
                    tried.append(f"{url}: {type(exc).__name__}")
                    continue
                metadata = _json_object(response) if response.status_code == 200 else None
                if metadata is None:
                    tried.append(f"{url}: HTTP {response.status_code}")
                    continue
                # RFC 8414 section 3.3: metadata of another issuer is not this issuer's (a mix-up)
                if metadata.get("issuer") not in (issuer, issuer.rstrip("/")):
                    tried.append(f"{url}: names another issuer")
                    continue
                endpoint = metadata.get("token_endpoint")
                if isinstance(endpoint, str) and endpoint.lower().startswith(("https://", "http://")):
                    return endpoint
                tried.append(f"{url}: no token_endpoint")
        raise CredentialsError(f"{self._where}.issuer {issuer}: no token endpoint found ({'; '.join(tried)}); "
                               f"check the issuer, or set {self._where}.token_endpoint")

    async def grant(self, form: Mapping[str, str], purpose: str) -> TokenSet:
        """POST a grant (``form``) with Bastion's client authentication and return the tokens it gave. A refusal
        is a CredentialsError naming the OAuth error and what to check, never a token or the secret."""
        url = await self.url()
        auth = self._auth
        data = dict(form)
        basic: tuple[str, str] | None = None
        assert auth.client_id is not None
        if self._assertion is not None:
            # RFC 7523 2.2: the assertion's audience is the authorization server (its issuer; the endpoint when
            # only that is configured), so no other server can replay it
            data.update(client_id=auth.client_id, client_assertion_type=ASSERTION_TYPE,
                        client_assertion=self._assertion.sign(auth.client_id, self.issuer or url))
        elif auth.token_endpoint_auth_method == "none" or auth.client_secret is None:
            data["client_id"] = auth.client_id  # a public client: it says who it is and proves nothing
        elif auth.token_endpoint_auth_method == "client_secret_post":
            data.update(client_id=auth.client_id, client_secret=auth.client_secret)
        else:
            basic = (auth.client_id, auth.client_secret)
        now = time.time()
        try:
            async with self._client() as client:
                response = await client.post(url, data=data, headers={"accept": "application/json"},
                                             auth=httpx2.BasicAuth(*basic) if basic else None)
        except httpx2.HTTPError as exc:
            raise CredentialsError(f"{purpose}: the token endpoint {url} cannot be reached ({type(exc).__name__})")
        answer = _json_object(response)
        if response.status_code != 200 or answer is None:
            raise CredentialsError(f"{purpose}: the token endpoint {url} refused ({_oauth_error(response, answer)}); "
                                   f"{_fix_for(answer, self._where, auth)}")
        try:
            return TokenSet.from_response(answer, now=now, refresh_token=form.get("refresh_token"))
        except CredentialsError as exc:
            raise CredentialsError(f"{purpose}: {exc}") from None


def _json_object(response: httpx2.Response) -> dict[str, Any] | None:
    if len(response.content) > _MAX_ANSWER:
        return None
    try:
        value = response.json()
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _oauth_error(response: httpx2.Response, answer: Mapping[str, Any] | None) -> str:
    """The OAuth error code (RFC 6749 5.2) and the status; the description is the server's and may be long, so
    only its first 200 characters."""
    if answer is None or not isinstance(answer.get("error"), str):
        return f"HTTP {response.status_code}"
    said = answer["error"]
    description = answer.get("error_description")
    if isinstance(description, str) and description:
        said += f": {description[:200]}"
    return f"{said}, HTTP {response.status_code}"


def _fix_for(answer: Mapping[str, Any] | None, where: str, auth: UpstreamAuth | None = None) -> str:
    error = answer.get("error") if answer else None
    if error in ("invalid_client", "unauthorized_client"):
        if auth is not None and auth.token_endpoint_auth_method == "private_key_jwt":
            return (f"check {where}.client_id, that the authorization server has the public half of "
                    f"{where}.private_key_file (private_key_id, signing_algorithm), and that the client may use "
                    "this grant")
        return f"check {where}.client_id and client_secret, and that the client may use this grant"
    if error == "invalid_scope":
        return f"check {where}.scopes against what the authorization server grants this client"
    if error in ("invalid_target", "invalid_request"):
        return f"check {where}.resource and audience"
    if error == "invalid_grant":
        return "the caller's token is not one the authorization server exchanges (expired, revoked or another's)"
    return "see the authorization server's log"


class ClientCredentials:
    """``UpstreamCredentials`` with Bastion's own token (``type = "client_credentials"``), one for every caller."""

    def __init__(self, server: str, auth: UpstreamAuth, resource: str, endpoint: TokenEndpoint,
                 clock: Callable[[], float] = time.time) -> None:
        self.server = server
        self._auth = auth
        self._resource = resource
        self._endpoint = endpoint
        self._clock = clock
        self._tokens: TokenSet | None = None
        self._margin = auth.refresh_before
        self._scopes = list(auth.scopes)
        self._obtained_at = float("-inf")
        self._renewing = asyncio.Lock()

    async def headers(self) -> Mapping[str, str]:
        tokens = self._tokens
        if tokens is None and not self._endpoint.known:
            # No authorization server configured: the server's metadata names it, at its well-known URL or in the
            # challenge of its 401, which the first request (sent without a token) gets
            try:
                await self._endpoint.url()
            except CredentialsError as exc:
                log.info("server %s: %s; asking the server", self.server, exc)
                return {}
        if tokens is None or tokens.expires_within(self._margin, self._clock()):
            tokens = await self._renew(tokens)
        return {"Authorization": tokens.authorization()}

    async def refused(self, status: int, www_authenticate: str | None) -> bool:
        # A 401 says the token is no longer good (revoked, the server's keys rotated): one new one is worth a try.
        # A 403 insufficient_scope names the scopes wanted: asked for once each, the authorization server decides.
        if status == 401 and self._tokens is None and not self._endpoint.known:
            try:
                await self._endpoint.url(www_authenticate)  # the challenge may name the server's metadata
            except CredentialsError as exc:
                log.warning("server %s: %s", self.server, exc)
                raise
        if status == 403:
            missing = [scope for scope in challenge_scopes(www_authenticate) if scope not in self._scopes]
            if not missing:
                return False
            self._scopes += missing
            log.info("server %s: asks for scope %s; asking for a token with it", self.server, " ".join(missing))
        elif status != 401:
            return False
        elif self._clock() - self._obtained_at < FRESH_TOKEN_SECONDS:
            log.warning("server %s: refused Bastion's token just issued (401); check servers.%s.auth.resource "
                        "and scopes", self.server, self.server)
            return False
        stale = self._tokens
        try:
            fresh = await self._renew(stale, force=True)
        except CredentialsError as exc:
            log.warning("server %s: no new token: %s", self.server, exc)
            return False
        return stale is None or fresh.access_token != stale.access_token

    async def _renew(self, seen: TokenSet | None, force: bool = False) -> TokenSet:
        async with self._renewing:
            current = self._tokens
            fresh = current is not None and not current.expires_within(self._margin, self._clock())
            # another request renewed it while this one waited (or nothing asks for a new one): keep it
            if fresh and (current is not seen or not force):
                return current  # type: ignore[return-value]
            form = {"grant_type": "client_credentials",
                    "resource": self._auth.resource or self._endpoint.published_resource or self._resource}
            if self._scopes:
                form["scope"] = " ".join(self._scopes)
            self._tokens = await self._endpoint.grant(form, "Bastion's client credentials")
            self._obtained_at = self._clock()
            self._margin = renewal_margin(self._tokens, self._auth.refresh_before, self._clock())
            log.info("server %s: obtained a client-credentials token (expires in %s)", self.server,
                     _lifetime(self._tokens, self._clock()))
            return self._tokens


def challenge_scopes(www_authenticate: str | None) -> list[str]:
    """The scopes a ``Bearer error="insufficient_scope", scope="..."`` challenge asks for (RFC 6750 3.1)."""
    if not www_authenticate or "insufficient_scope" not in www_authenticate:
        return []
    found = _SCOPE_IN_CHALLENGE.search(www_authenticate)
    return found.group(1).split() if found else []


def renewal_margin(tokens: TokenSet, refresh_before: float, now: float) -> float:
    """How long before expiry a token is renewed: ``refresh_before``, but at most half its lifetime, so a token
    that lives shorter than the margin is still used for a while rather than renewed on every request."""
    if tokens.expires_at is None:
        return refresh_before
    return max(0.0, min(refresh_before, (tokens.expires_at - now) / 2))


def _lifetime(tokens: TokenSet, now: float) -> str:
    return "an unknown time" if tokens.expires_at is None else f"{tokens.expires_at - now:.0f}s"
