"""A 2026-07-28 ``subscriptions/listen`` over HTTP: an SSE stream of its own that stays open and carries the
list changes the client asked for."""

from __future__ import annotations

import asyncio
import json

import httpx2

from tests.http.conftest import IDENTITY_HEADER, SERVER, Served
from tests.http.test_sdk_clients import MODERN_META


def modern_headers(method: str, name: str | None = None) -> dict[str, str]:
    headers = {IDENTITY_HEADER: "listener", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2026-07-28", "mcp-method": method}
    if name is not None:
        headers["mcp-name"] = name
    return headers


async def test_a_listen_stream_carries_the_list_changes_it_asked_for(bastion_http: Served) -> None:
    async with httpx2.AsyncClient(timeout=120) as http:
        listen = {"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen",
                  "params": {"notifications": {"toolsListChanged": True}, "_meta": MODERN_META}}
        async with http.stream("POST", bastion_http.url, headers=modern_headers("subscriptions/listen"),
                               json=listen) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            lines = stream.aiter_lines()

            async def next_message() -> dict:
                async for line in lines:
                    if line.startswith("data: "):
                        return json.loads(line[6:])
                raise AssertionError("the listen stream ended")

            acknowledged = await asyncio.wait_for(next_message(), 120)
            assert acknowledged["method"] == "notifications/subscriptions/acknowledged"
            assert acknowledged["params"]["notifications"] == {"toolsListChanged": True}
            tool = f"{SERVER}__test_add_dynamic_tool"
            added = await http.post(bastion_http.url, headers=modern_headers("tools/call", tool), json={
                "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": tool, "arguments": {}, "_meta": MODERN_META}})
            assert added.status_code == 200 and "result" in added.json()
            changed = await asyncio.wait_for(next_message(), 120)
            assert changed["method"] == "notifications/tools/list_changed"
            assert changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "listen-1"
