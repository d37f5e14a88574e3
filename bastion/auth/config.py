"""The ``auth`` table: how ``bastion serve --http`` authenticates callers. Absent: nobody is asked for credentials
and every request is the configured identity (policy.identity), which is only safe on loopback."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OAuthIssuer(_Strict):
    """One authorization server whose access tokens this gateway accepts."""

    issuer: str = Field(description="the issuer identifier, exactly as its tokens' iss claim and its metadata say")
    jwks_uri: str | None = Field(default=None, description="where its signing keys are; absent: read from its "
                                 "metadata (/.well-known/oauth-authorization-server or openid-configuration)")
    introspection_endpoint: str | None = Field(default=None, description="RFC 7662 introspection, for opaque tokens")
    client_id: str | None = Field(default=None, description="this gateway's client id at the introspection endpoint")
    client_secret: str | None = Field(default=None, description="its secret; ${file:PATH} or ${env:NAME}")


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
    claims: ClaimsMapping = Field(default_factory=ClaimsMapping)
    api_keys: Path | None = Field(default=None, description="the hashed API key file `bastion keys` writes; "
                                  "absent: API keys are not accepted")
    client_certificates: dict[str, str] = Field(
        default_factory=dict, description="mTLS: a client certificate's subject (CN or SAN) -> identity name; "
                                          "needs http.client_ca_file")
