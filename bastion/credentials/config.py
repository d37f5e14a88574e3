"""A server's ``auth`` table: how Bastion authenticates to that upstream server."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bastion.credentials.assertion import ALGORITHMS, UnusableKey, check_algorithm, load_private_key

SigningAlgorithm = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
assert set(SigningAlgorithm.__args__) == set(ALGORITHMS)  # type: ignore[attr-defined]


class IdentityProvider(BaseModel):
    """``enterprise_managed``: the enterprise's identity provider, where the user's identity assertion (an ID token)
    is exchanged for an identity assertion authorization grant (ID-JAG) naming the MCP server's authorization
    server."""

    model_config = ConfigDict(extra="forbid")

    issuer: str | None = Field(default=None, description="the identity provider; its token endpoint is read from its "
                               "metadata (RFC 8414, else OpenID Connect discovery)")
    token_endpoint: str | None = Field(default=None, description="its token endpoint itself, instead of issuer")
    client_id: str = Field(description="Bastion's client id at the identity provider")
    client_secret: str | None = Field(default=None, repr=False, description="its secret, if the identity provider "
                                      "gave one; write ${file:PATH} or ${env:NAME}")
    subject_token: str | None = Field(default=None, repr=False, description="the identity assertion exchanged (an "
                                      "ID token, e.g. ${file:PATH}); absent: the caller's own bearer token "
                                      "(scope = \"per_identity\")")
    subject_token_type: Literal["id_token", "saml2", "access_token"] = Field(
        default="id_token", description="what subject_token (or the caller's token) is")
    ca_file: str | None = Field(default=None, description="the identity provider's certificate authorities (PEM)")

    @model_validator(mode="after")
    def _has_an_endpoint(self) -> "IdentityProvider":
        if self.issuer is None and self.token_endpoint is None:
            raise ValueError("the identity provider needs issuer (or token_endpoint): where the user's identity "
                             "assertion is exchanged")
        return self


class UpstreamAuth(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["client_credentials", "token_exchange", "authorization_code", "enterprise_managed"] = Field(
        description="client_credentials: Bastion's own token; token_exchange: a per-user token for the caller's "
                    "token (RFC 8693); authorization_code: a per-user token the user grants once through a link; "
                    "enterprise_managed: a token for the user's identity assertion, exchanged at the enterprise's "
                    "identity provider for an ID-JAG and that presented to the server's authorization server "
                    "(RFC 8693 then RFC 7523)")
    issuer: str | None = Field(default=None, description="the authorization server; its token endpoint is read from "
                               "its metadata (RFC 8414, else OpenID Connect discovery). client_credentials and "
                               "enterprise_managed: absent, the one the server's protected resource metadata names")
    token_endpoint: str | None = Field(default=None, description="the token endpoint itself, instead of issuer")
    client_id: str | None = Field(default=None, description="Bastion's client id at the authorization server")
    client_secret: str | None = Field(default=None, description="its secret; write ${file:PATH} or ${env:NAME} "
                                      "rather than the secret itself", repr=False)
    token_endpoint_auth_method: Literal["client_secret_basic", "client_secret_post", "none", "private_key_jwt"] = \
        Field(default="client_secret_basic", description="how the client authenticates at the token endpoint "
              "(authorization_code: when unset, one the authorization server lists); private_key_jwt: a signed "
              "assertion (RFC 7523), with private_key_file")
    private_key_file: str | None = Field(default=None, description="private_key_jwt: the PEM private key assertions "
                                         "are signed with (RSA, EC or Ed25519; relative: from this file's folder)")
    private_key_id: str | None = Field(default=None, description="private_key_jwt: the key's kid at the "
                                       "authorization server, sent in each assertion's header")
    signing_algorithm: SigningAlgorithm | None = Field(
        default=None, description="private_key_jwt: the signing algorithm; default: the key's own (RSA: RS256, "
        "P-256: ES256, P-384: ES384, P-521: ES512, Ed25519: EdDSA)")
    client_metadata_url: str | None = Field(default=None, description="authorization_code: Bastion's Client ID "
                                            "Metadata Document URL, its client_id where the server accepts those")
    scopes: list[str] = Field(default_factory=list, description="scopes asked for; none: the server's default")
    resource: str | None = Field(default=None, description="the upstream's resource identifier (RFC 8707) the "
                                 "token is for; default: the server's url (or its protected resource metadata's)")
    audience: str | None = Field(default=None, description="token_exchange: the audience asked for, when the "
                                 "authorization server wants one besides resource")
    idp: IdentityProvider | None = Field(default=None, description="enterprise_managed: the identity provider")
    ca_file: str | None = Field(default=None, description="the authorization server's certificate authorities "
                                "(PEM), for a private CA; default: the system's trust store")
    refresh_before: float = Field(default=60.0, ge=0, description="seconds before a token's expiry it is renewed")

    @field_validator("private_key_file")
    @classmethod
    def _key_is_usable(cls, path: str | None) -> str | None:
        if path is not None:
            try:
                load_private_key(path)
            except UnusableKey as exc:
                raise ValueError(str(exc)) from None
        return path

    @model_validator(mode="after")
    def _has_a_client(self) -> "UpstreamAuth":
        signed = self.token_endpoint_auth_method == "private_key_jwt"
        if signed and self.private_key_file is None:
            raise ValueError("token_endpoint_auth_method private_key_jwt needs private_key_file: the PEM private "
                             "key whose public half the authorization server has")
        if not signed and {"private_key_file", "private_key_id", "signing_algorithm"} & self.model_fields_set:
            raise ValueError("private_key_file, private_key_id and signing_algorithm are for token_endpoint_auth_method "
                             "= \"private_key_jwt\": set it, or remove them")
        if signed and self.type == "authorization_code":
            raise ValueError("private_key_jwt is for client_credentials, token_exchange and enterprise_managed")
        if signed and self.signing_algorithm is not None and self.private_key_file is not None:
            _, kind = load_private_key(self.private_key_file)
            try:
                check_algorithm(self.private_key_file, kind, self.signing_algorithm)
            except UnusableKey as exc:
                raise ValueError(str(exc)) from None
        if self.type in ("client_credentials", "token_exchange", "enterprise_managed"):
            missing = [] if self.client_id is not None else ["client_id"]
            if self.client_secret is None and not signed:
                missing.append("client_secret (or token_endpoint_auth_method = \"private_key_jwt\" with "
                               "private_key_file)")
            # The caller's token is sent to the authorization server of a token exchange: it is named here, never
            # taken from what the upstream server publishes.
            if self.type == "token_exchange" and self.issuer is None and self.token_endpoint is None:
                missing.append("issuer (or token_endpoint)")
            if missing:
                raise ValueError(f"auth type {self.type!r} needs {', '.join(missing)}: Bastion authenticates to the "
                                 "authorization server as a client of its own")
        if self.type == "enterprise_managed" and self.idp is None:
            raise ValueError("auth type 'enterprise_managed' needs an idp table (issuer or token_endpoint, client_id): "
                             "the identity provider that exchanges the user's identity assertion for an ID-JAG")
        if self.type != "enterprise_managed" and self.idp is not None:
            raise ValueError("idp is for auth type 'enterprise_managed'")
        return self
