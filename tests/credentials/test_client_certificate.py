"""Mutual TLS to a remote server: with ``client_cert`` and ``client_key`` Bastion completes the handshake of a real
HTTPS server that accepts only certificates of its client CA; without them the same server is unreachable, and a
certificate file that cannot be used is named in the server's failure."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from bastion.config import GatewayConfig, ServerConfig
from bastion.host import Host


@pytest.fixture
def tls_upstream(tmp_path: Path, bearer_server):
    server_ca, client_ca = trustme.CA(), trustme.CA()
    server_ca.cert_pem.write_to_path(str(tmp_path / "server-ca.pem"))
    client_ca.cert_pem.write_to_path(str(tmp_path / "client-ca.pem"))
    served = server_ca.issue_cert("127.0.0.1")
    served.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    issued = client_ca.issue_cert("bastion-gateway@example.com")
    issued.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    issued.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    upstream = bearer_server(None, extra=("--tls", str(tmp_path / "server.pem"), str(tmp_path / "server.pem"),
                                          "--client-ca", str(tmp_path / "client-ca.pem")))
    return upstream, tmp_path


def _config(url: str, folder: Path, **more: str) -> GatewayConfig:
    entry = {"url": url, "ca_file": str(folder / "server-ca.pem"), "startup_timeout": 10, **more}
    return GatewayConfig(policy=None, guardrails=None, servers={"tls": ServerConfig.model_validate(entry)})


async def test_a_client_certificate_opens_a_server_that_requires_one(tls_upstream) -> None:
    upstream, folder = tls_upstream
    config = _config(upstream.url, folder, client_cert=str(folder / "client.pem"),
                     client_key=str(folder / "client.key"))
    async with await Host.open(config) as host:
        result = await host.call_tool("tls__echo", {"text": "over mutual TLS"})
    assert result["content"][0]["text"] == "over mutual TLS"
    assert upstream.seen()


async def test_without_one_the_server_is_not_reached(tls_upstream) -> None:
    upstream, folder = tls_upstream
    async with await Host.open(_config(upstream.url, folder)) as host:
        assert not host._gateway.upstreams["tls"].ready.is_set()
        assert "tls__echo" not in {tool["name"] for tool in await host.list_tools()}
    assert upstream.seen() == []  # no request got past the handshake


async def test_a_certificate_that_cannot_be_used_is_named(tls_upstream) -> None:
    upstream, folder = tls_upstream
    (folder / "broken.pem").write_text("not a certificate\n")
    async with await Host.open(_config(upstream.url, folder, client_cert=str(folder / "broken.pem"))) as host:
        failure = host._gateway.upstreams["tls"].failure or ""
    assert "client_cert" in failure and "broken.pem" in failure
