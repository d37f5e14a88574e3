"""Bastion as an OAuth 2.1 resource server: a bearer access token routed to the issuer that issued it (a JWT by
its iss; an opaque token to the issuers that introspect), checked there, and turned into an Identity; the scopes
each request needs; and the ``WWW-Authenticate`` challenges (RFC 6750, RFC 9728) of every refusal."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from bastion.auth.base import API_KEY_PREFIX, AuthFailure, Credentials, authorization, bearer_token
from bastion.auth.config import AuthConfig, ClaimsMapping
from bastion.auth.introspection import Introspector
from bastion.auth.jwt import JwtValidator, looks_like_jwt, read_unverified
from bastion.model import Identity

# Who is scope-checked: callers that presented a bearer credential whose grant names scopes. A client
# certificate or a configured identity carries none; the policy decides for them.
SCOPED_METHODS = frozenset({"oauth", "api_key"})
IDENTITY_CACHE_ENTRIES = 4096


def _quoted(value: str) -> str:
    """An auth-param value (RFC 9110 quoted-string): our own words and URLs, never anything a client sent."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def challenge(metadata_url: str | None, *, error: str | None = None, description: str | None = None,
              scope: Sequence[str] = ()) -> str:
    params: list[str] = []
    if error is not None:
        params.append(f"error={_quoted(error)}")
    if description is not None:
        params.append(f"error_description={_quoted(description)}")
    if scope:
        params.append(f"scope={_quoted(' '.join(scope))}")
    if metadata_url is not None:
        params.append(f"resource_metadata={_quoted(metadata_url)}")
    return "Bearer " + ", ".join(params) if params else "Bearer"


def scopes_of(claims: Mapping[str, Any]) -> frozenset[str]:
    """A token's scopes: ``scope`` as RFC 8693/9068 write it (space-separated), or ``scp`` as Entra ID and others
    do (a list, or a space-separated string)."""
    for name in ("scope", "scp"):
        value = claims.get(name)
        if isinstance(value, str):
            return frozenset(value.split())
        if isinstance(value, list):
            return frozenset(v for v in value if isinstance(v, str))
    return frozenset()


def _groups(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(value.split())
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, str))
    return ()


def _attribute(value: Any) -> Any:
    """A claim as a policy attribute: strings, numbers, booleans and lists of those; anything else is left out."""
    if isinstance(value, (str, bool, int)) or (isinstance(value, float) and value.is_integer()):
        return int(value) if isinstance(value, float) else value
    if isinstance(value, list) and all(isinstance(v, (str, bool, int)) for v in value):
        return list(value)
    return None


def identity_from_claims(claims: Mapping[str, Any], mapping: ClaimsMapping, issuer: str, token: str) -> Identity:
    name = claims.get(mapping.name)
    if not isinstance(name, str) or not name:
        raise AuthFailure(401, f"the access token names no caller (its {mapping.name} claim, auth.claims.name)",
                          None, "invalid_token", "no_name_claim")
    attributes = {}
    for attribute, claim in mapping.attributes.items():
        value = _attribute(claims.get(claim))
        if value is not None:
            attributes[attribute] = value
    return Identity(name, _groups(claims.get(mapping.groups)), "oauth", issuer, scopes_of(claims), attributes,
                    token)


