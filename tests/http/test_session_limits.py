"""Handshake-era sessions are bounded: a quiet one ends after http.session_idle_timeout, and past
http.max_sessions a new initialize is refused with 503 while the open ones keep working."""

from __future__ import annotations

import asyncio
import time

import httpx2

from tests.http.conftest import start_bastion, stop_bastion
from tests.http.test_sdk_clients import open_legacy_session

LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


async def test_quiet_sessions_end_and_the_session_count_is_bounded(tmp_path) -> None:
    # Long enough that the second session, used at once, cannot go quiet on a loaded machine before it is used.
    served = start_bastion(tmp_path, {"session_idle_timeout": 3, "max_sessions": 2})
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            first = await open_legacy_session(http, served.url, "a")
            second = await open_legacy_session(http, served.url, "b")
            refused = await http.post(served.url, headers={"accept": "application/json"}, json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}})
            assert refused.status_code == 503 and "http.max_sessions" in refused.json()["error"]["message"]
            assert (await http.post(served.url, headers=second, json=LIST)).status_code == 200
            # Nothing touches the first session until the gateway says it ended it (a request would keep it).
            ended = f"session {first['mcp-session-id'][:8]}… ended after 3 s without requests"
            deadline = time.monotonic() + 60
            while ended not in served.stderr.read_text():
                assert time.monotonic() < deadline, "a quiet session never ended"
                await asyncio.sleep(0.05)
            assert (await http.post(served.url, headers=first, json=LIST)).status_code == 404
    finally:
        stop_bastion(served)
