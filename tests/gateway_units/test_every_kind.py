"""Every kind of message, both ways, both eras, both transports, reaches a catch-all interceptor.

Bastion runs as ``bastion run`` (stdio) or ``bastion serve`` (Streamable HTTP) does, with one more interceptor that
declares no filter and no hooks (``tests/fixtures/recording_gateway.py``): the chain must hand it every message of
every kind. The official SDK's client, in each era, drives the SDK fixture server behind it, in each era, through
each kind: the handshake and discovery, pings, lists, calls and their results and errors, the client's
notifications (initialized, roots changed, cancelled), the server's requests to the client (sampling, elicitation,
as requests of their own or inside a 2026-07-28 result) and their answers, and the server's notifications
(log messages, progress, a resource updated, a list changed). A server's ping and its request of a method Bastion
relays to no client, which Bastion answers itself, reach it too (``tests/fixtures/raw_server.py`` sends them), and
are answered as before: ``{}`` and -32601, the policy on or off, with no audit record of a ping."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CreateMessageResult, ElicitResult, ListRootsResult, Root, TextContent

from tests.support import FIXTURES, READY_TIMEOUT, RawClient, raw_server

pytestmark = pytest.mark.slow

DEADLINE = 90.0
HOST = FIXTURES / "recording_gateway.py"
WATCHED = "test://watched-resource"

TO_SERVER, TO_CLIENT = "to_server", "to_client"
MODERN_HEADERS = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
                  "content-type": "application/json"}
REQUEST, NOTIFICATION, RESULT, ERROR = "request", "notification", "result", "error"

# What every combination produces: (direction, kind, method); a request's answer is recorded as its kind "result" or
# "error" on the way back.
EVERY_RUN = {
    (TO_SERVER, REQUEST, "tools/list"), (TO_SERVER, RESULT, "tools/list"),
    (TO_SERVER, REQUEST, "tools/call"), (TO_SERVER, RESULT, "tools/call"), (TO_SERVER, ERROR, "tools/call"),
    (TO_SERVER, REQUEST, "prompts/get"), (TO_SERVER, RESULT, "prompts/get"),
    (TO_SERVER, REQUEST, "resources/read"), (TO_SERVER, ERROR, "resources/read"),
    (TO_CLIENT, REQUEST, "sampling/createMessage"), (TO_CLIENT, RESULT, "sampling/createMessage"),
    (TO_CLIENT, REQUEST, "elicitation/create"), (TO_CLIENT, RESULT, "elicitation/create"),
    (TO_CLIENT, NOTIFICATION, "notifications/message"),
    (TO_CLIENT, NOTIFICATION, "notifications/progress"),
    (TO_CLIENT, NOTIFICATION, "notifications/resources/updated"),
    (TO_CLIENT, NOTIFICATION, "notifications/tools/list_changed"),
}
HANDSHAKE_CLIENT = {
    (TO_SERVER, REQUEST, "initialize"), (TO_SERVER, RESULT, "initialize"),
    (TO_SERVER, NOTIFICATION, "notifications/initialized"),
    (TO_SERVER, REQUEST, "ping"), (TO_SERVER, RESULT, "ping"),
    (TO_SERVER, REQUEST, "logging/setLevel"),
    (TO_SERVER, REQUEST, "resources/subscribe"), (TO_SERVER, RESULT, "resources/subscribe"),
    (TO_SERVER, NOTIFICATION, "notifications/roots/list_changed"),
    (TO_SERVER, NOTIFICATION, "notifications/cancelled"),
}
MODERN_CLIENT = {
    (TO_SERVER, REQUEST, "server/discover"), (TO_SERVER, RESULT, "server/discover"),
    (TO_SERVER, REQUEST, "subscriptions/listen"),
}


# The raw fixture server's tool that sends the client a request of the method it is given, and answers with the
# answer it got; read-only from a trusted server, so the default policy lets it be called without a person.
ASK = {"name": "ask", "description": "Send the client a request", "annotations": {"readOnlyHint": True},
       "inputSchema": {"type": "object", "properties": {"method": {"type": "string"}}}}
UNRELAYED = "bastion-test/not-relayed"  # a method Bastion relays to no client


async def on_sampling(context: Any, params: Any) -> CreateMessageResult:
    return CreateMessageResult(role="assistant", content=TextContent(type="text", text="sampled"), model="m")


async def on_elicitation(context: Any, params: Any) -> ElicitResult:
    return ElicitResult(action="accept", content={"response": "yes"})


async def on_roots(context: Any) -> ListRootsResult:
    return ListRootsResult(roots=[Root(uri="file:///tmp", name="tmp")])


def write_config(tmp: Path, server_era: str) -> Path:
    config = tmp / "bastion.json"
    config.write_text(json.dumps({"policy": "off", "tools": {"exposure": "all"}, "ready_timeout": READY_TIMEOUT,
                                  "servers": {"fx": {
                                      "command": sys.executable, "args": [str(FIXTURES / "sdk_server.py")],
                                      "era": server_era, "env": {"FIXTURE_EVENTS": str(tmp / "events.log")},
                                      "request_timeout": 900, "sandbox": "none"}}}))
    return config


async def start_http(tmp: Path, config: Path, record: Path) -> tuple[subprocess.Popen, str]:
    stderr = tmp / "bastion.stderr"
    process = subprocess.Popen([sys.executable, str(HOST), "http", str(config), str(record)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr.open("wb"),
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    with anyio.fail_after(120):
        while not (found := re.search(r"serving MCP on (http://[^ ]+/mcp)", stderr.read_text())):
            assert process.poll() is None, f"the gateway exited: {stderr.read_text()}"
            await anyio.sleep(0.05)
    return process, found.group(1)


async def wait_for_event(events: Path, line: str) -> None:
    while line not in (events.read_text().splitlines() if events.exists() else []):
        await anyio.sleep(0.02)


async def exercise(client: Client, mode: str, events: Path) -> None:
    await client.list_tools()
    await client.call_tool("fx__test_tool_with_logging", {})
    progress: list[float] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(done)

    await client.call_tool("fx__test_tool_with_progress", {}, progress_callback=on_progress)
    sampled = await client.call_tool("fx__test_sampling", {"prompt": "2+2?"})
    assert "sampled" in sampled.content[0].text  # type: ignore[union-attr]
    await client.call_tool("fx__test_elicitation", {"message": "Proceed?"})
    await client.get_prompt("fx__test_simple_prompt")
    with pytest.raises(Exception):
        await client.read_resource("test://no-such-resource")
    with pytest.raises(Exception, match="Unknown tool"):
        await client.call_tool("fx__no_such_tool", {})
    if mode == "legacy":
        await client.send_ping()
        await client.set_logging_level("debug")
        await client.subscribe_resource(WATCHED)
        await client.call_tool("fx__test_touch_watched_resource", {})
        await client.call_tool("fx__test_add_dynamic_tool", {})
        await client.send_roots_list_changed()
        async with anyio.create_task_group() as group:
            group.start_soon(client.call_tool, "fx__test_slow_cancellable", {"tag": "every-kind"})
            await wait_for_event(events, "slow-started every-kind")
            group.cancel_scope.cancel()
        await wait_for_event(events, "slow-cancelled every-kind")  # the cancel reached the server
    else:
        async with client.listen(tools_list_changed=True, resource_subscriptions=[WATCHED]):
            await client.call_tool("fx__test_touch_watched_resource", {})
            await client.call_tool("fx__test_add_dynamic_tool", {})


def recorded(record: Path) -> set[tuple[str, str, str]]:
    return {(direction, kind, method) for direction, kind, method, _ in map(json.loads, record.read_text().splitlines())}


@pytest.mark.parametrize("server_era", ["legacy", "modern"])
# "auto": the client discovers first (server/discover), then speaks 2026-07-28.
@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_every_kind_of_message_reaches_a_catch_all_interceptor(tmp_path: Path, transport: str, mode: str,
                                                                     server_era: str) -> None:
    config = write_config(tmp_path, server_era)
    record = tmp_path / "record.jsonl"
    events = tmp_path / "events.log"
    callbacks: dict[str, Any] = {"mode": mode, "sampling_callback": on_sampling, "elicitation_callback": on_elicitation,
                                 "list_roots_callback": on_roots, "log_level": "debug" if mode != "legacy" else None}
    expected = EVERY_RUN | (HANDSHAKE_CLIENT if mode == "legacy" else MODERN_CLIENT)
    if mode != "legacy" and server_era == "legacy":
        # The handshake-era server's question reaches the 2026-07-28 client as input_required; the client's retry with
        # its answers continues the call, and passes the chain too.
        expected = expected | {(TO_SERVER, "continuing request", "tools/call")}
    seen: set[tuple[str, str, str]] = set()
    process = None
    try:
        if transport == "stdio":
            client = Client(StdioServerParameters(command=sys.executable, args=[str(HOST), "stdio", str(config),
                                                                                str(record)]), **callbacks)
        else:
            process, url = await start_http(tmp_path, config, record)
            http = httpx2.AsyncClient(timeout=httpx2.Timeout(120, read=300))
            client = Client(streamable_http_client(url, http_client=http), **callbacks)
        with anyio.fail_after(DEADLINE):
            async with client:
                assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
                await exercise(client, mode, events)
                if transport == "http" and mode != "legacy":
                    # A 2026-07-28 client's notification is a POST of its own.
                    posted = await http.post(url, headers=MODERN_HEADERS, json={
                        "jsonrpc": "2.0", "method": "notifications/roots/list_changed"})
                    assert posted.status_code == 202
                    expected = expected | {(TO_SERVER, NOTIFICATION, "notifications/roots/list_changed")}
                # The last notifications of the server's may still be on their way through the chain.
                while not expected <= (seen := recorded(record)):
                    await anyio.sleep(0.05)
    except TimeoutError:
        seen = recorded(record) if record.exists() else set()
        raise AssertionError(f"never reached the catch-all interceptor: {sorted(expected - seen)}") from None
    finally:
        if process is not None:
            process.terminate()
            process.wait(60)
    assert expected <= seen


def asking_config(tmp: Path, policy: Any) -> Path:
    config = tmp / "bastion.json"
    server = raw_server(trust="trusted", sandbox="none", env={"RAW_SERVER_EXTRA_TOOLS": json.dumps([ASK])})
    config.write_text(json.dumps({"policy": policy, "tools": {"exposure": "all"}, "ready_timeout": READY_TIMEOUT,
                                  "servers": {"raw": server}}))
    return config


def answer_to(result: Any) -> dict[str, Any]:
    """What the server that asked was answered (the ``ask`` tool's result)."""
    return json.loads(result.content[0].text)


async def test_a_servers_ping_and_a_method_relayed_to_no_client_reach_a_catch_all_interceptor(tmp_path: Path) -> None:
    """Bastion answers both itself (nothing reaches a client), after the chain: the server gets ``{}`` and -32601 as
    before, and the interceptor that declares nothing sees each on its way in and its answer on its way back."""
    record = tmp_path / "record.jsonl"
    config = asking_config(tmp_path, "off")
    client = Client(StdioServerParameters(command=sys.executable, args=[str(HOST), "stdio", str(config), str(record)]),
                    mode="legacy")
    with anyio.fail_after(DEADLINE):
        async with client:
            pinged = answer_to(await client.call_tool("raw__ask", {"method": "ping"}))
            unrelayed = answer_to(await client.call_tool("raw__ask", {"method": UNRELAYED}))
    assert pinged["result"] == {} and "error" not in pinged
    assert unrelayed["error"] == {"code": -32601, "message": f"Method not found: {UNRELAYED}"}
    # The interceptor wrote each line before the server was answered, and the server answered the call after it
    # got its answer: the record is complete once the call's result is in.
    seen = [tuple(line) for line in map(json.loads, record.read_text().splitlines())]
    assert (TO_CLIENT, REQUEST, "ping", "raw") in seen and (TO_CLIENT, RESULT, "ping", "raw") in seen
    assert (TO_CLIENT, REQUEST, UNRELAYED, "raw") in seen and (TO_CLIENT, ERROR, UNRELAYED, "raw") in seen
    # The ping came within the call that made the server send it: after the call's way in, before its answer.
    call, answer = (seen.index((TO_SERVER, kind, "tools/call", None)) for kind in (REQUEST, RESULT))
    assert call < seen.index((TO_CLIENT, REQUEST, "ping", "raw")) < seen.index((TO_CLIENT, RESULT, "ping", "raw"))
    assert seen.index((TO_CLIENT, RESULT, "ping", "raw")) < answer


def test_with_the_default_policy_a_servers_ping_is_answered_and_never_audited(tmp_path: Path) -> None:
    """The policy decides nothing about a request no client is asked: a ping is answered ``{}`` with no audit record
    (keep-alives would flood the trail), and a method relayed to no client is answered -32601, not refused by the
    policy, with the call record of that answer."""
    audit = tmp_path / "audit.jsonl"
    client = RawClient(asking_config(tmp_path, {"audit": {"path": str(audit)}}))  # no policy files: the default
    try:
        client.initialize()
        pinged = client.request(1, "tools/call", {"name": "raw__ask", "arguments": {"method": "ping"}}, timeout=60)
        unrelayed = client.request(2, "tools/call", {"name": "raw__ask", "arguments": {"method": UNRELAYED}})
    finally:
        code, stderr = client.close()  # the trail is flushed when Bastion exits
    assert code == 0, stderr
    assert json.loads(pinged["result"]["content"][0]["text"])["result"] == {}
    assert json.loads(unrelayed["result"]["content"][0]["text"])["error"]["code"] == -32601
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    by_method: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_method.setdefault(r.get("what", {}).get("method"), []).append(r)
    assert [r["outcome"] for r in by_method["tools/call"] if r["kind"] == "call"] == ["complete", "complete"]
    assert "ping" not in by_method
    assert [(r["kind"], r["outcome"], r["what"]["target"]) for r in by_method[UNRELAYED]] == [("call", -32601, "raw")]