class OAuthBearer:
    """The ``Authorization: Bearer`` access tokens of the configured issuers (an API key's ``bst_`` prefix is
    another method's)."""

    asks = "a bearer access token from a trusted authorization server (auth.issuers)"

    def __init__(self, config: AuthConfig, validators: Mapping[str, JwtValidator],
                 introspectors: Mapping[str, Introspector], metadata_url: str) -> None:
        self._config = config
        self._validators = validators
        self._introspectors = introspectors
        self._metadata_url = metadata_url
        self._challenge = challenge(metadata_url, scope=config.scopes)
        self._identities: OrderedDict[str, tuple[Mapping[str, Any], Identity]] = OrderedDict()

    def presented(self, credentials: Credentials) -> bool:
        found = authorization(credentials)
        return found is not None and found[0] == "bearer" and not found[1].startswith(API_KEY_PREFIX)

    def challenge(self) -> str | None:
        return self._challenge

    async def authenticate(self, credentials: Credentials) -> Identity:
        try:
            token = bearer_token(credentials, self._config.max_token_bytes)
            if not token:
                raise AuthFailure(400, "the Authorization header is malformed: expected 'Bearer ' and one token",
                                  None, "invalid_request", "malformed_header")
            issuer, claims = await self._validate(token)
            known = self._identities.get(token)
            if known is not None and known[0] is claims:  # the same token again, checked again: the same identity
                return known[1]
            identity = identity_from_claims(claims, self._config.claims, issuer, token)
            if len(self._identities) >= IDENTITY_CACHE_ENTRIES:
                self._identities.popitem(last=False)
            self._identities[token] = (claims, identity)
            return identity
        except AuthFailure as failure:
            if failure.status in (400, 401):
                failure.www_authenticate = challenge(self._metadata_url, error=failure.error,
                                                     description=failure.message)
            raise

    async def _validate(self, token: str) -> tuple[str, Mapping[str, Any]]:
        for issuer, validator in self._validators.items():  # a token seen before is not parsed again
            claims = validator.recall(token)
            if claims is not None:
                return issuer, claims
        if looks_like_jwt(token):
            unverified = read_unverified(token)
            issuer = unverified.claims.get("iss")
            if isinstance(issuer, str) and issuer in self._validators:
                return issuer, await self._validators[issuer].validate(token, unverified)
            if isinstance(issuer, str) and issuer in self._introspectors:
                return issuer, await self._introspectors[issuer].validate(token)
            raise AuthFailure(401, "the access token was not issued by an authorization server this gateway trusts",
                              None, "invalid_token", "unknown_issuer")
        # An opaque token names no issuer: each introspecting issuer is asked in turn, the first active answer wins.
        last = AuthFailure(401, "the access token could not be verified", None, "invalid_token", "opaque_no_issuer")
        for issuer, introspector in self._introspectors.items():
            try:
                return issuer, await introspector.validate(token)
            except AuthFailure as failure:
                last = failure
        raise last


@dataclass(frozen=True)
class ScopeRequirements:
    """``auth.scopes`` on every request and ``auth.method_scopes`` per MCP method, for callers whose credential
    carries scopes; a refusal is 403 ``insufficient_scope`` naming every scope the request needs (those the caller
    holds included, so that a client asking again for exactly these loses none it needs)."""

    scopes: tuple[str, ...]
    method_scopes: Mapping[str, tuple[str, ...]]
    metadata_url: str | None

    @classmethod
    def from_config(cls, config: AuthConfig, metadata_url: str | None) -> "ScopeRequirements":
        return cls(tuple(config.scopes), {m: tuple(s) for m, s in config.method_scopes.items()}, metadata_url)

    def needed(self, method: str | None) -> tuple[str, ...]:
        extra = self.method_scopes.get(method or "", ())
        return tuple(dict.fromkeys((*self.scopes, *extra))) if extra else self.scopes

    def check(self, identity: Identity, method: str | None) -> None:
        """AuthFailure 403 when ``identity`` lacks a scope the request (its MCP method, None before the body is
        read) needs."""
        if identity.authenticated_by not in SCOPED_METHODS:
            return
        needed = self.needed(method)
        if not needed or identity.scopes.issuperset(needed):
            return
        what = f"{method} needs" if method and method in self.method_scopes else "every request needs"
        message = f"insufficient scope: {what} {' '.join(needed)}"
        raise AuthFailure(403, message, challenge(self.metadata_url, error="insufficient_scope", description=message,
                                                  scope=needed), "insufficient_scope", "insufficient_scope")
