"""Per-user authorization through a running ``bastion serve --http``: a remote server that wants each person's own
token (tests/credentials/guarded_server.py, official SDK behind a resource-server guard), the real authorization
server of tests/fixtures/oauth_server.py, and two people calling through Bastion with the official SDK client.

The operator authorizes Bastion's own connection (the catalog) through the link the gateway logs; each caller's
first call is answered with the URL-elicitation-required error naming their own link; after they follow it their
calls reach the server with their own token (the server says whose), and one person's authorization never serves
the other. Callers are named by a trusted header in one run (the redirect comes back to a loopback listener) and
by bearer tokens of the same authorization server in the other (``auth.resource`` set: the redirect comes back to
the frontend's own ``/oauth/callback``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlencode

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.fixtures.oauth_server import running
from tests.support import BASTION, free_port

pytestmark = pytest.mark.slow

IDENTITY_HEADER = "X-Bastion-Identity"
GUARDED = Path(__file__).with_name("guarded_server.py")
LINK = re.compile(r"server docs: (\w+) must authorize Bastion; the link is given to their client and is: (\S+)")


def wait_for(what: str, found, deadline: float = 120.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = found()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {deadline:g}s")


def approve(link: str, user: str) -> httpx2.Response:
    """The person at the browser: the authorization server approves them and redirects back to Bastion."""
    return httpx2.get(f"{link}&{urlencode({'login_hint': user})}", follow_redirects=True, timeout=30)


@pytest.fixture(params=["identity_header", "bearer_tokens"])
def gateway(request, tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, dict[str, str]]]]:
    with running() as authorization_server:
        guarded = subprocess.Popen([sys.executable, str(GUARDED), "--issuer", authorization_server.issuer],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert guarded.stdout is not None
            docs_url = guarded.stdout.readline().strip()
            port = free_port() if request.param == "bearer_tokens" else 0
            document: dict = {
                "policy": "off", "tools": {"exposure": "all"}, "ready_timeout": 5,
                "servers": {"docs": {"url": docs_url, "scope": "per_identity", "trust": "trusted",
                                     "auth": {"type": "authorization_code"}}}}
            if request.param == "identity_header":
                document["http"] = {"identity_header": IDENTITY_HEADER}
                callers = {user: {IDENTITY_HEADER: user} for user in ("alice", "bob")}
            else:
                resource = f"http://127.0.0.1:{port}/mcp"
                document["auth"] = {"resource": resource, "issuers": [{"issuer": authorization_server.issuer}]}
                callers = {user: {"authorization": "Bearer " + authorization_server.token(
                    sub=user, aud=resource, scope="mcp:read", expires_in=3600)} for user in ("alice", "bob")}
            config = tmp_path / "bastion.json"
            config.write_text(json.dumps(document))
            stderr = tmp_path / "bastion.stderr"
            bastion = subprocess.Popen(
                [BASTION, "serve", str(config), "--http", f"127.0.0.1:{port}"], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=stderr.open("wb"),
                env={**os.environ, "PYTHONUNBUFFERED": "1", "XDG_STATE_HOME": str(tmp_path / "state")})
            try:
                url = wait_for("address", lambda: (re.search(r"serving MCP on (http://\S+/mcp)", stderr.read_text())
                                                   or [None, None])[1])
                yield url, stderr, callers, tmp_path / "state"
            finally:
                bastion.send_signal(signal.SIGTERM)
                try:
                    bastion.wait(60)
                except subprocess.TimeoutExpired:
                    bastion.kill()
        finally:
            guarded.kill()
            guarded.wait()


def links(stderr: Path) -> dict[str, str]:
    return {user: link for user, link in LINK.findall(stderr.read_text())}


def connect(url: str, headers: dict[str, str], mode: str) -> Client:
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120, read=300))
    return Client(streamable_http_client(url, http_client=http), mode=mode)


async def whoami(client: Client) -> str:
    result = await client.call_tool("docs__whoami", {})
    return result.content[0].text


@pytest.mark.parametrize("mode", ["legacy", "auto"])  # auto: the SDK speaks 2026-07-28 to Bastion
async def test_each_person_authorizes_once_and_their_calls_carry_their_own_token(gateway, mode: str) -> None:
    url, stderr, callers, state = gateway
    operator_link = wait_for("operator's link", lambda: links(stderr).get("local"))
    expected_callback = url.removesuffix("/mcp") + "/oauth/callback" if "authorization" in callers["alice"] else None
    if expected_callback is not None:  # the frontend serves the redirect itself
        assert f"redirect_uri={quote(expected_callback, safe='')}" in operator_link
    assert approve(operator_link, "local").status_code == 200

    async with connect(url, callers["alice"], mode) as alice, connect(url, callers["bob"], mode) as bob:
        names = set()
        end = time.monotonic() + 120
        while "docs__whoami" not in names and time.monotonic() < end:  # the catalog, by the operator's token
            names = {tool.name for tool in (await alice.list_tools()).tools}
        assert "docs__whoami" in names

        with pytest.raises(MCPError) as refused:
            await whoami(alice)
        assert refused.value.error.code == -32042
        [elicitation] = refused.value.error.data["elicitations"]
        assert elicitation["mode"] == "url" and elicitation["url"].startswith("http://127.0.0.1:")
        assert "alice" not in links(stderr) and elicitation["url"] not in stderr.read_text()  # hers alone
        page = approve(elicitation["url"], "alice")
        assert page.status_code == 200 and "for alice" in page.text

        assert await whoami(alice) == "alice"
        with pytest.raises(MCPError) as bob_refused:  # alice's authorization is hers alone
            await whoami(bob)
        bob_link = bob_refused.value.error.data["elicitations"][0]["url"]
        assert bob_link != elicitation["url"]
        approve(bob_link, "bob")
        assert await whoami(bob) == "bob"
        assert await whoami(alice) == "alice"

        # Revoked at Bastion while the gateway runs: alice's next call needs a new authorization, bob's does not.
        listed = subprocess.run([BASTION, "credentials", "list"], capture_output=True, text=True,
                                env={**os.environ, "XDG_STATE_HOME": str(state)}, timeout=60)
        assert "alice" in listed.stdout and "bob" in listed.stdout
        revoked = subprocess.run([BASTION, "credentials", "revoke", "alice", "docs"], capture_output=True,
                                 text=True, env={**os.environ, "XDG_STATE_HOME": str(state)}, timeout=60)
        assert revoked.returncode == 0, revoked.stderr
        with pytest.raises(MCPError) as again:
            await whoami(alice)
        assert again.value.error.code == -32042
        assert await whoami(bob) == "bob"

    log = stderr.read_text()
    assert "access_token" not in log and "Bearer " not in log
