"""Two real ``bastion serve --http`` replicas on one real Redis (``[state] url``) and one session key, behind a loopback
forwarder: the official SDK client's handshake-era session moves from one to the other; a replica killed during a
call leaves its client an error saying the outcome is unknown, never a wait; DELETE on one ends it on both."""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.http.conftest import IDENTITY_HEADER, SERVER, Served, serve_config, stop_bastion
from tests.http.forwarder import Forwarder
from tests.redis_server import RedisServer, redis_available
from tests.support import FIXTURES, READY_TIMEOUT

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed (scripts/setup.sh)")

TEXT_TOOL = f"{SERVER}__test_simple_text"
TEXT = "This is a simple text response for testing."


def replica(tmp: Path, name: str, redis: RedisServer, key: Path, prefix: str, era: str = "legacy") -> Served:
    folder = tmp / name
    folder.mkdir()
    config = folder / "bastion.json"
    config.write_text(json.dumps({
        "policy": "off", "tools": {"exposure": "all"}, "ready_timeout": READY_TIMEOUT,
        "http": {"identity_header": IDENTITY_HEADER, "session_key_files": [str(key)]},
        "state": {"url": redis.url, "key_prefix": prefix},
        "servers": {SERVER: {"command": sys.executable, "args": [str(FIXTURES / "sdk_server.py")], "era": era,
                             "env": {"FIXTURE_EVENTS": str(tmp / "events.log")}, "request_timeout": 900,
                             "sandbox": {"writable": [str(tmp)]}}}}))
    return serve_config(config, folder, tmp / "events.log")


@pytest.fixture
async def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Served, Served, Forwarder]]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    redis = RedisServer().start()
    key = tmp_path / "session.key"
    key.write_text(secrets.token_hex(32))
    prefix = f"t{secrets.token_hex(4)}:"
    started: list[Served] = []
    try:
        started.append(replica(tmp_path, "a", redis, key, prefix))
        started.append(replica(tmp_path, "b", redis, key, prefix))
        balancer = await Forwarder(started[0].base).start()
        try:
            yield started[0], started[1], balancer
        finally:
            await balancer.close()
    finally:
        for served in started:
            stop_bastion(served)
        redis.close()


def client(url: str) -> Client:
    http = httpx2.AsyncClient(headers={IDENTITY_HEADER: "alice"}, timeout=httpx2.Timeout(120, read=300),
                              limits=httpx2.Limits(max_keepalive_connections=0))
    return Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="legacy")


async def test_an_sdk_session_moves_between_real_replicas_and_survives_the_first_ones_end(
        pair: tuple[Served, Served, Forwarder]) -> None:
    a, b, balancer = pair
    async with client(balancer.url) as session:
        assert TEXT_TOOL in {tool.name for tool in (await session.list_tools()).tools}
        balancer.point_at(b.base)
        assert (await session.call_tool(TEXT_TOOL, {})).content[0].text == TEXT
        assert "continues on this replica" in b.stderr.read_text()
        stop_bastion(a)  # A goes (a rolling restart): the session lives on B
        assert (await session.call_tool(TEXT_TOOL, {})).content[0].text == TEXT


async def test_a_replica_killed_mid_call_leaves_its_client_an_unknown_outcome_not_a_wait(
        pair: tuple[Served, Served, Forwarder]) -> None:
    a, b, balancer = pair
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(120, read=300),
                                  limits=httpx2.Limits(max_keepalive_connections=0)) as http:
        url = f"{balancer.url}/mcp"
        headers = {IDENTITY_HEADER: "alice", "accept": "application/json, text/event-stream"}
        init = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        headers = {**headers, "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        primed = None
        async with http.stream("POST", url, headers=headers, json={
                "jsonrpc": "2.0", "id": 9, "method": "tools/call",
                "params": {"name": f"{SERVER}__test_slow_cancellable", "arguments": {"tag": "killed"}}}) as call:
            async for line in call.aiter_lines():
                if line.startswith("id: "):
                    primed = line[4:]
                    break
            a.process.send_signal(signal.SIGKILL)
            a.process.wait(60)
            balancer.point_at(b.base)
        assert primed is not None
        resumed = await http.get(url, headers={**headers, "last-event-id": primed})
        assert resumed.status_code == 200, resumed.text
        (error,) = [json.loads(line[6:]) for line in resumed.text.splitlines() if line.startswith("data: {")]
        assert error["id"] == 9 and "outcome is unknown" in error["error"]["message"]
        # The session itself goes on on B, and DELETE there ends it.
        ping = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 10, "method": "ping"})
        assert ping.json() == {"jsonrpc": "2.0", "id": 10, "result": {}}
        assert (await http.delete(url, headers=headers)).status_code == 200
        gone = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 11, "method": "ping"})
        assert gone.status_code == 404


async def test_a_2026_retry_landing_on_the_other_real_replica_continues_the_call(
        pair: tuple[Served, Served, Forwarder]) -> None:
    from mcp.types import CreateMessageResult, TextContent

    a, b, balancer = pair

    async def on_sampling(context: Any, params: Any) -> CreateMessageResult:
        balancer.point_at(b.base)  # the retry carrying this answer lands on B
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="four"), model="m")

    http = httpx2.AsyncClient(headers={IDENTITY_HEADER: "alice"}, timeout=httpx2.Timeout(120, read=300),
                              limits=httpx2.Limits(max_keepalive_connections=0))
    async with Client(streamable_http_client(f"{balancer.url}/mcp", http_client=http), mode="2026-07-28",
                      sampling_callback=on_sampling) as session:
        result = await session.call_tool(f"{SERVER}__test_sampling", {"prompt": "2+2?"})
    assert [block.text for block in result.content] == ["LLM response: four"]
    assert balancer.target == b.base
