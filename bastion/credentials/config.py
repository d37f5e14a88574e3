"""A server's ``auth`` table: how Bastion authenticates to that upstream server."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class UpstreamAuth(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["client_credentials", "token_exchange", "authorization_code"] = Field(
        description="client_credentials: Bastion's own token; token_exchange: a per-user token for the caller's "
                    "token (RFC 8693); authorization_code: a per-user token the user grants once through a link")
    issuer: str | None = Field(default=None, description="the authorization server; its token endpoint is read from "
                               "its metadata (RFC 8414, else OpenID Connect discovery)")
    token_endpoint: str | None = Field(default=None, description="the token endpoint itself, instead of issuer")
    client_id: str | None = Field(default=None, description="Bastion's client id at the authorization server")
    client_secret: str | None = Field(default=None, description="its secret; write ${file:PATH} or ${env:NAME} "
                                      "rather than the secret itself", repr=False)
    token_endpoint_auth_method: Literal["client_secret_basic", "client_secret_post", "none"] = Field(
        default="client_secret_basic", description="how the client authenticates at the token endpoint "
        "(authorization_code: when unset, one the authorization server lists)")
    client_metadata_url: str | None = Field(default=None, description="authorization_code: Bastion's Client ID "
                                            "Metadata Document URL, its client_id where the server accepts those")
    scopes: list[str] = Field(default_factory=list, description="scopes asked for; none: the server's default")
    resource: str | None = Field(default=None, description="the upstream's resource identifier (RFC 8707) the "
                                 "token is for; default: the server's url")
    audience: str | None = Field(default=None, description="token_exchange: the audience asked for, when the "
                                 "authorization server wants one besides resource")
    ca_file: str | None = Field(default=None, description="the authorization server's certificate authorities "
                                "(PEM), for a private CA; default: the system's trust store")
    refresh_before: float = Field(default=60.0, ge=0, description="seconds before a token's expiry it is renewed")

    @model_validator(mode="after")
    def _has_a_client(self) -> "UpstreamAuth":
        if self.type in ("client_credentials", "token_exchange"):
            missing = [key for key in ("client_id", "client_secret") if getattr(self, key) is None]
            if self.issuer is None and self.token_endpoint is None:
                missing.append("issuer (or token_endpoint)")
            if missing:
                raise ValueError(f"auth type {self.type!r} needs {', '.join(missing)}: Bastion authenticates to the "
                                 "authorization server as a client of its own")
        return self
