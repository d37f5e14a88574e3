"""Metadata both ways: the URLs the Protected Resource Metadata is served at, the order an issuer's metadata is
looked for in, and an issuer metadata document that names another issuer, which is never used."""

from __future__ import annotations

from typing import Any, AsyncIterator

import pytest

from bastion.auth.base import AuthFailure, Credentials
from bastion.auth.build import build_http_auth
from bastion.auth.config import AuthConfig
from bastion.auth.metadata import discovery_urls, resource_metadata_paths, resource_metadata_url
from bastion.model import Identity
from tests.auth.resource_server_issuer import RESOURCE, Issuer


def test_the_metadata_url_puts_the_well_known_part_before_the_resources_path() -> None:
    assert resource_metadata_url("https://mcp.example.com/mcp") == \
        "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
    assert resource_metadata_url("https://mcp.example.com/") == \
        "https://mcp.example.com/.well-known/oauth-protected-resource"
    assert resource_metadata_paths("https://gw.example.com/tenant/mcp") == {
        "/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource/tenant/mcp"}


def test_issuer_metadata_is_looked_for_in_the_specifications_order() -> None:
    assert discovery_urls("https://id.example.com") == [
        "https://id.example.com/.well-known/oauth-authorization-server",
        "https://id.example.com/.well-known/openid-configuration"]
    assert discovery_urls("https://id.example.com/realms/acme") == [
        "https://id.example.com/.well-known/oauth-authorization-server/realms/acme",
        "https://id.example.com/.well-known/openid-configuration/realms/acme",
        "https://id.example.com/realms/acme/.well-known/openid-configuration"]


class Impostor(Issuer):
    """Serves metadata that names another issuer (with its own JWKS): a document anyone could publish."""

    async def _answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        if path == "/.well-known/oauth-authorization-server":
            self.hits["metadata"] += 1
            return 200, {"issuer": "https://honest.example.test", "jwks_uri": f"{self.base}/jwks"}
        return await super()._answer(method, path, headers, body)


@pytest.fixture
async def impostor() -> AsyncIterator[Impostor]:
    server = await Impostor().start()
    try:
        yield server
    finally:
        await server.stop()


async def test_metadata_naming_another_issuer_is_not_used(impostor: Impostor) -> None:
    auth = build_http_auth(AuthConfig(resource=RESOURCE, issuers=[{"issuer": impostor.issuer}],
                                      jwks_min_refetch_seconds=0), identity_header=None, identity=Identity("x"))
    with pytest.raises(AuthFailure) as caught:
        await auth.authenticator.authenticate(Credentials({"authorization": f"Bearer {impostor.token()}"}, "mcp"))
    assert caught.value.status == 503 and caught.value.reason == "keys_unavailable"
    assert impostor.hits["metadata"] == 1 and impostor.hits["jwks"] == 0
    await auth.close()


async def test_a_configured_jwks_uri_needs_no_metadata(impostor: Impostor) -> None:
    auth = build_http_auth(AuthConfig(resource=RESOURCE, issuers=[{"issuer": impostor.issuer,
                                                                   "jwks_uri": f"{impostor.base}/jwks"}]),
                           identity_header=None, identity=Identity("x"))
    identity = await auth.authenticator.authenticate(
        Credentials({"authorization": f"Bearer {impostor.token()}"}, "mcp"))
    assert identity.name == "alice" and impostor.hits["metadata"] == 0
    await auth.close()
