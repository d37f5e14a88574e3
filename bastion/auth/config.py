"""The ``auth`` table: how ``bastion serve --http`` authenticates callers. Absent: nobody is asked for credentials
and every request is the configured identity (policy.identity), which is only safe on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Asymmetric signatures only: an HS* token is checked with a secret the issuer shares with every resource server,
# and its classic attack is a token "signed" with the issuer's public key. ``none`` is no signature at all.
SUPPORTED_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
DEFAULT_ALGORITHMS = ["RS256", "PS256", "ES256", "EdDSA"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _is_http_url(value: str) -> bool:
    parts = urlsplit(value)
    return parts.scheme in ("https", "http") and bool(parts.netloc)


class OAuthIssuer(_Strict):
    """One authorization server whose access tokens this gateway accepts."""

    issuer: str = Field(description="the issuer identifier, exactly as its tokens' iss claim and its metadata say")
    validation: Literal["jwt", "introspection"] | None = Field(
        default=None, description='how its tokens are checked: "jwt" (locally, against its JWKS) or "introspection" '
                                  "(RFC 7662, each new token asked of it); absent: introspection when "
                                  "introspection_endpoint is set, jwt otherwise")
    jwks_uri: str | None = Field(default=None, description="where its signing keys are; absent: read from its "
                                 "metadata (/.well-known/oauth-authorization-server or openid-configuration)")
    introspection_endpoint: str | None = Field(default=None, description="RFC 7662 introspection, for opaque tokens")
    client_id: str | None = Field(default=None, description="this gateway's client id at the introspection endpoint")
    client_secret: str | None = Field(default=None, description="its secret; ${file:PATH} or ${env:NAME}")
    audiences: list[str] = Field(
        default_factory=list, description="what this issuer writes in aud for this gateway besides auth.resource, "
                                          "when it cannot write the resource itself (Entra ID v2 tokens carry the "
                                          "API's application id); each must be this gateway's alone")
    algorithms: list[str] = Field(default_factory=lambda: list(DEFAULT_ALGORITHMS),
                                  description="the JWS algorithms its tokens may be signed with")
    introspection_cache_seconds: float = Field(
        default=60.0, ge=0, description="how long an introspected token's answer is reused (never past its exp); "
                                        "a token revoked at the issuer is refused at most this long after; 0: ask "
                                        "every time")

    @field_validator("issuer", "jwks_uri", "introspection_endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not _is_http_url(value):
            raise ValueError(f"{value!r} is not an http(s) URL, e.g. https://login.example.com/realms/acme")
        return value

    @field_validator("algorithms")
    @classmethod
    def _algorithms(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError(f"name at least one algorithm, e.g. {DEFAULT_ALGORITHMS}")
        for alg in value:
            if alg.lower() == "none" or alg.upper().startswith("HS"):
                raise ValueError(f"{alg!r} is refused: Bastion accepts only asymmetric signatures "
                                 f"({', '.join(SUPPORTED_ALGORITHMS)}); a token without one, or with a shared "
                                 "secret, proves nothing about who issued it")
            if alg not in SUPPORTED_ALGORITHMS:
                raise ValueError(f"{alg!r} is not a JWS algorithm Bastion checks ({', '.join(SUPPORTED_ALGORITHMS)})")
        return value

    @model_validator(mode="after")
    def _introspection_complete(self) -> "OAuthIssuer":
        if self.validation is None:
            self.validation = "introspection" if self.introspection_endpoint else "jwt"
        if self.validation == "introspection" and (self.client_id is None) != (self.client_secret is None):
            raise ValueError("introspection needs both client_id and client_secret (this gateway's credentials at "
                             "the introspection endpoint), or neither")
        return self


class CertificateIdentity(_Strict):
    """The identity a client certificate proves, when it has groups too (a plain string is the name alone)."""

    name: str = Field(description="the caller's identity name")
    groups: list[str] = Field(default_factory=list, description="its groups, the Cedar principal's parents")


class ClaimsMapping(_Strict):
    """Which token claims become the identity's name, groups, scopes and policy attributes."""

    name: str = Field(default="sub", description="the claim that names the caller")
    groups: str = Field(default="groups", description="the claim listing the caller's groups (Cedar parents)")
    attributes: dict[str, str] = Field(default_factory=dict, description="policy attribute -> claim, e.g. "
                                       'tenant = "tid"; each is principal.<attribute> in Cedar')


