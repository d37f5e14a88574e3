"""The credentials tests' peers, each a real process on 127.0.0.1: the authorization server
(tests/fixtures/oauth_server.py) with Bastion's client registered, and remote MCP servers that accept only bearer
tokens of that issuer made out to them and write down every Authorization header they receive
(tests/fixtures/bearer_server.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.fixtures.oauth_server import AuthorizationServer, running
from tests.support import FIXTURES

GATEWAY_CLIENT = ("bastion-gateway", "gateway-secret")
UPSTREAM_RESOURCE = "https://upstream.example/mcp"  # the remote server's resource identifier (RFC 8707)
GATEWAY_RESOURCE = "https://bastion.example/mcp"  # the audience of the callers' own tokens


@pytest.fixture
def authorization_server() -> Iterator[AuthorizationServer]:
    with running(":".join(GATEWAY_CLIENT)) as server:
        yield server


@dataclass
class BearerServer:
    url: str
    events: Path
    process: subprocess.Popen

    def seen(self) -> list[dict[str, Any]]:
        """Every HTTP request the server received: its Authorization header, the claims verified, the status."""
        if not self.events.exists():
            return []
        return [json.loads(line) for line in self.events.read_text().splitlines()]


@pytest.fixture
def bearer_server(tmp_path: Path) -> Iterator[Callable[..., BearerServer]]:
    started: list[BearerServer] = []

    def start(issuer: str | None, audience: str = UPSTREAM_RESOURCE, scopes: tuple[str, ...] = (),
              extra: tuple[str, ...] = ()) -> BearerServer:
        events = tmp_path / f"upstream-{len(started)}.jsonl"
        args = [sys.executable, str(FIXTURES / "bearer_server.py"), "--audience", audience, *extra]
        if issuer is not None:
            args += ["--issuer", issuer]
        for scope in scopes:
            args += ["--scope", scope]
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                   env={**os.environ, "FIXTURE_EVENTS": str(events)})
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith(("http://127.0.0.1:", "https://127.0.0.1:")), f"the bearer server did not start: {url!r}"
        server = BearerServer(url, events, process)
        started.append(server)
        return server

    yield start
    for server in started:
        server.process.kill()
        server.process.wait()


def client_auth(issuer: str, kind: str = "client_credentials", **more: Any) -> dict[str, Any]:
    """A server's auth table naming Bastion's client at ``issuer``."""
    return {"type": kind, "issuer": issuer, "client_id": GATEWAY_CLIENT[0], "client_secret": GATEWAY_CLIENT[1],
            "resource": UPSTREAM_RESOURCE, **more}
