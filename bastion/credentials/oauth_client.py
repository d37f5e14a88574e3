"""A user's own token for a remote MCP server, granted once through a link: the MCP specification's OAuth 2.1
authorization-code flow, with Bastion as the client (``[servers.X.auth] type = "authorization_code"``).

How one user's credentials for one server behave (``AuthorizationCodeCredentials``):

- With a token in the store (bastion/credentials/store.py, encrypted at rest, per server and user) every request
  carries it; ``refresh_before`` seconds before it expires it is renewed with its refresh token.
- Without one, the first request goes without, and the server's 401 says where its authorization lives
  (bastion/credentials/discovery.py). Bastion then prepares an authorization: its client at that authorization
  server (pre-registered ``client_id``; else its Client ID Metadata Document URL when the server accepts those; else
  RFC 7591 dynamic registration), PKCE S256, ``resource`` (RFC 8707) exactly as the server's metadata publishes it,
  and the scopes: the challenge's, else the configured ones, else all the metadata's ``scopes_supported``, else
  none (the parameter is left out), with ``offline_access`` when the authorization server lists it. The request is
  answered with the link (``CredentialsError.link``), which the user follows in a browser; the redirect comes back
  to ``/oauth/callback`` (bastion/credentials/callback.py), where the ``iss`` of the answer is checked (RFC 9207:
  exactly the issuer, and present when the server advertises it) before the code is exchanged for tokens.
  The same link is given again to every request until it is used or expires, so one person sees one link.
- A 403 with ``insufficient_scope`` naming scopes the token does not hold asks for a new authorization for the
  union of the scopes held and those challenged (step-up), at most ``MAX_STEP_UPS`` times in a row; a challenge
  for scopes already held is not worth a new authorization and is the answer.
- A 401 with a token tries its refresh token once; failing that the token is forgotten and the server's metadata
  read again, so a server that moved to another authorization server gets a new client registered there (a
  client of one authorization server is never shown to another).

Tokens, codes, verifiers and client secrets never reach a log line or an error message.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import httpx2

from bastion.transport.credentials import CredentialsError, UpstreamCredentials
from bastion.credentials.callback import CALLBACK_PATH, PENDING_LIFETIME, CallbackRefused, Callbacks, LoopbackListener
from bastion.credentials.config import UpstreamAuth
from bastion.credentials.discovery import (
    AuthorizationServer,
    Challenge,
    ProtectedResource,
    discover_authorization_server,
    discover_resource,
)
from bastion.credentials.store import TokenSet, TokenStore
from bastion.model import Identity

log = logging.getLogger("bastion.credentials")

MAX_STEP_UPS = 2  # new authorizations asked for by 403s in a row (the specification asks for a retry limit)
_TIMEOUT = httpx2.Timeout(10.0)
_MAX_ANSWER = 64 * 1024
_OFFLINE = "offline_access"


@dataclass(frozen=True)
class Client:
    """Bastion as a client of one authorization server."""

    issuer: str
    client_id: str
    secret: str | None
    auth_method: str  # client_secret_basic | client_secret_post | none

    def __repr__(self) -> str:
        return f"Client(issuer={self.issuer!r}, client_id={self.client_id!r}, auth_method={self.auth_method!r})"


@dataclass
class AuthorizationContext:
    """What every server's and user's authorization shares in one Bastion process: the callbacks the redirects come
    back to, where they come back (``redirect_uri()``), the clients registered so far by issuer, and the HTTP
    client factory."""

    callbacks: Callbacks
    redirect_uri: Callable[[], Awaitable[str]]
    http: Callable[[], httpx2.AsyncClient] = field(
        default=lambda: httpx2.AsyncClient(timeout=_TIMEOUT, follow_redirects=False))
    registered: dict[str, Client] = field(default_factory=dict)
    registering: asyncio.Lock = field(default_factory=asyncio.Lock)


class AuthorizationCodes:
    """Per-user authorization-code credentials for every server of one gateway (the ``authorization_code``
    builder of bastion/credentials/build.py's ``CredentialSource``).

    The redirects come back to a loopback listener opened on first need (``bastion run``), unless a frontend serves
    ``callbacks`` itself and said where (``served_at``, ``bastion serve --http``). Bastion's own connection to a
    server (the one that lists its tools; no caller) uses the authorization of ``operator``, the configured
    identity: on stdio the one person there is, on HTTP the one who runs the gateway and follows its logged link.
    Only the operator's links are logged: a link is a capability (whoever completes it binds their own account at
    the authorization server to that user), so another user's goes to that user's client alone.
    """

    def __init__(self, operator: str, *, http: Callable[[], httpx2.AsyncClient] | None = None) -> None:
        self.operator = operator
        self.callbacks = Callbacks()
        self._loopback = LoopbackListener(self.callbacks)
        self.context = AuthorizationContext(self.callbacks, self._loopback.redirect_uri,
                                            **({"http": http} if http is not None else {}))
        self._made: dict[tuple[str, str], AuthorizationCodeCredentials] = {}

    def served_at(self, base_url: str) -> None:
        """A frontend at ``base_url`` serves ``callbacks`` at /oauth/callback: redirects come back there."""
        self.callbacks.redirect_uri = base_url.rstrip("/") + CALLBACK_PATH

    def __call__(self, name: str, server: Any, identity: Identity | None, store: TokenStore) -> UpstreamCredentials:
        user = identity.name if identity is not None else self.operator
        found = self._made.get((name, user))
        if found is None:
            url = getattr(server, "url", None)
            auth = getattr(server, "auth", None)
            if not isinstance(url, str) or not isinstance(auth, UpstreamAuth):
                raise CredentialsError(f"server {name!r}: authorization_code is for remote (url) servers with an "
                                       "auth table")
            found = self._made[(name, user)] = AuthorizationCodeCredentials(
                name, user, url, auth, store, self.context, log_link=user == self.operator)
        return found if identity is not None else BastionsOwnRequests(found)

    async def close(self) -> None:
        await self._loopback.close()


class BastionsOwnRequests:
    """The operator's credentials as Bastion's own connection to a server uses them (the one that lists its tools
    for the catalog). Its requests are Bastion's, with no client to show a link to: the link went to the log, so a
    request refused pending that authorization waits for it and is sent once more (``resend_when_authorized``, read
    by the HTTP transport) instead of failing what it was for. Per-user connections answer with the link instead:
    their client opens it and asks again."""

    def __init__(self, credentials: AuthorizationCodeCredentials) -> None:
        self.credentials = credentials
        self.server, self.user = credentials.server, credentials.user

    async def headers(self) -> Mapping[str, str]:
        return await self.credentials.headers()

    async def refused(self, status: int, www_authenticate: str | None) -> bool:
        return await self.credentials.refused(status, www_authenticate)

    async def changed(self) -> None:
        await self.credentials.changed()

    def pending_link(self) -> str | None:
        return self.credentials.pending_link()

    async def resend_when_authorized(self) -> bool:
        """Wait (at most a link's lifetime) for the authorization the refusal asked for; True: send once more."""
        if self.credentials.pending_link() is None:  # completed already, or refused for good: no waiting
            return await self.credentials.authorized(within=0.0)
        authorized = await self.credentials.authorized()
        if not authorized:
            log.warning("server %s: %s did not authorize Bastion within %ds; the request is refused", self.server,
                        self.user, PENDING_LIFETIME)
        return authorized


@dataclass
class _Flow:
    """One authorization under way: what the redirect must match and what the token request sends."""

    state: str
    verifier: str
    scopes: tuple[str, ...]
    server: AuthorizationServer
    client: Client
    resource: str
    redirect_uri: str
    link: str
    deadline: float

    def __repr__(self) -> str:
        return f"_Flow(issuer={self.server.issuer!r}, scopes={self.scopes!r})"


def pkce_pair() -> tuple[str, str]:
    """A code verifier (RFC 7636: 43 to 128 characters of the unreserved set) and its S256 challenge."""
    verifier = secrets.token_urlsafe(64)
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def choose_scopes(challenge: Challenge, configured: list[str], resource: ProtectedResource,
                  server: AuthorizationServer) -> tuple[str, ...]:
    """The specification's scope selection: the challenge's, else the configuration's, else everything the
    resource supports, else none; with ``offline_access`` when the authorization server offers it."""
    chosen = list(challenge.scope or configured or resource.scopes_supported or ())
    if chosen and server.scopes_supported and _OFFLINE in server.scopes_supported and _OFFLINE not in chosen:
        chosen.append(_OFFLINE)
    return tuple(dict.fromkeys(chosen))


def choose_auth_method(supported: tuple[str, ...], has_secret: bool, configured: str | None) -> str:
    """How to authenticate at the token endpoint: the configured method when the server takes it, else the first
    of basic, post (with a secret) and none that it lists."""
    if configured is not None and configured in supported:
        return configured
    for method in (("client_secret_basic", "client_secret_post") if has_secret else ()) + ("none",):
        if method in supported:
            return method
    return configured or ("client_secret_basic" if has_secret else "none")


class AuthorizationCodeCredentials:
    """One user's credentials for one remote server (an ``UpstreamCredentials``)."""

    def __init__(self, server: str, user: str, url: str, auth: UpstreamAuth, store: TokenStore,
                 context: AuthorizationContext, *, log_link: bool = True) -> None:
        """``log_link``: the link is logged too (the operator's, whose connection has no client to be told)."""
        self.server = server
        self.user = user
        self._url = url
        self._auth = auth
        self._store = store
        self._context = context
        self._lock = asyncio.Lock()
        self._flow: _Flow | None = None
        self._issuer: AuthorizationServer | None = None  # who issued the token in the store, when known
        self._resource: str | None = None
        self._granted: tuple[str, ...] = ()  # the scopes the last completed authorization asked for
        self._step_ups: list[float] = []  # when the recent step-ups were asked for
        self._refreshed: str | None = None  # the access token a refresh was last tried for (once each)
        self._authorized = asyncio.Event()  # set (and replaced) each time an authorization completes
        self._log_link = log_link

    # ------------------------------------------------------------------------------- UpstreamCredentials
    async def headers(self) -> Mapping[str, str]:
        tokens = await self._store.get_async(self.server, self.user)
        if tokens is None:
            flow = self._live_flow()
            if flow is not None:
                raise self._needs(flow)
            return {}  # first contact: the server's 401 says where its authorization lives
        if tokens.expires_within(self._auth.refresh_before) and tokens.refresh_token and self._issuer is not None:
            async with self._lock:
                current = await self._store.get_async(self.server, self.user)
                if current is not None and current.access_token == tokens.access_token:
                    tokens = await self._refresh(tokens) or tokens
                elif current is not None:
                    tokens = current
        return {"Authorization": tokens.authorization()}

    async def refused(self, status: int, www_authenticate: str | None) -> bool:
        challenge = Challenge.parse(www_authenticate)
        async with self._lock:
            tokens = await self._store.get_async(self.server, self.user)
            if status == 401:
                return await self._unauthorized(tokens, challenge)
            if status == 403 and challenge.error == "insufficient_scope":
                return await self._step_up(tokens, challenge)
        return False

    async def changed(self) -> None:
        """Return when the user next completes an authorization (an upstream waiting to start again need not wait
        out its backoff)."""
        await self._authorized.wait()

    def pending_link(self) -> str | None:
        """The link of the authorization waiting for this user, if any (for an instance that could not start)."""
        flow = self._live_flow()
        return flow.link if flow is not None else None

    async def authorized(self, within: float = PENDING_LIFETIME) -> bool:
        """Wait at most ``within`` seconds for this user to hold a token (an authorization completed, or one held
        already); True when one is held."""
        completed = self._authorized  # taken first: an authorization completing meanwhile replaces it
        if await self._store.get_async(self.server, self.user) is not None:
            return True
        try:
            await asyncio.wait_for(completed.wait(), within)
        except asyncio.TimeoutError:
            return False
        return await self._store.get_async(self.server, self.user) is not None

    # ------------------------------------------------------------------------------------------ refusals
    async def _unauthorized(self, tokens: TokenSet | None, challenge: Challenge) -> bool:
        if tokens is not None:
            if tokens.refresh_token and self._refreshed != tokens.access_token:
                self._refreshed = tokens.access_token
                try:
                    if self._issuer is None:
                        await self._discover(challenge)
                    if await self._refresh(tokens) is not None:
                        return True
                except CredentialsError as exc:
                    log.info("server %s: the refresh token of %s could not be used (%s)", self.server, self.user, exc)
            await self._store.delete_async(self.server, self.user)
        flow = self._live_flow()
        if flow is not None and set(challenge.scope) <= set(flow.scopes) and tokens is None:
            raise self._needs(flow)
        raise self._needs(await self._begin(challenge, None))

    async def _step_up(self, tokens: TokenSet | None, challenge: Challenge) -> bool:
        wanted = set(challenge.scope)
        held = tuple(tokens.scope.split()) if tokens is not None and tokens.scope else self._granted
        if not wanted or wanted <= set(held):
            return False  # a new authorization cannot give what the token already has
        flow = self._live_flow()
        if flow is not None and wanted <= set(flow.scopes):
            raise self._needs(flow)
        now = time.monotonic()
        self._step_ups = [at for at in self._step_ups if at > now - PENDING_LIFETIME]
        if len(self._step_ups) >= MAX_STEP_UPS:
            log.warning("server %s: it asked %s for more scopes %d times in a row; not asked again for now",
                        self.server, self.user, MAX_STEP_UPS)
            return False
        self._step_ups.append(now)
        union = tuple(dict.fromkeys([*held, *challenge.scope]))
        raise self._needs(await self._begin(challenge, union))

    def _live_flow(self) -> _Flow | None:
        if self._flow is not None and self._flow.deadline < time.monotonic():
            self._context.callbacks.forget(self._flow.state)
            self._flow = None
        return self._flow

    def _needs(self, flow: _Flow) -> CredentialsError:
        return CredentialsError(f"{self.user} must authorize Bastion to reach this server: open the link to do so",
                                link=flow.link)

    # -------------------------------------------------------------------------------------- the flow
    async def _discover(self, challenge: Challenge) -> tuple[ProtectedResource, AuthorizationServer]:
        async with self._context.http() as http:
            resource = await discover_resource(http, self._url, challenge)
            server = await discover_authorization_server(http, resource.authorization_servers[0])
        if "S256" not in server.code_challenge_methods:
            raise CredentialsError(f"authorization server {server.issuer} does not say it supports PKCE with S256, "
                                   "which the MCP specification requires: Bastion does not authorize there")
        self._issuer, self._resource = server, resource.resource
        return resource, server

    async def _begin(self, challenge: Challenge, scopes: tuple[str, ...] | None) -> _Flow:
        resource, server = await self._discover(challenge)
        redirect_uri = await self._context.redirect_uri()
        client = await self._client(server, redirect_uri)
        chosen = scopes if scopes is not None else choose_scopes(challenge, self._auth.scopes, resource, server)
        verifier, code_challenge = pkce_pair()
        state = secrets.token_urlsafe(32)
        query = {"response_type": "code", "client_id": client.client_id, "redirect_uri": redirect_uri,
                 "state": state, "code_challenge": code_challenge, "code_challenge_method": "S256",
                 "resource": resource.resource}
        if chosen:
            query["scope"] = " ".join(chosen)
        separator = "&" if urlsplit(server.authorization_endpoint).query else "?"
        link = f"{server.authorization_endpoint}{separator}{urlencode(query, quote_via=quote)}"
        if self._flow is not None:
            self._context.callbacks.forget(self._flow.state)
        flow = self._flow = _Flow(state, verifier, chosen, server, client, resource.resource, redirect_uri, link,
                                  time.monotonic() + PENDING_LIFETIME)
        self._context.callbacks.expect(state, lambda params: self._complete(flow, params))
        if self._log_link:
            log.warning("server %s: %s must authorize Bastion; the link is given to their client and is: %s",
                        self.server, self.user, link)
        else:  # whoever follows a link binds their own account to this user: it goes to the user's client only
            log.warning("server %s: %s must authorize Bastion; the link is given to their client", self.server,
                        self.user)
        return flow

    async def _complete(self, flow: _Flow, params: Mapping[str, str]) -> str:
        """The redirect of ``flow`` came back: check it (RFC 9207), exchange the code, keep the tokens."""
        if self._flow is flow:
            self._flow = None
        if params.get("error"):
            raise CallbackRefused(f"the authorization server answered {params['error'][:100]!r}")
        iss = params.get("iss")
        if iss is None and flow.server.iss_parameter_supported:
            raise CallbackRefused("the authorization server says it names itself in its answer (RFC 9207) but this "
                                  "answer names no issuer")
        if iss is not None and iss != flow.server.issuer:
            raise CallbackRefused("the answer comes from another issuer than the one Bastion asked (RFC 9207)")
        code = params.get("code")
        if not code:
            raise CallbackRefused("the answer carries no authorization code")
        try:
            tokens = await self._token_request(flow.server, flow.client, {
                "grant_type": "authorization_code", "code": code, "redirect_uri": flow.redirect_uri,
                "code_verifier": flow.verifier, "resource": flow.resource})
        except CredentialsError as exc:
            raise CallbackRefused(str(exc)) from None
        if tokens.scope is None and flow.scopes:
            tokens = TokenSet(tokens.access_token, tokens.refresh_token, tokens.expires_at, " ".join(flow.scopes),
                              tokens.token_type)
        await self._store.put_async(self.server, self.user, tokens)
        self._issuer, self._resource, self._granted = flow.server, flow.resource, flow.scopes
        self._authorized.set()
        self._authorized = asyncio.Event()
        log.info("server %s: %s authorized Bastion (scopes %s)", self.server, self.user,
                 " ".join(flow.scopes) or "the server's default")
        return f"Bastion may now reach {self.server} for {self.user}. You can close this page."

    async def _refresh(self, tokens: TokenSet) -> TokenSet | None:
        """New tokens for the refresh token, stored; None when the authorization server refused it."""
        assert self._issuer is not None and tokens.refresh_token is not None
        client = self._context.registered.get(self._issuer.issuer) or self._configured_client(self._issuer)
        if client is None:
            return None
        body = {"grant_type": "refresh_token", "refresh_token": tokens.refresh_token}
        if self._resource:
            body["resource"] = self._resource
        try:
            renewed = await self._token_request(self._issuer, client, body, keep_refresh=tokens.refresh_token)
        except CredentialsError as exc:
            log.info("server %s: renewing %s's token failed (%s)", self.server, self.user, exc)
            return None
        await self._store.put_async(self.server, self.user, renewed)
        return renewed

    # -------------------------------------------------------------------------------------- the client
    def _configured_client(self, server: AuthorizationServer) -> Client | None:
        auth = self._auth
        if auth.client_id is not None and (auth.issuer is None or auth.issuer == server.issuer):
            configured = auth.token_endpoint_auth_method if "token_endpoint_auth_method" in auth.model_fields_set \
                else None
            method = choose_auth_method(server.token_endpoint_auth_methods, auth.client_secret is not None,
                                        configured)
            return Client(server.issuer, auth.client_id, auth.client_secret, method)
        metadata_url = getattr(auth, "client_metadata_url", None)
        if metadata_url and server.client_id_metadata_documents:
            return Client(server.issuer, metadata_url, None, "none")
        return None

    async def _client(self, server: AuthorizationServer, redirect_uri: str) -> Client:
        configured = self._configured_client(server)
        if configured is not None:
            return configured
        async with self._context.registering:
            client = self._context.registered.get(server.issuer)
            if client is None:
                client = self._context.registered[server.issuer] = await self._register(server, redirect_uri)
        return client

    async def _register(self, server: AuthorizationServer, redirect_uri: str) -> Client:
        """Dynamic client registration (RFC 7591) at ``server``."""
        if server.registration_endpoint is None:
            raise CredentialsError(
                f"authorization server {server.issuer} takes no dynamic client registration: register Bastion there "
                f"(redirect URI {redirect_uri}) and set client_id (and client_secret) in servers.{self.server}.auth, "
                "or set client_metadata_url if it accepts client metadata documents")
        method = choose_auth_method(server.token_endpoint_auth_methods, True, None)
        loopback = urlsplit(redirect_uri).hostname in ("127.0.0.1", "localhost", "::1")
        metadata = {"client_name": "Bastion MCP gateway", "redirect_uris": [redirect_uri],
                    "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
                    "token_endpoint_auth_method": method, "application_type": "native" if loopback else "web"}
        async with self._context.http() as http:
            try:
                response = await http.post(server.registration_endpoint, json=metadata)
            except httpx2.HTTPError as exc:
                raise CredentialsError(f"registering at {server.issuer} failed: {type(exc).__name__}") from None
        answer = _json_object(response)
        client_id = answer.get("client_id") if answer is not None else None
        if response.status_code not in (200, 201) or not isinstance(client_id, str):
            raise CredentialsError(f"authorization server {server.issuer} refused Bastion's registration "
                                   f"(HTTP {response.status_code}{_oauth_error(answer)})")
        secret = answer.get("client_secret") if answer is not None else None
        granted = answer.get("token_endpoint_auth_method") if answer is not None else None
        auth_method = granted if isinstance(granted, str) else ("client_secret_basic" if secret else "none")
        log.info("server %s: Bastion registered at %s as a %s client", self.server, server.issuer,
                 "confidential" if secret else "public")
        return Client(server.issuer, client_id, secret if isinstance(secret, str) else None, auth_method)

    async def _token_request(self, server: AuthorizationServer, client: Client, body: dict[str, str],
                             keep_refresh: str | None = None) -> TokenSet:
        headers = {"accept": "application/json"}
        form = dict(body)
        if client.auth_method == "client_secret_basic" and client.secret is not None:
            # RFC 6749 section 2.3.1: both parts form-encoded before they are joined and base64-encoded
            pair = f"{quote(client.client_id, safe='')}:{quote(client.secret, safe='')}"
            headers["authorization"] = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
        else:
            form["client_id"] = client.client_id
            if client.auth_method == "client_secret_post" and client.secret is not None:
                form["client_secret"] = client.secret
        async with self._context.http() as http:
            try:
                response = await http.post(server.token_endpoint, data=form, headers=headers)
            except httpx2.HTTPError as exc:
                raise CredentialsError(f"the token endpoint of {server.issuer} failed: {type(exc).__name__}") from None
        answer = _json_object(response)
        if response.status_code != 200 or answer is None:
            raise CredentialsError(f"the token endpoint of {server.issuer} refused (HTTP {response.status_code}"
                                   f"{_oauth_error(answer)})")
        return TokenSet.from_response(answer, refresh_token=keep_refresh)


def _json_object(response: httpx2.Response) -> dict[str, Any] | None:
    if len(response.content) > _MAX_ANSWER:
        return None
    try:
        parsed = response.json()
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _oauth_error(answer: Mapping[str, Any] | None) -> str:
    """The ``error`` code of an OAuth error answer, never its description (which may echo what was sent)."""
    error = answer.get("error") if answer is not None else None
    return f": {error[:64]}" if isinstance(error, str) else ""
