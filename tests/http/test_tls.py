"""``bastion serve --tls-cert --tls-key``: HTTPS with the configured certificate, and the SDK client over it."""

from __future__ import annotations

import ssl
import subprocess

import httpx2
import trustme
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.http.conftest import SERVER, start_bastion, stop_bastion
from tests.support import BASTION


async def test_an_sdk_client_over_https(tmp_path) -> None:
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1", "localhost")
    certificate.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "gateway.pem"))
    certificate.private_key_pem.write_to_path(str(tmp_path / "gateway.key"))
    served = start_bastion(tmp_path, {"tls_cert": str(tmp_path / "gateway.pem"), "tls_key": str(tmp_path / "gateway.key")})
    try:
        assert served.url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context()
        authority.configure_trust(trusted)
        http = httpx2.AsyncClient(verify=trusted, timeout=120)
        async with Client(streamable_http_client(served.url, http_client=http), mode="auto") as client:
            result = await client.call_tool(f"{SERVER}__test_simple_text", {})
            assert result.content[0].text == "This is a simple text response for testing."
        async with httpx2.AsyncClient(timeout=30, verify=False) as plain:  # noqa: S501 - only to see it refuse HTTP
            try:
                await plain.post(served.url.replace("https://", "http://"), json={})
                raise AssertionError("plain HTTP was answered on the HTTPS port")
            except httpx2.HTTPError:
                pass
    finally:
        stop_bastion(served)


def test_a_certificate_without_its_key_is_refused(tmp_path) -> None:
    (tmp_path / "cert.pem").write_text("x")
    (tmp_path / "bastion.json").write_text('{"policy": "off", "servers": {}}')
    done = subprocess.run([BASTION, "serve", str(tmp_path / "bastion.json"), "--http", "127.0.0.1:0", "--tls-cert",
                           str(tmp_path / "cert.pem")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--tls-cert and --tls-key" in done.stderr
    bad = subprocess.run([BASTION, "serve", str(tmp_path / "bastion.json"), "--http", "nowhere"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "HOST:PORT" in bad.stderr