class AuthConfig(_Strict):
    resource: str | None = Field(default=None, description="this gateway's canonical URI (RFC 8707), e.g. "
                                 "https://mcp.example.com/mcp; tokens must name it in aud")
    issuers: list[OAuthIssuer] = Field(default_factory=list, description="authorization servers trusted")
    scopes: list[str] = Field(default_factory=list, description="scopes every request needs")
    method_scopes: dict[str, list[str]] = Field(default_factory=dict, description='more scopes per MCP method, '
                                                'e.g. "tools/call" = ["mcp:tools"]')
    scopes_supported: list[str] | None = Field(
        default=None, description="the scopes the protected resource metadata lists; absent: every scope named in "
                                  "scopes and method_scopes")
    claims: ClaimsMapping = Field(default_factory=ClaimsMapping)
    clock_skew_seconds: float = Field(default=60.0, ge=0, le=600,
                                      description="how far exp and nbf may be off this machine's clock")
    max_token_bytes: int = Field(default=16384, ge=512, description="longer bearer tokens are refused unread")
    fetch_timeout_seconds: float = Field(default=5.0, gt=0, le=60, description="bound on each request to an "
                                         "issuer (metadata, JWKS, introspection)")
    jwks_refresh_seconds: float = Field(default=3600.0, gt=0, description="how old an issuer's key set may grow "
                                        "before it is fetched again (in the background; the old keys keep working)")
    jwks_min_refetch_seconds: float = Field(default=30.0, ge=0, description="a token with an unknown kid fetches "
                                            "the key set again at most this often; other such tokens are refused")
    api_keys: Path | None = Field(default=None, description="the hashed API key file `bastion keys` writes; "
                                  "absent: API keys are not accepted")
    client_certificates: dict[str, str | CertificateIdentity] = Field(
        default_factory=dict, description="mTLS: a client certificate's name -> identity name (or {name, groups}), "
                                          'the name written "cn:NAME", "email:ADDRESS", "uri:URI" or '
                                          '"dns:HOSTNAME"; needs http.client_ca_file')

    @field_validator("client_certificates")
    @classmethod
    def _certificate_names(cls, value: dict[str, str | CertificateIdentity]) -> dict[str, str | CertificateIdentity]:
        from bastion.auth.mtls import parse_mapping

        parse_mapping(value)  # a ValueError says which name is unusable and how to write it
        return value

    @field_validator("resource")
    @classmethod
    def _resource(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if not _is_http_url(value) or parts.fragment:
                raise ValueError(f"{value!r} is not this gateway's canonical URI: an http(s) URL without a fragment, "
                                 "e.g. https://mcp.example.com/mcp (RFC 8707)")
        return value

    @model_validator(mode="after")
    def _issuers_need_resource(self) -> "AuthConfig":
        if self.issuers and self.resource is None:
            raise ValueError("auth.issuers needs auth.resource, the URI clients reach this gateway at (e.g. "
                             "https://mcp.example.com/mcp): a token is accepted only when its aud names it (RFC 8707)")
        seen: set[str] = set()
        for entry in self.issuers:
            if entry.issuer in seen:
                raise ValueError(f"auth.issuers names {entry.issuer!r} twice; give each issuer one entry")
            seen.add(entry.issuer)
        return self

    def all_scopes(self) -> list[str]:
        """The scopes the protected resource metadata advertises."""
        if self.scopes_supported is not None:
            return list(self.scopes_supported)
        names = dict.fromkeys(self.scopes)
        for scopes in self.method_scopes.values():
            names.update(dict.fromkeys(scopes))
        return list(names)
