"""Through ``bastion serve``: a client's own HTTP credentials stop at Bastion. The remote server behind it gets the
headers of Bastion's configuration (one read from the environment), never the client's Authorization or any other
header the client sent, in either era of the client."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import httpx2

from tests.support import BASTION, READY_TIMEOUT

MODERN = "2026-07-28"
IDENTITY_HEADER = "X-Bastion-Identity"
CLIENT_HEADERS = {"Authorization": "Bearer client-token", "X-Team": "client-says-evil", "Cookie": "session=client"}


def _serve(tmp_path, remote_url: str, **entry) -> tuple[subprocess.Popen, str]:
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"policy": "off", "ready_timeout": READY_TIMEOUT,
                                  "http": {"identity_header": IDENTITY_HEADER}, "servers": {"remote": {
        "url": remote_url, "era": "legacy",
        "headers": {"Authorization": "Bearer ${env:BASTION_TEST_REMOTE_TOKEN}", "X-Team": "platform"}, **entry}}}))
    stderr = tmp_path / "bastion.stderr"
    process = subprocess.Popen([BASTION, "serve", str(config), "--http", "127.0.0.1:0"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=stderr.open("wb"),
                               env={**os.environ, "BASTION_TEST_REMOTE_TOKEN": "gateway-token"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"serving MCP on (https?://[^ ]+/mcp)", stderr.read_text())
        if found:
            return process, found.group(1)
        assert process.poll() is None, stderr.read_text()
        time.sleep(0.1)
    process.kill()
    raise AssertionError(stderr.read_text())


def _answer(response: httpx2.Response) -> dict:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:") and '"result"' in line or line.startswith("data:") and '"error"' in line:
                return json.loads(line[5:])
        raise AssertionError(response.text)
    return response.json()


def _headers_seen_by_remote_modern(client: httpx2.Client, url: str, identity: str = "agent") -> dict:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "remote__headers", "arguments": {}, "_meta": meta}}
    response = client.post(url, json=body, headers={
        **CLIENT_HEADERS, IDENTITY_HEADER: identity, "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call", "mcp-name": "remote__headers"})
    answer = _answer(response)
    assert "result" in answer, answer
    return json.loads(answer["result"]["content"][0]["text"])


def _headers_seen_by_remote_legacy(client: httpx2.Client, url: str) -> dict:
    accept = {"accept": "application/json, text/event-stream", IDENTITY_HEADER: "agent"}
    init = client.post(url, headers={**CLIENT_HEADERS, **accept}, json={
        "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    session = {"mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    client.post(url, headers={**CLIENT_HEADERS, **accept, **session},
                json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    response = client.post(url, headers={**CLIENT_HEADERS, **accept, **session}, json={
        "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "remote__headers", "arguments": {}}})
    answer = _answer(response)
    assert "result" in answer, answer
    return json.loads(answer["result"]["content"][0]["text"])


def test_a_clients_credentials_never_reach_a_remote_server(tmp_path, remote_server):
    server = remote_server()
    process, url = _serve(tmp_path, server.url)
    try:
        with httpx2.Client(timeout=120) as client:
            for seen in (_headers_seen_by_remote_modern(client, url), _headers_seen_by_remote_legacy(client, url)):
                assert seen["authorization"] == "Bearer gateway-token"
                assert IDENTITY_HEADER.lower() not in seen
                assert seen["x-team"] == "platform"
                assert "cookie" not in seen and "client" not in json.dumps(seen)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_per_identity_remote_server_gives_each_identity_its_own_session(tmp_path, remote_server):
    server = remote_server()
    sessions: dict[str, set[str]] = {}
    for scope in ("shared", "per_identity"):
        folder = tmp_path / scope
        folder.mkdir()
        process, url = _serve(folder, server.url, scope=scope)
        try:
            with httpx2.Client(timeout=120) as client:
                seen = [_headers_seen_by_remote_modern(client, url, identity) for identity in ("alice", "bob", "alice")]
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
        sessions[scope] = [entry["mcp-session-id"] for entry in seen]
    # One legacy session with the server for everyone, or one per identity (alice's two calls share hers).
    assert len(set(sessions["shared"])) == 1
    alice, bob, alice_again = sessions["per_identity"]
    assert alice == alice_again and alice != bob
