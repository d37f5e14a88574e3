"""End to end: agents call a real ``bastion serve --http`` process with their own tokens from a real authorization
server; a remote MCP server (a real process verifying every token against the issuer's keys) sees, for each agent,
a token made out to it by RFC 8693 exchange, never the agent's own; ``bastion credentials`` lists and revokes
those tokens on the running gateway; and neither the agents' tokens nor the exchanged ones are in its logs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support import free_port
from tests.credentials.conftest import GATEWAY_CLIENT, UPSTREAM_RESOURCE, client_auth
from tests.support import BASTION, READY_TIMEOUT

pytestmark = pytest.mark.slow
EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"


@pytest.fixture
def served(tmp_path: Path, authorization_server, bearer_server):
    upstream = bearer_server(authorization_server.issuer)
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    config = {"policy": "off", "guardrails": "off", "ready_timeout": READY_TIMEOUT,
              "auth": {"resource": resource, "issuers": [{"issuer": authorization_server.issuer}]},
              "servers": {"up": {"url": upstream.url, "scope": "per_identity",
                                 "auth": client_auth(authorization_server.issuer, "token_exchange")}}}
    path = tmp_path / "bastion.json"
    path.write_text(json.dumps(config))
    state = tmp_path / "state"
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_STATE_HOME": str(state)}
    stderr = tmp_path / "bastion.stderr"
    process = subprocess.Popen([BASTION, "serve", str(path), "--http", f"127.0.0.1:{port}"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr.open("wb"),
                               env=environment)
    deadline = time.monotonic() + 120
    while not re.search(r"serving MCP on http://", stderr.read_text(errors="replace")):
        assert process.poll() is None, stderr.read_text()
        assert time.monotonic() < deadline, stderr.read_text()
        time.sleep(0.1)
    yield resource, upstream, environment, stderr
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def whoami(url: str, token: str) -> str:
    http = httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60, read=120))
    async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
        result = await client.call_tool("up__whoami", {})
        return result.content[0].text


def credentials_cli(environment: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BASTION, "credentials", *args], capture_output=True, text=True, timeout=60,
                          env=environment)


async def test_each_agent_reaches_the_upstream_with_its_own_exchanged_token(served, authorization_server) -> None:
    resource, upstream, environment, stderr = served
    alice = authorization_server.token(sub="alice", aud=resource, scope="mcp")
    bob = authorization_server.token(sub="bob", aud=resource, scope="mcp")

    assert await whoami(resource, alice) == "alice"
    assert await whoami(resource, bob) == "bob"
    assert await whoami(resource, alice) == "alice"

    seen = upstream.seen()
    presented = {event["authorization"] for event in seen}
    assert f"Bearer {alice}" not in presented and f"Bearer {bob}" not in presented
    assert {event["claims"]["sub"] for event in seen if event["claims"]} == {GATEWAY_CLIENT[0], "alice", "bob"}
    assert all(event["claims"]["aud"] == UPSTREAM_RESOURCE for event in seen if event["claims"])
    made = [r["form"] for r in authorization_server.requests() if r["form"].get("grant_type") == EXCHANGE]
    assert [form["subject_token"] for form in made] == [alice, bob]  # one exchange each, reused after

    listed = credentials_cli(environment, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {(t["server"], t["user"]) for t in json.loads(listed.stdout)["tokens"]} == {("up", "alice"), ("up", "bob")}

    revoked = credentials_cli(environment, "revoke", "alice")
    assert revoked.returncode == 0, revoked.stderr
    assert await whoami(resource, alice) == "alice"
    made = [r["form"] for r in authorization_server.requests() if r["form"].get("grant_type") == EXCHANGE]
    assert len(made) == 3  # the revoked token was replaced by a new exchange, not sent again

    logged = stderr.read_text(errors="replace")
    exchanged = {value.removeprefix("Bearer ") for value in presented if value}
    for secret in (alice, bob, *exchanged, GATEWAY_CLIENT[1]):
        assert secret not in logged
