"""``bastion serve --http`` as an OAuth 2.1 resource server, a real process federating the SDK fixture server,
with a real issuer on 127.0.0.1: its Protected Resource Metadata, the 401 and 403 challenges, tokens checked on
every request and a session held to its caller, scopes per method, both protocol eras, and no token in its log."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx2
import pytest

from tests.auth.resource_server_issuer import RESOURCE, Issuer, IssuerThread
from tests.support import BASTION, FIXTURES, READY_TIMEOUT

METADATA_URL = "https://mcp.example.test/.well-known/oauth-protected-resource/mcp"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
ACCEPT = {"accept": "application/json"}


@dataclass
class Gateway:
    url: str
    base: str
    stderr: Path
    process: subprocess.Popen
    issuer: Issuer


def write_config(tmp: Path, issuer: Issuer, **extra: Any) -> Path:
    config = tmp / "bastion.json"
    config.write_text(json.dumps({
        "policy": "off", "ready_timeout": READY_TIMEOUT, "http": extra.pop("http", {}),
        "auth": {"resource": RESOURCE, "issuers": [{"issuer": issuer.issuer}], "scopes": ["mcp"],
                 "method_scopes": {"tools/call": ["mcp:tools"]}, **extra},
        "servers": {"fx": {"command": sys.executable, "args": [str(FIXTURES / "sdk_server.py")],
                           "sandbox": {"writable": [str(tmp)]}}}}))
    return config


def start(config: Path, stderr: Path) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([BASTION, "serve", str(config), "--http", "127.0.0.1:0"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=stderr.open("wb"),
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"serving MCP on (https?://[^ ]+/mcp)", stderr.read_text())
        if found:
            return process, found.group(1)
        if process.poll() is not None:
            raise AssertionError(f"bastion serve exited with {process.returncode}: {stderr.read_text()}")
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"bastion serve did not say where it listens: {stderr.read_text()}")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("resource-server")
    with IssuerThread() as issuer:
        stderr = tmp / "bastion.stderr"
        process, url = start(write_config(tmp, issuer), stderr)
        try:
            yield Gateway(url, url[: -len("/mcp")], stderr, process, issuer)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def auth(token: str) -> dict[str, str]:
    return {**ACCEPT, "authorization": f"Bearer {token}"}


async def open_session(http: httpx2.AsyncClient, gateway: Gateway, token: str) -> dict[str, str]:
    init = await http.post(gateway.url, headers=auth(token), json=INIT)
    assert init.status_code == 200, init.text
    session = {"mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    done = await http.post(gateway.url, headers={**auth(token), **session},
                           json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert done.status_code == 202
    return session


def challenge(response: httpx2.Response) -> dict[str, str]:
    value = response.headers["www-authenticate"]
    assert value.startswith("Bearer ")
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', value))


async def test_the_protected_resource_metadata_is_at_both_well_known_paths(gateway: Gateway) -> None:
    async with httpx2.AsyncClient(timeout=60) as http:
        for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
            response = await http.get(gateway.base + path)
            assert response.status_code == 200, path
            assert response.json() == {"resource": RESOURCE, "authorization_servers": [gateway.issuer.issuer],
                                       "bearer_methods_supported": ["header"], "resource_name": "Bastion MCP gateway",
                                       "scopes_supported": ["mcp", "mcp:tools"]}
        assert (await http.post(gateway.base + "/.well-known/oauth-protected-resource")).status_code == 405


async def test_a_request_without_a_token_gets_401_naming_the_metadata(gateway: Gateway) -> None:
    async with httpx2.AsyncClient(timeout=60) as http:
        response = await http.post(gateway.url, headers=ACCEPT, json=INIT)
        assert response.status_code == 401
        assert challenge(response) == {"scope": "mcp", "resource_metadata": METADATA_URL}
        assert "bearer access token" in response.json()["error"]["message"]


async def test_a_session_runs_on_valid_tokens_and_stays_its_callers(gateway: Gateway) -> None:
    issuer = gateway.issuer
    async with httpx2.AsyncClient(timeout=120) as http:
        session = await open_session(http, gateway, issuer.token())
        # Every request carries a token, which may be a fresh one of the same caller.
        listed = await http.post(gateway.url, headers={**auth(issuer.token()), **session},
                                 json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert listed.status_code == 200 and listed.json()["result"]["tools"], listed.text
        bare = await http.post(gateway.url, headers={**ACCEPT, **session},
                               json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
        assert bare.status_code == 401
        stolen = await http.post(gateway.url, headers={**auth(issuer.token(sub="mallory")), **session},
                                 json={"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
        assert stolen.status_code == 403 and "another caller" in stolen.json()["error"]["message"]
        ended = await http.delete(gateway.url, headers={**auth(issuer.token()), **session})
        assert ended.status_code == 200


async def test_a_method_scope_missing_is_403_insufficient_scope(gateway: Gateway) -> None:
    issuer = gateway.issuer
    call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "fx__test_simple_text",
                                                                        "arguments": {}}}
    async with httpx2.AsyncClient(timeout=120) as http:
        session = await open_session(http, gateway, issuer.token())
        refused = await http.post(gateway.url, headers={**auth(issuer.token(scope="mcp")), **session}, json=call)
        assert refused.status_code == 403
        assert challenge(refused) == {
            "error": "insufficient_scope", "scope": "mcp mcp:tools", "resource_metadata": METADATA_URL,
            "error_description": "insufficient scope: tools/call needs mcp mcp:tools"}
        assert refused.json()["id"] == 5
        allowed = await http.post(gateway.url, headers={**auth(issuer.token(scope="mcp mcp:tools")), **session},
                                  json=call)
        assert allowed.status_code == 200, allowed.text
        assert "simple text" in allowed.text


async def test_a_token_without_the_base_scope_is_refused_everywhere(gateway: Gateway) -> None:
    async with httpx2.AsyncClient(timeout=60) as http:
        response = await http.post(gateway.url, headers=auth(gateway.issuer.token(scope="mcp:tools")), json=INIT)
        assert response.status_code == 403
        assert challenge(response)["scope"] == "mcp"


async def test_a_2026_07_28_request_is_authenticated_on_its_own(gateway: Gateway) -> None:
    listing = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}}
    modern = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"}
    async with httpx2.AsyncClient(timeout=120) as http:
        ok = await http.post(gateway.url, headers={**auth(gateway.issuer.token()), **modern}, json=listing)
        assert ok.status_code == 200, ok.text
        assert ok.json()["result"]["tools"]
        expired = await http.post(gateway.url, headers={**auth(gateway.issuer.token(exp=int(time.time()) - 600)),
                                                        **modern}, json=listing)
        assert expired.status_code == 401
        assert challenge(expired)["error"] == "invalid_token"
        assert challenge(expired)["error_description"] == "the access token has expired"


async def test_bad_tokens_over_http_and_what_the_log_says(gateway: Gateway) -> None:
    issuer = gateway.issuer
    tokens = {"wrong_audience": issuer.token(aud="https://other.example.test/mcp"),
              "algorithm_not_allowed": issuer.hs256_with_public_key(),
              "unknown_key": issuer.token(key=issuer.new_key())}
    async with httpx2.AsyncClient(timeout=60) as http:
        for token in tokens.values():
            response = await http.post(gateway.url, headers=auth(token), json=INIT)
            assert response.status_code == 401
            assert token not in response.text and token not in response.headers["www-authenticate"]
        huge = await http.post(gateway.url, headers=auth("a" * 20000), json=INIT)
        assert huge.status_code in (400, 431)
        malformed = await http.post(gateway.url, headers={**ACCEPT, "authorization": "Bearer a b"}, json=INIT)
        assert malformed.status_code == 400
        assert challenge(malformed)["error"] == "invalid_request"
    log = gateway.stderr.read_text()
    for reason, token in tokens.items():
        assert f"refused a request from 127.0.0.1 on mcp: {reason} (HTTP 401)" in log
        assert token not in log and token.split(".")[1] not in log


def test_the_identity_header_cannot_be_combined_with_the_auth_table(tmp_path: Path) -> None:
    config = write_config(tmp_path, Issuer(base="https://id.example.test"),
                          http={"identity_header": "X-Bastion-Identity"})
    done = subprocess.run([BASTION, "serve", str(config), "--http", "127.0.0.1:0"], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert "http.identity_header" in done.stderr and "remove" in done.stderr


def test_bastion_check_refuses_a_bad_auth_table_without_echoing_its_secret(tmp_path: Path) -> None:
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {}, "auth": {"issuers": [{
        "issuer": "https://id.example.test", "introspection_endpoint": "https://id.example.test/introspect",
        "client_id": "bastion", "client_secret": "s3cr3t-never-shown"}]}}))
    done = subprocess.run([BASTION, "check", str(config)], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "auth.resource" in done.stderr
    assert "s3cr3t-never-shown" not in done.stderr + done.stdout
    both = tmp_path / "both.json"
    both.write_text(json.dumps({"servers": {}, "http": {"identity_header": "X-Bastion-Identity"}, "auth": {
        "resource": RESOURCE, "issuers": [{"issuer": "https://id.example.test"}]}}))
    done = subprocess.run([BASTION, "check", str(both)], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "http.identity_header" in done.stderr


async def test_a_refusal_at_admission_is_audited_as_the_chains_refusals_are(tmp_path: Path) -> None:
    """Refusals before the chain (a method's scope, a server's in-flight gate, a session past its caller's quota, a
    2026-07-28 header contradicting its body) are in the audit trail: a decision record naming the stage and rule,
    and a call record with the outcome."""
    (tmp_path / "allow.cedar").write_text("permit (principal, action, resource);\n")
    audit = tmp_path / "audit.jsonl"
    call = {"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "fx__test_simple_text",
                                                                        "arguments": {}}}
    with IssuerThread() as issuer:
        config = write_config(tmp_path, issuer)
        body = json.loads(config.read_text())
        body["policy"] = {"policy_files": [str(tmp_path / "allow.cedar")], "audit": {"path": str(audit)}}
        body["http"] = {"max_in_flight_per_server": 1, "max_sessions_per_identity": 1}
        body["servers"]["fx"]["env"] = {"FIXTURE_EVENTS": str(tmp_path / "events.log")}
        config.write_text(json.dumps(body))
        process, url = start(config, tmp_path / "bastion.stderr")
        try:
            served = Gateway(url, url[: -len("/mcp")], tmp_path / "bastion.stderr", process, issuer)
            async with httpx2.AsyncClient(timeout=120) as http:
                session = await open_session(http, served, issuer.token())
                # The caller's one session is its quota: a second initialize is refused at admission.
                over = await http.post(url, headers=auth(issuer.token()), json=INIT)
                assert over.status_code == 429 and over.json()["error"]["code"] == -32000
                refused = await http.post(url, headers={**auth(issuer.token(scope="mcp")), **session}, json=call)
                assert refused.status_code == 403
                # One call holds the server's only slot; the next is refused at the gate.
                tools = auth(issuer.token(scope="mcp mcp:tools"))
                slow = asyncio.ensure_future(http.post(url, headers={**tools, **session}, json={
                    "jsonrpc": "2.0", "id": 7, "method": "tools/call",
                    "params": {"name": "fx__test_slow_cancellable", "arguments": {"tag": "gate"}}}))
                events = tmp_path / "events.log"
                while "slow-started gate" not in (events.read_text() if events.exists() else ""):
                    assert not slow.done(), slow.result().text
                    await asyncio.sleep(0.05)
                busy = await http.post(url, headers={**tools, **session}, json={**call, "id": 8})
                assert busy.json()["error"]["code"] == -32000
                slow.cancel()
                # A 2026-07-28 POST whose Mcp-Name header contradicts its body is refused before the chain.
                meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientCapabilities": {},
                        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}
                contradicted = await http.post(url, headers={
                    **tools, "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call",
                    "mcp-name": "fx__something_else"}, json={**call, "id": 9, "params": {**call["params"], "_meta": meta}})
                assert contradicted.json()["error"]["code"] == -32020
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)  # the trail is flushed at shutdown
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    [decision] = [r for r in records if r["kind"] == "decision" and r["stages"][0]["stage"] == "scopes"]
    assert decision["decision"] == "deny" and decision["what"]["method"] == "tools/call"
    assert decision["rule"] == "http.auth.scopes" and decision["what"]["target"] == "fx__test_simple_text"
    gated = [r for r in records if r["kind"] == "decision" and r["rule"] == "http.max_in_flight_per_server"]
    assert len(gated) == 1 and gated[0]["stages"][0]["stage"] == "admission"
    [quota] = [r for r in records if r["kind"] == "decision" and r["rule"] == "http.max_sessions_per_identity"]
    assert quota["stages"][0]["stage"] == "admission" and quota["what"]["method"] == "initialize"
    mismatched = [r for r in records if r["kind"] == "decision" and r["rule"] == "http.header-mismatch"]
    assert len(mismatched) == 1 and mismatched[0]["what"]["target"] == "fx__test_simple_text"
    outcomes = [r["outcome"] for r in records if r["kind"] == "call" and r["what"].get("method") == "tools/call"]
    assert 403 in outcomes and -32000 in outcomes and -32020 in outcomes
    assert [r["outcome"] for r in records if r["kind"] == "call" and r["what"].get("method") == "initialize"] == [
        "complete", -32000]
