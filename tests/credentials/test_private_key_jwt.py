"""Client authentication by a signed assertion (private_key_jwt, RFC 7523) and enterprise-managed authorization:
what the configuration accepts and refuses (each refusal naming the key to fix), the assertions Bastion signs (checked
with the public key, as an authorization server checks them), and an identity provider's refusal reaching the
request as an error naming the server and what to check. The whole flows run against the conformance suite's own
authorization servers (tests/conformance: auth/client-credentials-jwt, auth/enterprise-managed-authorization)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pydantic
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from joserfc import jwt
from joserfc.jwk import ECKey, OKPKey, RSAKey

from bastion.config import ConfigError, ServerConfig, load_config
from bastion.credentials.assertion import ASSERTION_LIFETIME, ClientAssertion
from bastion.transport.credentials import CredentialsError
from bastion.credentials.client_credentials import TokenEndpoint
from bastion.credentials.config import UpstreamAuth
from bastion.credentials.enterprise import EnterpriseManaged, identity_provider_endpoint


def _pem(private, *, password: bytes | None = None) -> bytes:
    encryption = (serialization.BestAvailableEncryption(password) if password
                  else serialization.NoEncryption())
    return private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    made = {"ec": ec.generate_private_key(ec.SECP256R1()), "rsa": rsa.generate_private_key(65537, 2048),
            "ed": ed25519.Ed25519PrivateKey.generate(), "small": rsa.generate_private_key(65537, 1024)}
    paths = {}
    for name, key in made.items():
        paths[name] = tmp_path / f"{name}.pem"
        paths[name].write_bytes(_pem(key))
    paths["encrypted"] = tmp_path / "encrypted.pem"
    paths["encrypted"].write_bytes(_pem(made["ec"], password=b"passphrase"))
    paths["public"] = tmp_path / "public.pem"
    paths["public"].write_bytes(made["ec"].public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return paths


def _jwt_auth(key: Path | str, **more) -> dict:
    return {"type": "client_credentials", "client_id": "bastion", "token_endpoint_auth_method": "private_key_jwt",
            "private_key_file": str(key), **more}


def _refusal(entry: dict) -> str:
    with pytest.raises(pydantic.ValidationError) as refused:
        ServerConfig.model_validate({"url": "https://x.example/mcp", "auth": entry})
    return str(refused.value)


def test_a_key_that_cannot_sign_is_refused_with_what_to_fix(keys: dict[str, Path], tmp_path: Path) -> None:
    assert "does not exist" in _refusal(_jwt_auth(tmp_path / "absent.pem"))
    assert "is a directory" in _refusal(_jwt_auth(tmp_path))
    assert "holds no PEM private key" in _refusal(_jwt_auth(keys["public"]))
    assert "encrypted with a passphrase" in _refusal(_jwt_auth(keys["encrypted"]))
    assert "at least 2048 bits" in _refusal(_jwt_auth(keys["small"]))
    said = _refusal(_jwt_auth(keys["ec"], signing_algorithm="RS256"))
    assert "EC P-256 key, which cannot sign RS256" in said and "set signing_algorithm to ES256" in said
    assert "cannot sign ES256" in _refusal(_jwt_auth(keys["rsa"], signing_algorithm="ES256"))
    assert "HS256" in _refusal(_jwt_auth(keys["ec"], signing_algorithm="HS256"))  # not among the choices
    assert "needs private_key_file" in _refusal({**_jwt_auth(keys["ec"]), "private_key_file": None})
    assert 'token_endpoint_auth_method = "private_key_jwt"' in _refusal(
        {"type": "client_credentials", "client_id": "b", "client_secret": "s", "private_key_file": str(keys["ec"])})
    # with neither a secret nor a key there is no client authentication at all
    assert "client_secret (or" in _refusal({"type": "client_credentials", "client_id": "b"})


def test_a_usable_key_needs_no_secret_and_no_issuer(keys: dict[str, Path]) -> None:
    for name, algorithm in (("ec", "ES256"), ("rsa", "PS256"), ("ed", "EdDSA")):
        server = ServerConfig.model_validate({"url": "https://x.example/mcp",
                                              "auth": _jwt_auth(keys[name], signing_algorithm=algorithm)})
        assert server.auth.issuer is None and server.auth.client_secret is None


def test_the_key_file_is_read_from_the_configuration_files_folder(keys: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "bastion.json"
    path.write_text(json.dumps({"servers": {"reports": {"url": "https://r.example/mcp",
                                                        "auth": _jwt_auth("ec.pem")}}}))
    assert load_config(path).servers["reports"].auth.private_key_file == str(keys["ec"])
    path.write_text(json.dumps({"servers": {"reports": {"url": "https://r.example/mcp",
                                                        "auth": _jwt_auth("missing.pem")}}}))
    with pytest.raises(ConfigError, match=r"(?s)reports.*private_key_file.*missing\.pem does not exist"):
        load_config(path)


@pytest.mark.parametrize(("name", "algorithm", "key_class"), [
    ("ec", "ES256", ECKey), ("rsa", "RS256", RSAKey), ("rsa", "PS384", RSAKey), ("ed", "EdDSA", OKPKey)])
def test_an_assertion_is_signed_for_the_authorization_server_alone(keys: dict[str, Path], name: str, algorithm: str,
                                                                   key_class) -> None:
    now = 1_800_000_000
    signed = ClientAssertion(str(keys[name]), algorithm, "key-2026", "servers.up.auth", clock=lambda: now).sign(
        "bastion", "https://as.example")
    public = key_class.import_key(keys[name].read_bytes())  # verified as the authorization server does
    token = jwt.decode(signed, public, algorithms=[algorithm])
    assert token.header["alg"] == algorithm and token.header["kid"] == "key-2026"
    claims = token.claims
    assert claims["iss"] == claims["sub"] == "bastion" and claims["aud"] == "https://as.example"
    assert claims["exp"] - claims["iat"] == ASSERTION_LIFETIME and claims["iat"] == now
    other = ClientAssertion(str(keys[name]), algorithm, None, "servers.up.auth").sign("bastion", "https://as.example")
    assert jwt.decode(other, public, algorithms=[algorithm]).claims["jti"] != claims["jti"]  # never replayable


def test_a_key_file_gone_after_start_is_an_error_naming_the_key_not_a_crash(keys: dict[str, Path]) -> None:
    auth = UpstreamAuth.model_validate(_jwt_auth(keys["ec"]))
    keys["ec"].unlink()
    with pytest.raises(CredentialsError, match=r"servers\.up\.auth\.private_key_file: .*ec\.pem does not exist"):
        ClientAssertion(auth.private_key_file, None, None, "servers.up.auth").sign("bastion", "https://as.example")


def test_enterprise_managed_authorization_is_configured_completely_or_refused(tmp_path: Path) -> None:
    base = {"type": "enterprise_managed", "client_id": "bastion", "client_secret": "s"}
    assert "needs an idp table" in _refusal(base)
    assert "issuer (or token_endpoint)" in _refusal({**base, "idp": {"client_id": "at-idp"}})
    # the caller's own token is the identity assertion: each caller needs a connection of their own
    with pytest.raises(pydantic.ValidationError, match='per_identity'):
        ServerConfig.model_validate({"url": "https://x.example/mcp", "auth": {
            **base, "idp": {"issuer": "https://idp.example", "client_id": "at-idp"}}})
    assert "idp is for auth type" in _refusal({"type": "client_credentials", "client_id": "b", "client_secret": "s",
                                               "idp": {"issuer": "https://idp.example", "client_id": "at-idp"}})
    (tmp_path / "id-token").write_text("eyJ.the-id-token.sig\n")
    path = tmp_path / "bastion.json"
    path.write_text(json.dumps({"servers": {"crm": {"url": "https://crm.example/mcp", "auth": {
        **base, "idp": {"issuer": "https://idp.example", "client_id": "at-idp",
                        "subject_token": "${file:id-token}"}}}}}))
    idp = load_config(path).servers["crm"].auth.idp
    assert idp.subject_token == "eyJ.the-id-token.sig" and "the-id-token" not in repr(idp)


class _RefusingIdentityProvider(BaseHTTPRequestHandler):
    """A token endpoint on 127.0.0.1 that refuses every exchange (the ID token expired, say) and notes the form."""

    forms: list[dict[str, list[str]]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers.get("content-length") or 0)
        self.forms.append(parse_qs(self.rfile.read(length).decode()))
        body = json.dumps({"error": "invalid_grant", "error_description": "the ID token has expired"}).encode()
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def refusing_idp() -> Iterator[str]:
    _RefusingIdentityProvider.forms = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RefusingIdentityProvider)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/token"
    finally:
        server.shutdown()
        server.server_close()


async def test_an_identity_providers_refusal_names_the_server_and_what_to_check(refusing_idp: str) -> None:
    auth = UpstreamAuth.model_validate({
        "type": "enterprise_managed", "client_id": "bastion", "client_secret": "s",
        "issuer": "http://127.0.0.1:9/as", "token_endpoint": "http://127.0.0.1:9/as/token",
        "idp": {"token_endpoint": refusing_idp, "client_id": "at-idp", "subject_token": "the-id-token"}})
    credentials = EnterpriseManaged("crm", "Bastion", auth, "https://crm.example/mcp",
                                    TokenEndpoint(auth, "servers.crm.auth"),
                                    identity_provider_endpoint(auth.idp, "servers.crm.auth"), "the-id-token")
    with pytest.raises(CredentialsError) as refused:
        await credentials.headers()
    said = str(refused.value)
    assert "identity provider" in said and "invalid_grant" in said and refusing_idp in said
    assert "the-id-token" not in said
    [form] = _RefusingIdentityProvider.forms
    assert form["grant_type"] == ["urn:ietf:params:oauth:grant-type:token-exchange"]
    assert form["requested_token_type"] == ["urn:ietf:params:oauth:token-type:id-jag"]
    assert form["subject_token_type"] == ["urn:ietf:params:oauth:token-type:id_token"]
    assert form["audience"] == ["http://127.0.0.1:9/as"] and form["resource"] == ["https://crm.example/mcp"]
    assert form["client_id"] == ["at-idp"]  # a public client at the identity provider: no secret configured
