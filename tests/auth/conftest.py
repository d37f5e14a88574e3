"""The auth tests' authorization server: tests/fixtures/oauth_server.py as a real process on 127.0.0.1, one per test
(tests rotate its keys and take its JWKS down), with three pre-registered clients."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.fixtures.oauth_server import AuthorizationServer, running

# The gateway's own client (introspection, token exchange), an MCP client without a secret, and a service.
GATEWAY_CLIENT = ("bastion-gateway", "gateway-secret")
PUBLIC_CLIENT = "mcp-client"
SERVICE_CLIENT = ("reporting-service", "service-secret")


@pytest.fixture
def authorization_server() -> Iterator[AuthorizationServer]:
    with running(":".join(GATEWAY_CLIENT), PUBLIC_CLIENT, ":".join(SERVICE_CLIENT)) as server:
        yield server
