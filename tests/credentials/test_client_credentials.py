"""Bastion's own token for a remote server (client credentials): obtained from a real authorization server, made
out to the upstream's resource, reused until it is near its expiry, renewed then and after a 401, and a client the
authorization server refuses is an error naming the keys to check, never the secret."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import pytest
import trustme

from bastion.config import GatewayConfig, ServerConfig
from bastion.transport.credentials import CredentialsError
from bastion.credentials.client_credentials import ClientCredentials, TokenEndpoint, metadata_urls
from bastion.credentials.config import UpstreamAuth
from bastion.host import Host
from bastion.model import GatewayError
from tests.credentials.conftest import GATEWAY_CLIENT, UPSTREAM_RESOURCE, client_auth
from tests.support import BASTION, ROOT


def test_metadata_is_looked_for_where_rfc_8414_and_openid_connect_put_it() -> None:
    assert metadata_urls("https://as.example") == [
        "https://as.example/.well-known/oauth-authorization-server",
        "https://as.example/.well-known/openid-configuration"]
    assert metadata_urls("https://as.example/tenant1") == [
        "https://as.example/.well-known/oauth-authorization-server/tenant1",
        "https://as.example/.well-known/openid-configuration/tenant1",
        "https://as.example/tenant1/.well-known/openid-configuration"]


def _host_config(upstream_url: str, auth: dict[str, Any]) -> GatewayConfig:
    return GatewayConfig(policy=None, guardrails=None, servers={
        "up": ServerConfig.model_validate({"url": upstream_url, "auth": auth})})


async def test_the_upstream_gets_bastions_own_token_for_its_resource_and_one_token_serves_many_calls(
        authorization_server, bearer_server) -> None:
    upstream = bearer_server(authorization_server.issuer)
    async with await Host.open(_host_config(upstream.url, client_auth(authorization_server.issuer))) as host:
        tools = {tool["name"] for tool in await host.list_tools()}
        assert {"up__whoami", "up__echo"} <= tools
        for _ in range(3):
            result = await host.call_tool("up__whoami")
            assert result["content"][0]["text"] == GATEWAY_CLIENT[0]

    seen = upstream.seen()
    assert seen and all(event["status"] == 200 for event in seen)
    assert {event["authorization"] for event in seen} == {seen[0]["authorization"]}  # one token throughout
    claims = seen[0]["claims"]
    assert claims["aud"] == UPSTREAM_RESOURCE and claims["iss"] == authorization_server.issuer
    grants = [r for r in authorization_server.requests() if r["form"].get("grant_type") == "client_credentials"]
    assert len(grants) == 1
    assert grants[0]["form"]["resource"] == UPSTREAM_RESOURCE
    assert "client_secret" not in grants[0]["form"]  # client_secret_basic: the secret went in the header


async def test_scopes_are_asked_for_and_post_authentication_sends_the_secret_in_the_form(
        authorization_server) -> None:
    auth = UpstreamAuth.model_validate(client_auth(authorization_server.issuer, scopes=["files:read", "files:write"],
                                                   token_endpoint_auth_method="client_secret_post"))
    credentials = ClientCredentials("up", auth, UPSTREAM_RESOURCE, TokenEndpoint(auth, "servers.up.auth"))
    headers = await credentials.headers()
    assert headers["Authorization"].startswith("Bearer ")
    [grant] = authorization_server.requests()
    assert grant["form"]["scope"] == "files:read files:write"
    assert grant["form"]["client_id"] == GATEWAY_CLIENT[0] and grant["form"]["client_secret"] == GATEWAY_CLIENT[1]


async def test_a_token_is_renewed_before_it_expires_and_after_a_401_not_on_every_request(
        authorization_server) -> None:
    authorization_server.configure(expires_in=600)
    auth = UpstreamAuth.model_validate(client_auth(authorization_server.issuer, refresh_before=60))
    now = [0.0]
    credentials = ClientCredentials("up", auth, UPSTREAM_RESOURCE, TokenEndpoint(auth, "servers.up.auth"),
                                    clock=lambda: now[0])
    now[0] = time.time()
    first = (await credentials.headers())["Authorization"]
    assert (await credentials.headers())["Authorization"] == first
    now[0] += 600 - 61  # still more than refresh_before left: kept
    assert (await credentials.headers())["Authorization"] == first
    now[0] += 2  # within refresh_before of its expiry: renewed, before the upstream could refuse it
    second = (await credentials.headers())["Authorization"]
    assert second != first
    # refused as soon as it was issued: what it is, not its age, so no new grant at the rate of the requests
    assert await credentials.refused(401, 'Bearer error="invalid_token"') is False
    now[0] += 30
    assert await credentials.refused(401, 'Bearer error="invalid_token"') is True  # revoked since: a new one
    third = (await credentials.headers())["Authorization"]
    assert third not in (first, second)
    assert await credentials.refused(403, "Bearer error=\"invalid_token\"") is False
    grants = [r for r in authorization_server.requests() if r["form"].get("grant_type") == "client_credentials"]
    assert len(grants) == 3


async def test_many_requests_at_once_share_one_grant(authorization_server) -> None:
    auth = UpstreamAuth.model_validate(client_auth(authorization_server.issuer))
    credentials = ClientCredentials("up", auth, UPSTREAM_RESOURCE, TokenEndpoint(auth, "servers.up.auth"))
    answers = await asyncio.gather(*(credentials.headers() for _ in range(20)))
    assert len({a["Authorization"] for a in answers}) == 1
    assert len(authorization_server.requests()) == 1


async def test_a_client_the_authorization_server_refuses_is_named_and_its_secret_is_not(
        authorization_server, bearer_server) -> None:
    wrong = "not-the-secret-4e1d"
    auth = UpstreamAuth.model_validate({**client_auth(authorization_server.issuer), "client_secret": wrong})
    credentials = ClientCredentials("up", auth, UPSTREAM_RESOURCE, TokenEndpoint(auth, "servers.up.auth"))
    with pytest.raises(CredentialsError) as refused:
        await credentials.headers()
    message = str(refused.value)
    assert "invalid_client" in message and "servers.up.auth.client_id" in message
    assert wrong not in message

    upstream = bearer_server(authorization_server.issuer)
    async with await Host.open(_host_config(upstream.url, {**client_auth(authorization_server.issuer),
                                                           "client_secret": wrong})) as host:
        with pytest.raises(GatewayError):
            await host.call_tool("up__whoami")
    assert all(event["authorization"] is None for event in upstream.seen())  # nothing sent in place of a token


async def test_an_issuer_without_metadata_is_an_error_naming_token_endpoint(bearer_server) -> None:
    upstream = bearer_server("http://127.0.0.1:9")
    auth = UpstreamAuth.model_validate({**client_auth(upstream.url.rsplit("/", 1)[0])})
    with pytest.raises(CredentialsError, match="token_endpoint"):
        await ClientCredentials("up", auth, UPSTREAM_RESOURCE, TokenEndpoint(auth, "servers.up.auth")).headers()


_TLS_AUTHORIZATION_SERVER = """
import ssl, sys
from werkzeug.serving import make_server
from tests.fixtures.oauth_server import State, build_app, parse_client
state = State("", [parse_client(sys.argv[2])])
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[1])
httpd = make_server("127.0.0.1", 0, build_app(state), threaded=True, ssl_context=context)
state.issuer = f"https://127.0.0.1:{httpd.server_port}"
print(state.issuer, flush=True)
httpd.serve_forever()
"""


@pytest.fixture
def tls_authorization_server(tmp_path):
    """The tests' authorization server over HTTPS, with a certificate of a private CA."""
    authority = trustme.CA()
    authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    authority.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    process = subprocess.Popen([sys.executable, "-c", _TLS_AUTHORIZATION_SERVER, str(tmp_path / "server.pem"),
                                ":".join(GATEWAY_CLIENT)], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    issuer = process.stdout.readline().strip()
    assert issuer.startswith("https://127.0.0.1:"), issuer
    yield issuer, tmp_path / "ca.pem"
    process.kill()
    process.wait()


async def test_an_authorization_server_of_a_private_ca_is_trusted_through_ca_file(tls_authorization_server) -> None:
    issuer, ca = tls_authorization_server
    trusted = UpstreamAuth.model_validate({**client_auth(issuer), "ca_file": str(ca)})
    headers = await ClientCredentials("up", trusted, UPSTREAM_RESOURCE,
                                      TokenEndpoint(trusted, "servers.up.auth")).headers()
    assert headers["Authorization"].startswith("Bearer ")

    untrusted = UpstreamAuth.model_validate(client_auth(issuer))  # the system's trust store does not know the CA
    with pytest.raises(CredentialsError, match="no token endpoint found"):
        await ClientCredentials("up", untrusted, UPSTREAM_RESOURCE,
                                TokenEndpoint(untrusted, "servers.up.auth")).headers()


def test_bastion_call_reaches_the_server_with_bastions_token_from_a_secrets_file(
        authorization_server, bearer_server, tmp_path) -> None:
    """The same as a real process, configured as an operator would: the client secret in a secrets file."""
    upstream = bearer_server(authorization_server.issuer)
    (tmp_path / "client-secret").write_text(GATEWAY_CLIENT[1] + "\n")
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"policy": "off", "guardrails": "off", "servers": {"up": {
        "url": upstream.url, "auth": {**client_auth(authorization_server.issuer),
                                      "client_secret": "${file:client-secret}"}}}}))
    called = subprocess.run([BASTION, "call", str(config), "up__whoami", "-q"], capture_output=True, text=True,
                            timeout=120)
    assert called.returncode == 0, called.stderr
    assert GATEWAY_CLIENT[0] in called.stdout
    assert GATEWAY_CLIENT[1] not in called.stdout + called.stderr
    assert all(event["status"] == 200 for event in upstream.seen())
