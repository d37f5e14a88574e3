"""Which credentials each upstream connection carries, built from the configuration: the one place that reads a
server's ``auth`` table and ``identity_env``.

Bastion's own token (client credentials) is one per server, shared by the server's connections; a per-user token
(token exchange, authorization code) is one per server and identity; the encrypted store is opened only when a
server needs it. Static headers and a client certificate are the HTTP transport's own (``headers``,
``client_cert``), with nothing to renew.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Mapping

from bastion.transport.credentials import CredentialsError, UpstreamCredentials
from bastion.credentials.client_credentials import ClientCredentials, TokenEndpoint
from bastion.credentials.config import UpstreamAuth
from bastion.credentials.enterprise import EnterpriseManaged, identity_provider_endpoint
from bastion.credentials.secrets import IdentitySecrets
from bastion.credentials.store import TokenStore
from bastion.credentials.token_exchange import TokenExchange
from bastion.model import Identity

if TYPE_CHECKING:  # bastion.config imports this package's configuration: the annotation only, not a cycle
    from bastion.config import ServerConfig

log = logging.getLogger("bastion.credentials")

# (server name, its configuration, the caller (None: Bastion's own connection), the store) -> credentials
PerUserBuilder = Callable[[str, "ServerConfig", "Identity | None", TokenStore], UpstreamCredentials]


class CredentialSource:
    """Credentials for every upstream connection of one gateway."""

    def __init__(self, store: Callable[[], TokenStore] = TokenStore.default,
                 authorization_code: PerUserBuilder | None = None) -> None:
        self._open_store = store
        self._store: TokenStore | None = None
        self._authorization_code = authorization_code
        self._own: dict[str, ClientCredentials] = {}  # per server: Bastion's own token, shared by its connections
        self._endpoints: dict[str, TokenEndpoint] = {}
        self._idps: dict[str, TokenEndpoint] = {}
        self._enterprise: dict[tuple[str, str], EnterpriseManaged] = {}  # per server and user (or Bastion)

    def store(self) -> TokenStore:
        if self._store is None:
            self._store = self._open_store()
        return self._store

    def for_server(self, name: str, server: ServerConfig, identity: Identity | None) -> UpstreamCredentials | None:
        """The credentials of ``name``'s connection for ``identity`` (None: Bastion's own connection, the one that
        lists the server's tools); None when the server has no ``auth`` table."""
        auth: UpstreamAuth | None = server.auth
        if auth is None:
            return None
        if auth.type == "authorization_code":
            if self._authorization_code is None:
                return _Unavailable(f"server {name!r}: auth type authorization_code is not available in this gateway")
            return self._authorization_code(name, server, identity, self.store())
        resource = auth.resource or server.url or name
        if auth.type == "enterprise_managed":
            return self._enterprise_managed(name, server, auth, resource, identity)
        if auth.type == "client_credentials" or identity is None:
            # A token-exchange server's own connection has no caller whose token could be exchanged: it lists the
            # server's tools with Bastion's own token, by client credentials of the same client.
            return self._client_credentials(name, auth, resource, server.url)
        try:
            store = self.store()
        except CredentialsError as exc:  # a bad BASTION_CREDENTIALS_KEY: each request is told, nothing crashes
            return _Unavailable(str(exc))
        return TokenExchange(name, identity.name, auth, resource, self._endpoint(name, auth), store,
                             identity.subject_token)

    def identity_secrets(self, name: str, server: ServerConfig, identity: Identity | None) -> IdentitySecrets | None:
        """What ``identity``'s process of the local server ``name`` is started with, None when nothing."""
        wanted: Mapping[str, str] = server.identity_env
        if not wanted or identity is None:
            return None
        try:
            store = self.store()
        except CredentialsError as exc:
            return _NoSecrets(str(exc))  # type: ignore[return-value]
        return IdentitySecrets(store, name, dict(wanted), identity.name)

    def _client_credentials(self, name: str, auth: UpstreamAuth, resource: str,
                            url: str | None = None) -> ClientCredentials:
        found = self._own.get(name)
        if found is None:
            found = self._own[name] = ClientCredentials(name, auth, resource, self._endpoint(name, auth, url))
        return found

    def _enterprise_managed(self, name: str, server: ServerConfig, auth: UpstreamAuth, resource: str,
                            identity: Identity | None) -> UpstreamCredentials:
        """With a configured identity assertion, one token for every caller (Bastion's); else each caller's own
        token is their identity assertion, and Bastion's own connection (no caller) cannot have one."""
        assert auth.idp is not None
        shared = auth.idp.subject_token is not None
        if identity is None and not shared:
            return _Unavailable(f"server {name!r}: enterprise-managed authorization with the caller's token has no "
                                "caller on Bastion's own connection (which lists the server's tools): set "
                                f"servers.{name}.auth.idp.subject_token to an identity assertion of Bastion's")
        user = "Bastion" if shared or identity is None else identity.name
        key = (name, user)
        found = self._enterprise.get(key)
        if found is None:
            idp = self._idps.get(name)
            if idp is None:
                idp = self._idps[name] = identity_provider_endpoint(auth.idp, f"servers.{name}.auth")
            found = self._enterprise[key] = EnterpriseManaged(
                name, user, auth, resource, self._endpoint(name, auth, server.url), idp,
                auth.idp.subject_token or (identity.subject_token if identity is not None else None))
        elif identity is not None and not shared:
            found.present(identity.subject_token)
        return found

    def _endpoint(self, name: str, auth: UpstreamAuth, url: str | None = None) -> TokenEndpoint:
        found = self._endpoints.get(name)
        if found is None:
            found = self._endpoints[name] = TokenEndpoint(auth, f"servers.{name}.auth", resource_url=url)
        return found


class _NoSecrets:
    """Per-identity secrets that cannot be read (the store cannot be opened): the process is refused with why."""

    def __init__(self, message: str) -> None:
        self._message = message

    async def environment(self) -> dict[str, str]:
        raise CredentialsError(self._message)

    async def unchanged(self) -> bool:
        return True


class _Unavailable:
    """Credentials that can never be had: every request is answered with why."""

    def __init__(self, message: str) -> None:
        self._message = message

    async def headers(self) -> Mapping[str, str]:
        raise CredentialsError(self._message)

    async def refused(self, status: int, www_authenticate: str | None) -> bool:
        return False
