"""Two real gateways (``bastion serve --http``) sharing one real Redis (``[state] url``) and one approval key, called
by a 2026-07-28 client (each POST a connection of its own): a rate limit's burst is shared between them, an approval
redeemed on one is refused on the other, and when Redis stops the calls that need it are refused with a clear error
and /readyz says not ready on both, until Redis is back, with no restart of either gateway."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.http.conftest import Served, serve_config, stop_bastion
from tests.redis_server import RedisServer, redis_available
from tests.support import READY_TIMEOUT, raw_server

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed (scripts/setup.sh)")

MODERN = "2026-07-28"
IDENTITY_HEADER = "X-Bastion-Identity"
ACCEPT = {"action": "accept", "content": {"approve": True}}
BURST = 5
REPLAY_REFUSED = "this approval was already used"
UNREACHABLE = "cannot be reached"


@pytest.fixture(autouse=True)
def _state_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _replica(tmp_path: Path, name: str, redis: RedisServer, secret: Path, prefix: str) -> Served:
    """One replica: its own folder (stderr, audit trail, queue), the shared Redis and approval key."""
    folder = tmp_path / name
    folder.mkdir()
    entry = raw_server(tmp_path / "marks", auto_approve=["echo"])
    entry["env"]["RAW_SERVER_MARK_CALLS"] = "1"
    config = folder / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"raw": entry}, "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"},
        "http": {"identity_header": IDENTITY_HEADER},
        # Pins in Redis are checked before the policy, and withhold what cannot be checked while Redis is away
        # (tests/test_replicas_pins_and_approvals.py): off here, so that what is refused is the policy's doing.
        "guardrails": {"servers": {"raw": {"pinning": "off"}}},
        "state": {"url": f"redis://127.0.0.1:{redis.port}/0", "key_prefix": prefix, "timeout_seconds": 1},
        "policy": {
            "approval": {"approver": "client", "timeout_seconds": 120, "secret_file": str(secret),
                         "queue_dir": str(folder / "queue")},
            "audit": {"path": str(folder / "audit.jsonl")},
            "rate_limits": [{"scope": "tool", "match": "raw/echo", "rate": 0.001, "burst": BURST}],
        },
    }))
    return serve_config(config, folder, folder / "events.log")


@pytest.fixture
def replicas(tmp_path: Path):
    redis = RedisServer().start()
    secret = tmp_path / "approval.key"
    secret.write_text(secrets.token_bytes(32).hex())
    prefix = f"e2e{secrets.token_hex(4)}:"
    started: list[Served] = []
    try:
        started.append(_replica(tmp_path, "a", redis, secret, prefix))
        started.append(_replica(tmp_path, "b", redis, secret, prefix))
        yield redis, started[0], started[1]
    finally:
        for served in started:
            stop_bastion(served)
        redis.close()


async def _post(served: Served, request_id: int, name: str, arguments: dict[str, Any], **params: Any) -> dict:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
            "io.modelcontextprotocol/clientInfo": {"name": "replicas", "version": "0"}}
    headers = {IDENTITY_HEADER: "alice", "content-type": "application/json", "accept": "application/json",
               "mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": name}
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": meta, **params}}
    async with httpx2.AsyncClient(timeout=120) as http:
        response = await http.post(served.url, headers=headers, json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def _ready(served: Served) -> tuple[int, dict]:
    async with httpx2.AsyncClient(timeout=30) as http:
        response = await http.get(served.base + "/readyz")
    return response.status_code, response.json()


async def _said(served: Served, words: str) -> str:
    """The line of the gateway's stderr that says ``words``, once it has been written."""
    for _ in range(3000):
        for line in served.stderr.read_text().splitlines():
            if words in line:
                return line
        await asyncio.sleep(0.01)
    raise AssertionError(f"the gateway never said {words!r}: {served.stderr.read_text()}")


def _big_calls(tmp_path: Path) -> int:
    marks = tmp_path / "marks"
    lines = marks.read_text().splitlines() if marks.exists() else []
    return sum(1 for line in lines if line.startswith("call ") and json.loads(line[5:])["params"]["name"] == "big")


