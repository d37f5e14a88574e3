"""The official SDK's HTTP clients of both eras, and of the old HTTP+SSE transport, through ``bastion serve``."""

from __future__ import annotations

import asyncio
import json
import time

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.sse import sse_client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.http.conftest import IDENTITY_HEADER, SERVER, Served

ERAS = ("legacy", "auto")  # auto probes server/discover and so speaks 2026-07-28 to Bastion


def connect(served: Served, mode: str, identity: str) -> Client:
    http = httpx2.AsyncClient(headers={IDENTITY_HEADER: identity}, timeout=httpx2.Timeout(120, read=300))
    return Client(streamable_http_client(served.url, http_client=http), mode=mode)


@pytest.mark.parametrize("mode", ERAS)
async def test_an_sdk_client_lists_and_calls_tools_with_progress(bastion_http: Served, mode: str) -> None:
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with connect(bastion_http, mode, "alice") as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert f"{SERVER}__test_simple_text" in names
        result = await client.call_tool(f"{SERVER}__test_simple_text", {})
        assert result.content[0].text == "This is a simple text response for testing."
        result = await client.call_tool(f"{SERVER}__test_tool_with_progress", {}, progress_callback=on_progress)
        assert not result.is_error
        assert progress == sorted(progress) and progress[-1] == 100.0  # streamed on the call's own SSE stream
        prompt = await client.get_prompt(f"{SERVER}__test_simple_prompt")
        assert prompt.messages


async def test_many_concurrent_clients_of_both_eras_with_their_own_identities(bastion_http: Served) -> None:
    async def one(index: int) -> tuple[int, str]:
        mode = ERAS[index % 2]
        async with connect(bastion_http, mode, f"agent-{index}") as client:
            result = await client.call_tool(f"{SERVER}__test_simple_text", {})
            tools = await client.list_tools()
            return index, f"{result.content[0].text}|{len(tools.tools)}"

    results = await asyncio.gather(*(one(i) for i in range(16)))
    assert sorted(i for i, _ in results) == list(range(16))
    answers = {answer for _, answer in results}
    assert len(answers) == 1 and answers.pop().startswith("This is a simple text response")


async def test_a_session_of_one_identity_is_refused_to_another(bastion_http: Served) -> None:
    async with httpx2.AsyncClient(timeout=120) as http:
        init = await http.post(bastion_http.url, headers={IDENTITY_HEADER: "alice", "accept": "application/json"},
                               json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                                   "protocolVersion": "2025-11-25", "capabilities": {},
                                   "clientInfo": {"name": "t", "version": "1"}}})
        assert init.status_code == 200
        session = init.headers["mcp-session-id"]
        stolen = await http.post(bastion_http.url, headers={IDENTITY_HEADER: "mallory", "mcp-session-id": session},
                                 json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert stolen.status_code == 403
        assert "another caller" in stolen.json()["error"]["message"]
        ended = await http.delete(bastion_http.url, headers={IDENTITY_HEADER: "alice", "mcp-session-id": session})
        assert ended.status_code == 200
        after = await http.post(bastion_http.url, headers={IDENTITY_HEADER: "alice", "mcp-session-id": session},
                                json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
        assert after.status_code == 404


MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}}


async def open_legacy_session(http: httpx2.AsyncClient, url: str, identity: str) -> dict[str, str]:
    """A handshake-era session opened by hand; the headers its later requests carry."""
    headers = {IDENTITY_HEADER: identity, "accept": "application/json, text/event-stream"}
    init = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
    assert init.status_code == 200, init.text
    headers = {**headers, "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    done = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert done.status_code == 202
    return headers


@pytest.mark.parametrize("era", ("legacy", "modern"))
async def test_a_client_that_disconnects_has_its_call_cancelled_upstream(bastion_http: Served, era: str) -> None:
    tag = f"http-drop-{era}"
    name = f"{SERVER}__test_slow_cancellable"
    async with httpx2.AsyncClient(timeout=300) as http:
        if era == "legacy":
            headers = await open_legacy_session(http, bastion_http.url, "bob")
            params: dict = {"name": name, "arguments": {"tag": tag}}
        else:
            headers = {IDENTITY_HEADER: "bob", "accept": "application/json, text/event-stream",
                       "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": name}
            params = {"name": name, "arguments": {"tag": tag}, "_meta": MODERN_META}
        call = asyncio.ensure_future(http.post(bastion_http.url, headers=headers, json={
            "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}))
        deadline = time.monotonic() + 120
        while f"slow-started {tag}" not in bastion_http.events_seen():
            assert time.monotonic() < deadline, "the slow call never reached the server"
            assert not call.done(), call.result().text
            await asyncio.sleep(0.1)
        call.cancel()  # closes the request's connection, as a client that goes away does
        with pytest.raises(asyncio.CancelledError):
            await call
    deadline = time.monotonic() + 120
    while f"slow-cancelled {tag}" not in bastion_http.events_seen():
        assert time.monotonic() < deadline, "the server's call ran on after its client left"
        await asyncio.sleep(0.1)


async def test_the_old_http_sse_transport(bastion_http: Served) -> None:
    async with sse_client(f"{bastion_http.base}/sse", headers={IDENTITY_HEADER: "carol"}, timeout=120) as (read, write):
        async with ClientSession(read, write) as session:
            await asyncio.wait_for(session.initialize(), 120)
            tools = await session.list_tools()
            assert f"{SERVER}__test_simple_text" in {t.name for t in tools.tools}
            result = await session.call_tool(f"{SERVER}__test_simple_text", {})
            assert result.content[0].text == "This is a simple text response for testing."


async def test_a_cancelled_calls_post_ends_with_nothing_and_the_call_stops_upstream(bastion_http: Served) -> None:
    """A receiver of a cancellation sends no response: the POST of the call a handshake-era client cancelled ends at
    once, with 202 and no body (or, when its slow answer had become a stream, that stream ends with no response), and
    the session's end later answers nothing for it."""
    tag = "http-cancelled"
    async with httpx2.AsyncClient(timeout=300) as http:
        headers = await open_legacy_session(http, bastion_http.url, "carol")
        call = asyncio.ensure_future(http.post(bastion_http.url, headers=headers, json={
            "jsonrpc": "2.0", "id": 8, "method": "tools/call",
            "params": {"name": f"{SERVER}__test_slow_cancellable", "arguments": {"tag": tag}}}))
        deadline = time.monotonic() + 120
        while f"slow-started {tag}" not in bastion_http.events_seen():
            assert time.monotonic() < deadline, "the slow call never reached the server"
            await asyncio.sleep(0.05)
        cancelled = await http.post(bastion_http.url, headers=headers, json={
            "jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 8}})
        assert cancelled.status_code == 202
        answer = await asyncio.wait_for(call, 120)
        if answer.status_code == 200:  # a slow call's answer had become a stream: it ends with no response in it
            assert answer.headers["content-type"].startswith("text/event-stream")
            # the priming event's data is empty: it carries no message (it only gives the stream an event id)
            frames = [json.loads(line[6:]) for line in answer.text.splitlines()
                      if line.startswith("data: ") and line[6:].strip()]
            assert [f for f in frames if f.get("id") == 8] == []
        else:
            assert answer.status_code == 202 and answer.content == b""
        while f"slow-cancelled {tag}" not in bastion_http.events_seen():
            assert time.monotonic() < deadline, "the server's call was never cancelled"
            await asyncio.sleep(0.05)
        ended = await http.delete(bastion_http.url, headers=headers)
        assert ended.status_code in (200, 204)
