"""Taint across replicas, for real: two ``bastion serve --http`` processes sharing one real Redis (``[state] url``),
called by a 2026-07-28 client (each POST a connection of its own) as the same caller. A page read through one replica
holds the caller's write through the other; another caller is not held; a value an answer gave through one is held
on its way out through the other; and while Redis is stopped the write is held for that reason, said in the answer,
until Redis is back, with no restart of either gateway."""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.guardrails.cross_server_support import FIXTURE
from tests.http.conftest import Served, serve_config, stop_bastion
from tests.redis_server import RedisServer, redis_available
from tests.support import READY_TIMEOUT

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed (scripts/setup.sh)")

MODERN = "2026-07-28"
IDENTITY_HEADER = "X-Bastion-Identity"


@pytest.fixture(autouse=True)
def _state_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _replica(tmp_path: Path, name: str, redis: RedisServer, prefix: str) -> Served:
    """One replica: its own folder, the shared Redis. Web is a server of content others wrote (untrusted), notes a
    trusted one whose write changes something; no policy, so what holds a call is the taint guardrail alone."""
    folder = tmp_path / name
    folder.mkdir()
    events = tmp_path / "events.log"

    def entry(server: str, trust: str) -> dict[str, Any]:
        return {"command": sys.executable, "args": [str(FIXTURE), server], "env": {"FIXTURE_EVENTS": str(events)},
                "sandbox": {"writable": [str(tmp_path)]}, "request_timeout": 900, "era": "legacy", "trust": trust}

    config = folder / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"web": entry("web", "untrusted"), "notes": entry("notes", "trusted"),
                    "mail": entry("mail", "untrusted")},
        "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"}, "policy": "off",
        # Mail stands for a server a value can leave the machine through; its calls are left to flow alone.
        "guardrails": {"pins": {"path": str(folder / "pins.json")}, "servers": {"mail": {"taint": "off"}}},
        "http": {"identity_header": IDENTITY_HEADER},
        "state": {"url": f"redis://127.0.0.1:{redis.port}/0", "key_prefix": prefix, "timeout_seconds": 1},
    }))
    return serve_config(config, folder, events)


@pytest.fixture
def replicas(tmp_path: Path):
    redis = RedisServer().start()
    prefix = f"e2e{secrets.token_hex(4)}:"
    started: list[Served] = []
    try:
        started.append(_replica(tmp_path, "a", redis, prefix))
        started.append(_replica(tmp_path, "b", redis, prefix))
        yield redis, started[0], started[1]
    finally:
        for served in started:
            stop_bastion(served)
        redis.close()


async def _call(served: Served, caller: str, name: str, arguments: dict[str, Any]) -> dict:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "replicas", "version": "0"}}
    headers = {IDENTITY_HEADER: caller, "content-type": "application/json", "accept": "application/json",
               "mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": name}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": meta}}
    async with httpx2.AsyncClient(timeout=120) as http:
        response = await http.post(served.url, headers=headers, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _text(answer: dict) -> str:
    assert "result" in answer, answer
    return answer["result"]["content"][0]["text"]


def _refusal(answer: dict) -> str:
    assert "error" in answer, answer
    return answer["error"]["message"]


async def test_taint_read_through_one_replica_holds_the_callers_write_through_the_other(replicas) -> None:
    redis, first, second = replicas
    assert _text(await _call(second, "alice", "notes__write_note", {"text": "before"})) == "wrote before"
    assert "the weather is fine" in _text(await _call(first, "alice", "web__fetch_page", {"url": "x"}))
    held = _refusal(await _call(second, "alice", "notes__write_note", {"text": "tainted"}))
    assert "web__fetch_page" in held and "'write_note' on server 'notes' is not read-only" in held
    assert _text(await _call(second, "bob", "notes__write_note", {"text": "bob"})) == "wrote bob"
    # A value one replica's answer gave the caller is held on its way out through the other (the hashing key of the
    # values is the one the first replica made in Redis).
    ticket = _text(await _call(first, "carol", "web__open_ticket", {})).split()[2].rstrip(";")
    flowed = _refusal(await _call(second, "carol", "mail__write_note", {"text": ticket}))
    assert "'web' (1 value)" in flowed

    redis.stop()  # Redis away: what alice's requests read is unknown, so her write is held, and says why
    blind = _refusal(await _call(first, "bob", "notes__write_note", {"text": "blind"}))
    assert "the shared state cannot be reached" in blind
    redis.start()  # back, empty (nothing saved): decided again with no restart, and nobody is tainted any more
    assert _text(await _call(first, "bob", "notes__write_note", {"text": "after"})) == "wrote after"
    lines = (first.events.read_text()).splitlines()
    assert "notes write_note before" in lines and "notes write_note after" in lines
    assert not any(line.endswith(("tainted", "blind")) for line in lines)