async def test_a_rate_limit_is_shared_and_redis_going_away_refuses_then_recovers(replicas) -> None:
    redis, first, second = replicas
    # Burst N in all, spread over both replicas (alternating), then refusals with retryAfterSeconds.
    answers = [await _post(first if n % 2 else second, n, "raw__echo", {"text": f"m{n}"}) for n in range(BURST + 3)]
    assert [a["result"]["content"][0]["text"] for a in answers[:BURST]] == [f"m{n}" for n in range(BURST)]
    for refused in answers[BURST:]:
        error = refused["error"]
        assert error["code"] == -32000 and error["data"]["rule"] == "rate:tool:raw/echo", refused
        assert error["data"]["retryAfterSeconds"] >= 1
    for served in (first, second):
        assert (await _ready(served))[0] == 200

    redis.stop()
    for served in (first, second):
        refused = (await _post(served, 100, "raw__echo", {"text": "while down"}))["error"]
        assert refused["code"] == -32000 and refused["data"]["rule"] == "rate:state-unavailable", refused
        assert "was not run" in refused["message"] and UNREACHABLE in refused["message"]
        assert f"127.0.0.1:{redis.port}/0" in refused["message"]
        status, body = await _ready(served)
        assert status == 503 and body["checks"]["state"] == {"ok": False} and body["status"] == "not ready"

    redis.start()  # an empty Redis (nothing was saved): the buckets start full again
    for served in (first, second):
        assert (await _post(served, 200, "raw__echo", {"text": "back"}))["result"]["content"][0]["text"] == "back"
        assert (await _ready(served))[0] == 200
    for served in (first, second):
        audit = (served.stderr.parent / "audit.jsonl").read_text()
        assert "rate:state-unavailable" in audit


async def test_an_approval_redeemed_on_one_replica_is_refused_on_the_other(replicas, tmp_path: Path) -> None:
    redis, first, second = replicas
    asked = (await _post(first, 1, "raw__big", {"size": 2}))["result"]
    assert asked["resultType"] == "input_required"
    approved = {"requestState": asked["requestState"], "inputResponses": {"approval": ACCEPT}}

    # Redis gone: the state cannot be used up, so the call is refused, not run unapproved or twice.
    redis.stop()
    down = (await _post(second, 2, "raw__big", {"size": 2}, **approved))["error"]
    assert down["code"] == -32000 and down["data"]["rule"] == "approval:state-unavailable", down
    assert "was not run" in down["message"]
    redis.start()

    # Back: the state was never used, so it runs once, on whichever replica gets it first; every other try, on
    # either replica, at once or later, is refused.
    answers = await asyncio.gather(*(_post(served, 10 + n, "raw__big", {"size": 2}, **approved)
                                     for n, served in enumerate((second, first, second, first, second, first))))
    ran = [a for a in answers if "result" in a]
    assert [a["result"]["content"][0]["text"] for a in ran] == ["xx"], answers
    assert all(REPLAY_REFUSED in a["error"]["message"] for a in answers if "error" in a)
    later = await _post(first, 30, "raw__big", {"size": 2}, **approved)
    assert REPLAY_REFUSED in later["error"]["message"]
    settled = await _post(second, 40, "raw__echo", {"text": "settled"})
    assert settled["result"]["content"][0]["text"] == "settled"
    settled = await _post(first, 41, "raw__echo", {"text": "settled"})
    assert settled["result"]["content"][0]["text"] == "settled"
    assert _big_calls(tmp_path) == 1


async def test_a_gateway_starts_without_its_redis_and_joins_it_when_it_comes(tmp_path: Path) -> None:
    redis = RedisServer()  # not started yet: its port is free
    secret = tmp_path / "approval.key"
    secret.write_text(secrets.token_bytes(32).hex())
    served = _replica(tmp_path, "alone", redis, secret, "alone:")
    try:
        status, body = await _ready(served)
        assert status == 503 and body["checks"]["state"] == {"ok": False}
        said = await _said(served, "the gateway starts anyway")
        assert f"127.0.0.1:{redis.port}/0" in said and "cannot be reached" in said
        refused = (await _post(served, 1, "raw__echo", {"text": "no redis"}))["error"]
        assert refused["data"]["rule"] == "rate:state-unavailable"
        redis.start()
        assert (await _post(served, 2, "raw__echo", {"text": "redis"}))["result"]["content"][0]["text"] == "redis"
        assert (await _ready(served))[0] == 200
    finally:
        stop_bastion(served)
        redis.close()


def _sdk(served: Served, mode: str) -> Client:
    http = httpx2.AsyncClient(headers={IDENTITY_HEADER: "alice"}, timeout=httpx2.Timeout(120, read=300))
    return Client(streamable_http_client(served.url, http_client=http), mode=mode)


async def test_official_clients_of_both_eras_share_one_burst_across_replicas(replicas) -> None:
    """A handshake-era session on one replica and a 2026-07-28 client on the other draw from one bucket."""
    _, first, second = replicas
    async with _sdk(first, "legacy") as legacy, _sdk(second, "auto") as modern:
        ran, refused = [], []
        for n in range(BURST + 2):
            client = legacy if n % 2 else modern
            try:
                result = await client.call_tool("raw__echo", {"text": f"c{n}"})
                ran.append(result.content[0].text)
            except MCPError as error:
                refused.append(error)
        assert ran == [f"c{n}" for n in range(BURST)]
        assert [(e.code, e.data["rule"]) for e in refused] == [(-32000, "rate:tool:raw/echo")] * 2
        assert all(e.data["retryAfterSeconds"] >= 1 for e in refused)
