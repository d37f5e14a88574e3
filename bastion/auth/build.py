"""Everything ``bastion serve --http`` needs to know who is calling, built from the configuration in one place:
the authenticator (the configured methods in the order that decides), the scopes each request needs, the
Protected Resource Metadata document and the paths it is served at, and the HTTP client the issuers are asked
with (closed with the frontend)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from bastion.auth.api_keys import ApiKeyFile, ApiKeyFileError, ApiKeyMethod, resolve
from bastion.auth.base import AuthenticatorChain, AuthFailure, AuthMethod, Authenticator, Unauthenticated
from bastion.auth.config import AuthConfig
from bastion.auth.header import HeaderIdentity
from bastion.auth.introspection import Introspector
from bastion.auth.jwks import IssuerEndpoints, JwksCache
from bastion.auth.jwt import JwtValidator
from bastion.auth.metadata import protected_resource_metadata, resource_metadata_paths, resource_metadata_url
from bastion.auth.mtls import ClientCertificateMethod
from bastion.auth.oauth import OAuthBearer, ScopeRequirements
from bastion.model import Identity


@dataclass
class HttpAuth:
    authenticator: Authenticator
    scopes: ScopeRequirements | None = None
    metadata: dict[str, Any] | None = None  # the Protected Resource Metadata document; None: not served
    metadata_paths: frozenset[str] = frozenset()
    # the issuers' validators, by issuer (tests and the benchmark read their caches' counters)
    validators: dict[str, JwtValidator] = field(default_factory=dict)
    introspectors: dict[str, Introspector] = field(default_factory=dict)
    client: httpx2.AsyncClient | None = None

    @property
    def required(self) -> bool:
        """True when requests must present a credential (False: every request is the configured identity)."""
        return not isinstance(self.authenticator, Unauthenticated)

    def check_scopes(self, identity: Identity, method: str | None) -> None:
        if self.scopes is not None:
            self.scopes.check(identity, method)

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.aclose()


def unauthenticated(identity: Identity) -> HttpAuth:
    return HttpAuth(Unauthenticated(identity))


def build_http_auth(auth: AuthConfig | None, *, identity_header: str | None, identity: Identity,
                    base: Path | None = None, client: httpx2.AsyncClient | None = None,
                    clock: Callable[[], float] = time.monotonic) -> HttpAuth:
    """The frontend's authentication; a ValueError names the configuration key and the fix. ``clock`` is what the
    key sets' refresh and refetch intervals are measured by."""
    if auth is None or not (auth.issuers or auth.api_keys is not None or auth.client_certificates):
        if identity_header is not None:
            return HttpAuth(AuthenticatorChain([HeaderIdentity(identity_header)]))
        return unauthenticated(identity)
    if identity_header is not None:
        raise ValueError("http.identity_header and the auth table cannot be used together: anyone could name "
                         "anyone in the header, past the tokens, keys or certificates auth asks for; remove "
                         "http.identity_header")
    methods: list[AuthMethod] = []
    if auth.api_keys is not None:
        keys = ApiKeyMethod(ApiKeyFile(resolve(auth.api_keys, base)))
        try:
            keys.load()
        except ApiKeyFileError as exc:
            raise ValueError(str(exc)) from None
        methods.append(keys)
    result = HttpAuth(AuthenticatorChain(()))
    metadata_url = resource_metadata_url(auth.resource) if auth.resource is not None else None
    if auth.issuers:
        assert auth.resource is not None and metadata_url is not None  # AuthConfig requires it with issuers
        # The environment's proxy and CA settings apply (HTTPS_PROXY, NO_PROXY, SSL_CERT_FILE), as they do for
        # remote servers: an issuer is often reached through the company's proxy or signed by its own CA.
        result.client = client or httpx2.AsyncClient(timeout=auth.fetch_timeout_seconds, follow_redirects=False)
        for entry in auth.issuers:
            audiences = frozenset((auth.resource, *entry.audiences))
            endpoints = IssuerEndpoints(entry.issuer, result.client, jwks_uri=entry.jwks_uri,
                                        introspection_endpoint=entry.introspection_endpoint,
                                        retry_seconds=auth.jwks_min_refetch_seconds, clock=clock)
            if entry.validation == "introspection":
                result.introspectors[entry.issuer] = Introspector(
                    entry.issuer, endpoints, result.client, audiences=audiences, client_id=entry.client_id,
                    client_secret=entry.client_secret, cache_seconds=entry.introspection_cache_seconds,
                    skew=auth.clock_skew_seconds)
            else:
                keys_cache = JwksCache(endpoints, result.client, refresh_seconds=auth.jwks_refresh_seconds,
                                       min_refetch_seconds=auth.jwks_min_refetch_seconds, clock=clock)
                result.validators[entry.issuer] = JwtValidator(entry.issuer, entry.algorithms, keys_cache,
                                                               audiences=audiences, skew=auth.clock_skew_seconds)
        methods.append(OAuthBearer(auth, result.validators, result.introspectors, metadata_url))
        result.metadata = protected_resource_metadata(auth.resource, [e.issuer for e in auth.issuers],
                                                      auth.all_scopes())
        result.metadata_paths = resource_metadata_paths(auth.resource)
    if auth.client_certificates:
        methods.append(ClientCertificateMethod.from_config(auth.client_certificates))
    result.authenticator = AuthenticatorChain(methods)
    result.scopes = ScopeRequirements.from_config(auth, metadata_url)
    return result


__all__ = ["AuthFailure", "HttpAuth", "build_http_auth", "unauthenticated"]
