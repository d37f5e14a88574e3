"""A real ``bastion serve --http 127.0.0.1:0`` with a given configuration (auth, policy, TLS), federating the raw
fixture server, for the API key and client certificate tests; and a small MCP exchange over httpx2."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from tests.support import BASTION, READY_TIMEOUT, raw_server

# alice and the ops group may call tools; anyone authenticated may list them (the list is filtered by call_tool)
POLICY = """
@id("anyone-lists")
permit (principal, action in [Bastion::Action::"list_tools", Bastion::Action::"list_resources",
                              Bastion::Action::"list_prompts"], resource);

@id("alice-calls")
permit (principal == Bastion::User::"alice", action == Bastion::Action::"call_tool", resource);

@id("ops-call")
permit (principal in Bastion::Group::"ops", action == Bastion::Action::"call_tool", resource);
"""


@dataclass
class Served:
    url: str
    stderr: Path
    process: subprocess.Popen

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")


def write_config(tmp: Path, *, auth: dict[str, Any] | None, http: dict[str, Any] | None = None,
                 identity: dict[str, Any] | None = None) -> Path:
    (tmp / "team.cedar").write_text(POLICY)
    policy: dict[str, Any] = {"policy_files": ["team.cedar"], "audit": {"path": str(tmp / "audit.jsonl")}}
    if identity is not None:
        policy["identity"] = identity
    config: dict[str, Any] = {"servers": {"raw": raw_server()}, "ready_timeout": READY_TIMEOUT, "policy": policy,
                              "guardrails": "off", "http": http or {}}
    if auth is not None:
        config["auth"] = auth
    path = tmp / "bastion.json"
    path.write_text(json.dumps(config))
    return path


def start(config: Path, *extra: str) -> Served:
    stderr = config.parent / "bastion.stderr"
    process = subprocess.Popen([BASTION, "serve", str(config), "--http", "127.0.0.1:0", *extra],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr.open("wb"),
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"serving MCP on (https?://[^ ]+/mcp)", stderr.read_text(errors="replace"))
        if found:
            return Served(found.group(1), stderr, process)
        if process.poll() is not None:
            raise AssertionError(f"bastion serve exited with {process.returncode}: {stderr.read_text()}")
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"bastion serve did not say where it listens: {stderr.read_text()}")


def stop(served: Served) -> None:
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGTERM)
        try:
            served.process.wait(60)
        except subprocess.TimeoutExpired:
            served.process.kill()
            served.process.wait()


HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def _rpc(id_: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


def answer(response: httpx2.Response) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:") and '"id"' in line:
                return json.loads(line[5:])
        raise AssertionError(f"no answer in the stream: {response.text!r}")
    return response.json()


async def open_session(client: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> httpx2.Response:
    """initialize (2025-11-25); the response, whose Mcp-Session-Id names the session when it was accepted."""
    return await client.post(url, headers={**HEADERS, **headers}, json=_rpc(1, "initialize", {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "auth-test", "version": "1"}}))


async def session_request(client: httpx2.AsyncClient, url: str, headers: dict[str, str], session: str,
                          method: str, params: dict[str, Any], id_: int = 2) -> httpx2.Response:
    return await client.post(url, headers={**HEADERS, **headers, "mcp-session-id": session,
                                           "mcp-protocol-version": "2025-11-25"}, json=_rpc(id_, method, params))


async def tools_and_call(client: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> tuple[list[str], dict]:
    """A whole exchange as the caller ``headers`` authenticate: the tool names it is shown, and the answer to
    calling raw__echo."""
    opened = await open_session(client, url, headers)
    assert opened.status_code == 200, (opened.status_code, opened.text)
    session = opened.headers["mcp-session-id"]
    await client.post(url, headers={**HEADERS, **headers, "mcp-session-id": session,
                                    "mcp-protocol-version": "2025-11-25"},
                      json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    listed = answer(await session_request(client, url, headers, session, "tools/list", {}))
    names = sorted(t["name"] for t in listed["result"]["tools"])
    called = answer(await session_request(client, url, headers, session, "tools/call",
                                           {"name": "raw__echo", "arguments": {"text": "hello"}}, 3))
    return names, called


MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {}}


async def modern_request(client: httpx2.AsyncClient, url: str, headers: dict[str, str], method: str,
                         params: dict[str, Any], name: str | None = None) -> httpx2.Response:
    """One 2026-07-28 request: a session of its own, authenticated by itself."""
    routing = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2026-07-28", "mcp-method": method, **({"mcp-name": name} if name else {})}
    return await client.post(url, headers={**routing, **headers}, json={
        "jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": MODERN_META}})
