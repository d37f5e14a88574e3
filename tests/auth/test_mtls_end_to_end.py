"""Mutual TLS through a real ``bastion serve --http`` over HTTPS: a client certificate the handshake verified
against ``http.client_ca_file`` is the identity ``auth.client_certificates`` maps it to; a certificate of another
authority, an expired one, or none where one is required ends the handshake; one verified but mapped to nobody
is refused with 403."""

from __future__ import annotations

import datetime
import ssl
import subprocess

import httpx2
import pytest
import trustme
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.auth.serving import open_session, start, stop, tools_and_call, write_config
from tests.auth.test_mtls import uri_certificate
from tests.support import BASTION


class Pki:
    """A server certificate for 127.0.0.1, and an authority for client certificates of its own."""

    def __init__(self, tmp) -> None:
        self.tmp = tmp
        self.server_ca = trustme.CA()
        self.client_ca = trustme.CA()
        server = self.server_ca.issue_cert("127.0.0.1")
        server.private_key_and_cert_chain_pem.write_to_path(str(tmp / "server.pem"))
        server.private_key_pem.write_to_path(str(tmp / "server.key"))
        self.client_ca.cert_pem.write_to_path(str(tmp / "clients-ca.pem"))

    def http(self, mode: str = "required") -> dict:
        return {"tls_cert": "server.pem", "tls_key": "server.key", "client_ca_file": "clients-ca.pem",
                "client_cert_mode": mode}

    def client(self, certificate: trustme.LeafCert | None) -> httpx2.AsyncClient:
        context = ssl.create_default_context()
        self.server_ca.configure_trust(context)
        if certificate is not None:
            certificate.configure_cert(context)
        return httpx2.AsyncClient(verify=context, timeout=60)


MAPPING = {"email:alice@example.com": "alice", "cn:build-agent": "bob",
           "uri:spiffe://example.org/ns/deploy": {"name": "deployer", "groups": ["ops"]}}


async def test_client_certificates_over_https(tmp_path) -> None:
    pki = Pki(tmp_path)
    served = start(write_config(tmp_path, auth={"client_certificates": MAPPING}, http=pki.http()))
    try:
        assert served.url.startswith("https://")
        alice = pki.client_ca.issue_cert("alice@example.com", common_name="alice-laptop")
        async with pki.client(alice) as client:
            names, called = await tools_and_call(client, served.url, {})
            assert "raw__echo" in names and called["result"]["content"][0]["text"] == "hello"
        # the official SDK's client, its HTTP client holding alice's certificate
        async with Client(streamable_http_client(served.url, http_client=pki.client(alice)), mode="auto") as sdk:
            result = await sdk.call_tool("raw__echo", {"text": "from the sdk"})
            assert result.content[0].text == "from the sdk"
        async with pki.client(pki.client_ca.issue_cert(common_name="build-agent")) as client:  # bob: not in the policy
            names, called = await tools_and_call(client, served.url, {})
            assert names == [] and "error" in called
        # a SPIFFE ID mapped with groups: the policy lets the ops group call
        pem, key = uri_certificate(pki.client_ca, "spiffe://example.org/ns/deploy", "deploy-1")
        (tmp_path / "deploy.pem").write_bytes(pem)
        (tmp_path / "deploy.key").write_bytes(key)
        context = ssl.create_default_context()
        pki.server_ca.configure_trust(context)
        context.load_cert_chain(tmp_path / "deploy.pem", tmp_path / "deploy.key")
        async with httpx2.AsyncClient(verify=context, timeout=60) as client:
            names, called = await tools_and_call(client, served.url, {})
            assert "raw__echo" in names and called["result"]["content"][0]["text"] == "hello"
        async with pki.client(pki.client_ca.issue_cert("stranger@example.com", common_name="stranger")) as client:
            unmapped = await open_session(client, served.url, {})
            assert unmapped.status_code == 403 and "auth.client_certificates" in unmapped.json()["error"]["message"]

        now = datetime.datetime.now(datetime.timezone.utc)
        expired = pki.client_ca.issue_cert("alice@example.com", not_before=now - datetime.timedelta(days=2),
                                           not_after=now - datetime.timedelta(days=1))
        foreign = pki.server_ca.issue_cert("alice@example.com")  # the right name, the wrong authority
        for certificate in (None, expired, foreign):
            async with pki.client(certificate) as client:
                with pytest.raises(httpx2.HTTPError):  # the handshake ends: no HTTP answer at all
                    await open_session(client, served.url, {})
    finally:
        stop(served)


async def test_optional_certificates_beside_api_keys(tmp_path) -> None:
    pki = Pki(tmp_path)
    made = subprocess.run([BASTION, "keys", "create", "deployer", "--groups", "ops", "--file",
                           str(tmp_path / "keys.json")], capture_output=True, text=True, timeout=120, check=True)
    key = made.stdout.strip()
    served = start(write_config(tmp_path, auth={"client_certificates": MAPPING, "api_keys": "keys.json"},
                                http=pki.http("optional")))
    try:
        async with pki.client(None) as client:
            names, called = await tools_and_call(client, served.url, {"x-api-key": key})
            assert "raw__echo" in names and "result" in called
            nothing = await open_session(client, served.url, {})
            assert nothing.status_code == 401
            message = nothing.json()["error"]["message"]
            assert "API key" in message and "client certificate" in message
        async with pki.client(pki.client_ca.issue_cert("alice@example.com")) as client:
            names, _ = await tools_and_call(client, served.url, {})
            assert "raw__echo" in names
        async with pki.client(pki.server_ca.issue_cert("alice@example.com")) as client:
            with pytest.raises(httpx2.HTTPError):  # optional, yet a certificate presented must verify
                await open_session(client, served.url, {"x-api-key": key})
    finally:
        stop(served)
    assert key not in served.log()


@pytest.mark.parametrize("auth, http, said", [
    ({"client_certificates": MAPPING}, {"client_ca_file": "clients-ca.pem"}, "serves plain HTTP"),
    ({"client_certificates": MAPPING}, {"tls_cert": "server.pem", "tls_key": "server.key"}, "http.client_ca_file"),
    (None, {"tls_cert": "server.pem", "tls_key": "server.key", "client_ca_file": "clients-ca.pem",
            "client_cert_mode": "optional"}, "decides nothing"),
    ({"client_certificates": {"alice": "alice"}}, {}, "cn:NAME"),
    ({"client_certificates": MAPPING}, {"tls_cert": "server.pem", "tls_key": "server.key",
                                        "client_ca_file": "missing.pem"}, "missing.pem does not exist"),
])
def test_contradictory_settings_are_refused_at_start(tmp_path, auth, http, said) -> None:
    Pki(tmp_path)
    config = write_config(tmp_path, auth=auth, http=http)
    done = subprocess.run([BASTION, "serve", str(config), "--http", "127.0.0.1:0"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr


@pytest.mark.parametrize("auth, http, said", [
    ({"client_certificates": MAPPING}, {}, "http.client_ca_file"),
    (None, {"client_ca_file": "clients-ca.pem", "client_cert_mode": "optional"}, "decides nothing"),
    ({"client_certificates": {"build-agent": "ci"}}, {"client_ca_file": "clients-ca.pem"}, "cn:NAME"),
])
def test_bastion_check_finds_the_contradictions_the_configuration_alone_shows(tmp_path, auth, http, said) -> None:
    config = write_config(tmp_path, auth=auth, http=http)
    done = subprocess.run([BASTION, "check", str(config)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and said in done.stderr
