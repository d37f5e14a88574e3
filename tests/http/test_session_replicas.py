"""A handshake-era session made on one replica continues on another: two gateways, each with its own server
processes and its HTTP frontend on uvicorn on 127.0.0.1, sharing one store (the in-memory one, told it is shared, as
a Redis store is), behind a loopback forwarder that a test points at one replica, then the other."""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from bastion.compose import build_gateway
from bastion.config import GatewayConfig, HttpConfig
from bastion.frontends.http.app import HttpFrontend
from bastion.frontends.http.quotas import Holder
from bastion.frontends.http import answers
from bastion.frontends.http.records import PENDING_KEY, RECORD_KEY, KeyRing, SessionRecord, SessionRecords
from bastion.state import MemoryStore
from bastion.state.redis_store import RedisStore
from tests.auth.test_resource_server_frontend import serve
from tests.http.conftest import IDENTITY_HEADER, SERVER
from tests.http.forwarder import Forwarder
from tests.redis_server import RedisServer, redis_available
from tests.support import FIXTURES, READY_TIMEOUT

TEXT_TOOL = f"{SERVER}__test_simple_text"
TEXT = "This is a simple text response for testing."


class CountingStore(MemoryStore):
    """The in-memory store, counting what is asked of it; ``shared`` as a replica's store would say."""

    def __init__(self, shared: bool) -> None:
        super().__init__()
        self._shared = shared
        self.puts = 0
        self.gets = 0

    @property
    def shared(self) -> bool:
        return self._shared

    async def put(self, key: str, value: bytes, seconds: float | None = None) -> None:
        self.puts += 1
        await super().put(key, value, seconds)

    async def get(self, key: str) -> bytes | None:
        self.gets += 1
        return await super().get(key)


@dataclass
class Replica:
    frontend: HttpFrontend
    base: str


@dataclass
class Replicas:
    a: Replica
    b: Replica
    store: CountingStore
    balancer: Forwarder

    @property
    def url(self) -> str:
        return f"{self.balancer.url}/mcp"

    def to(self, replica: Replica, *, drain: bool = True) -> None:
        self.balancer.point_at(replica.base, drain=drain)


def config(tmp: Path, http: dict[str, Any], era: str | None = None) -> GatewayConfig:
    return GatewayConfig.model_validate({
        "policy": "off", "tools": {"exposure": "all"}, "ready_timeout": READY_TIMEOUT, "http": http,
        "servers": {SERVER: {"command": sys.executable, "args": [str(FIXTURES / "sdk_server.py")],
                             **({"era": era} if era is not None else {}),
                             "env": {"FIXTURE_EVENTS": str(tmp / "events.log")}, "sandbox": {"writable": [str(tmp)]}}}})


async def start_replicas(tmp: Path, *, shared: bool = True, http: dict[str, Any] | None = None,
                         keys: tuple[KeyRing | None, KeyRing | None] | None = None,
                         store: Any = None, era: str | None = None) -> AsyncIterator[Replicas]:
    store = store or CountingStore(shared)
    ring = KeyRing([secrets.token_bytes(32)])
    keys = keys or (ring, ring)
    settings = {"identity_header": IDENTITY_HEADER, **(http or {})}
    started: list[tuple[Any, Any, Any, Replica]] = []
    try:
        for key_ring in keys:
            gateway = build_gateway(config(tmp, settings, era))
            gateway.state = store
            gateway.start()
            frontend = HttpFrontend(gateway, HttpConfig(**settings), bound_to_loopback=True, session_keys=key_ring)
            frontend.start()
            server, task, base = await serve(frontend)
            started.append((gateway, server, task, Replica(frontend, base)))
        first, second = started[0][3], started[1][3]
        balancer = await Forwarder(first.base).start()
        try:
            yield Replicas(first, second, store, balancer)
        finally:
            await balancer.close()
    finally:
        for gateway, server, task, replica in started:
            await replica.frontend.stop()
            server.should_exit = True
            await task
            await gateway.close()


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[Replicas]:
    async for made in start_replicas(tmp_path):
        yield made


async def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def fresh_connections(**options: Any) -> httpx2.AsyncClient:
    """A client whose every request opens a connection, so that each goes where the balancer points now."""
    return httpx2.AsyncClient(timeout=httpx2.Timeout(120, read=300), limits=httpx2.Limits(max_keepalive_connections=0),
                              **options)


def headers_for(identity: str) -> dict[str, str]:
    return {IDENTITY_HEADER: identity, "accept": "application/json, text/event-stream"}


async def initialize(http: httpx2.AsyncClient, url: str, version: str, identity: str = "alice",
                     capabilities: dict[str, Any] | None = None) -> dict[str, str]:
    init = await http.post(url, headers=headers_for(identity), json={
        "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": capabilities or {"roots": {}},
            "clientInfo": {"name": "raw", "version": "7"}}})
    assert init.status_code == 200, init.text
    return {**headers_for(identity), "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": version}


def answer(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC answer in a POST's response, whether JSON or an SSE stream."""
    if response.headers["content-type"].startswith("text/event-stream"):
        frames = [line[6:] for line in response.text.splitlines() if line.startswith("data: ") and line[6:].strip()]
        return [f for f in map(json.loads, frames) if "id" in f][-1]
    return response.json()


@pytest.mark.parametrize("version", ("2025-11-25", "2025-06-18", "2025-03-26"))
async def test_a_session_made_on_one_replica_continues_on_the_other_and_ends_everywhere(
        replicas: Replicas, version: str) -> None:
    async with fresh_connections() as http:
        headers = await initialize(http, replicas.url, version)
        session_id = headers["mcp-session-id"]
        # Initialized and a log level said on A (a change each, written to the record), then a call on A.
        assert (await http.post(replicas.url, headers=headers, json={
            "jsonrpc": "2.0", "method": "notifications/initialized"})).status_code == 202
        level = await http.post(replicas.url, headers=headers, json={
            "jsonrpc": "2.0", "id": 1, "method": "logging/setLevel", "params": {"level": "error"}})
        assert "result" in answer(level), level.text
        assert session_id in replicas.a.frontend.sessions and session_id not in replicas.b.frontend.sessions

        replicas.to(replicas.b)
        listed = answer(await http.post(replicas.url, headers=headers, json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        assert TEXT_TOOL in {tool["name"] for tool in listed["result"]["tools"]}
        called = answer(await http.post(replicas.url, headers=headers, json={
            "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": TEXT_TOOL, "arguments": {}}}))
        assert called["result"]["content"][0]["text"] == TEXT
        taken_up = replicas.b.frontend.sessions[session_id]
        protocol = taken_up.connection.protocol
        assert (protocol.protocol_version, protocol.log_level, protocol.initialized) == (version, "error", True)
        assert protocol.client_info == {"name": "raw", "version": "7"}
        assert protocol.client_capabilities == {"roots": {}}

        # DELETE on B ends it on A too: A drops its copy, and A answers the id as unknown.
        assert (await http.delete(replicas.url, headers=headers)).status_code == 200
        await until(lambda: session_id not in replicas.a.frontend.sessions, "A kept a session ended on B")
        replicas.to(replicas.a)
        gone = await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "id": 4, "method": "ping"})
        assert gone.status_code == 404
        assert await replicas.store.get(RECORD_KEY + session_id) is None


async def test_a_handshake_ended_on_another_replica_is_known_to_the_replica_that_began_it(
        replicas: Replicas) -> None:
    """Round robin sends initialize to one replica and notifications/initialized to the next: the first replica's
    own copy of the session learns it from the record, and a log level set through B is not written back over by
    A's copy when A refreshes the record."""
    async with fresh_connections() as http:
        headers = await initialize(http, replicas.url, "2025-11-25")
        session_id = headers["mcp-session-id"]
        replicas.to(replicas.b)
        assert (await http.post(replicas.url, headers=headers, json={
            "jsonrpc": "2.0", "method": "notifications/initialized"})).status_code == 202
        level = await http.post(replicas.url, headers=headers, json={
            "jsonrpc": "2.0", "id": 1, "method": "logging/setLevel", "params": {"level": "critical"}})
        assert "result" in answer(level), level.text
        replicas.to(replicas.a)
        listed = await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "id": 2,
                                                                      "method": "tools/list"})
        assert "result" in answer(listed), listed.text
        began = replicas.a.frontend.sessions[session_id].connection.protocol
        assert (began.initialized, began.log_level) == (True, "critical")
        record = await replicas.a.frontend.records.load(session_id)
        assert (record.initialized, record.log_level) == (True, "critical")


async def test_an_sdk_client_whose_requests_land_on_another_replica_keeps_its_session(replicas: Replicas) -> None:
    http = fresh_connections(headers={IDENTITY_HEADER: "alice"})
    async with Client(streamable_http_client(replicas.url, http_client=http), mode="legacy") as client:
        assert TEXT_TOOL in {tool.name for tool in (await client.list_tools()).tools}
        (session_id,) = replicas.a.frontend.sessions
        replicas.to(replicas.b)
        result = await client.call_tool(TEXT_TOOL, {})
        assert result.content[0].text == TEXT
        assert session_id in replicas.b.frontend.sessions
        replicas.to(replicas.a)
        result = await client.call_tool(TEXT_TOOL, {})
        assert result.content[0].text == TEXT


async def test_another_caller_presenting_the_id_on_another_replica_finds_no_session(replicas: Replicas) -> None:
    async with fresh_connections() as http:
        headers = await initialize(http, replicas.url, "2025-11-25")
        await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        replicas.to(replicas.b)
        stolen = await http.post(replicas.url, headers={**headers, IDENTITY_HEADER: "mallory"},
                                 json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert stolen.status_code == 404
        assert headers["mcp-session-id"] not in replicas.b.frontend.sessions
        # Ids this gateway never makes are looked up nowhere: a ":" or "*" never reaches a store key.
        gets = replicas.store.gets
        for forged in ("a:*", "*", "x" * 31 + ":", "http-session:" + "a" * 32, ("é" * 16).encode()):
            refused = await http.post(replicas.url, headers={**headers, "mcp-session-id": forged},
                                      json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert refused.status_code in (400, 404), forged
        assert replicas.store.gets == gets
        # The owner still has it, on either replica.
        ping = await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "id": 2, "method": "ping"})
        assert answer(ping) == {"jsonrpc": "2.0", "id": 2, "result": {}}


async def test_a_session_in_use_is_not_rewritten_on_every_request(replicas: Replicas) -> None:
    async with fresh_connections() as http:
        headers = await initialize(http, replicas.url, "2025-11-25")
        await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        replicas.to(replicas.b)
        before = replicas.store.puts
        for request_id in range(1, 21):
            ping = await http.post(replicas.url, headers=headers, json={
                "jsonrpc": "2.0", "id": request_id, "method": "ping"})
            assert ping.status_code == 200
        assert replicas.store.puts - before <= 1  # a refresh, at most, within the refresh interval


async def test_with_the_memory_store_nothing_is_written(tmp_path: Path) -> None:
    async for replicas in start_replicas(tmp_path, shared=False):
        async with fresh_connections() as http:
            headers = await initialize(http, replicas.url, "2025-11-25")
            await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            ping = await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert ping.status_code == 200
            assert replicas.a.frontend.records is None
            assert replicas.store.puts == 0 and replicas.store.gets == 0
            replicas.to(replicas.b)  # without a shared store a session stays where it was made
            elsewhere = await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "id": 2, "method": "ping"})
            assert elsewhere.status_code == 404


async def test_the_quota_of_an_identity_holds_across_replicas(tmp_path: Path) -> None:
    async for replicas in start_replicas(tmp_path, http={"max_sessions_per_identity": 2}):
        async with fresh_connections() as http:
            first = await initialize(http, replicas.url, "2025-11-25")
            replicas.to(replicas.b)
            await initialize(http, replicas.url, "2025-11-25")
            replicas.to(replicas.a)
            third = await http.post(replicas.url, headers=headers_for("alice"), json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
            assert third.status_code == 429, third.text
            assert third.json()["error"]["data"]["setting"] == "http.max_sessions_per_identity"
            # Another identity is not held to alice's count; alice's session ended on B frees her place on A.
            await initialize(http, replicas.url, "2025-11-25", identity="bob")
            replicas.to(replicas.b)
            assert (await http.delete(replicas.url, headers=first)).status_code == 200
            replicas.to(replicas.a)
            await initialize(http, replicas.url, "2025-11-25")


async def test_a_record_opens_with_any_key_of_the_ring_until_it_is_retired_and_never_past_its_expiry() -> None:
    old, new = secrets.token_bytes(32), secrets.token_bytes(32)
    store = MemoryStore()
    record = SessionRecord(["alice", [], "header", None], Holder(("identity", "header", "", "alice"), "alice",
                                                                 "http.max_sessions_per_identity", 5),
                           "2025-11-25", {}, None, True, None)
    session_id = "A" * 32
    await SessionRecords(store, KeyRing([old]), 60).save(session_id, record)
    assert await SessionRecords(store, KeyRing([new, old]), 60).load(session_id) == record  # rotated: still read
    assert await SessionRecords(store, KeyRing([new]), 60).load(session_id) is None  # old key retired
    # Moved to another id, or altered, it does not open.
    sealed = await store.get(RECORD_KEY + session_id)
    assert sealed is not None
    await store.put(RECORD_KEY + "B" * 32, sealed)
    assert await SessionRecords(store, KeyRing([old]), 60).load("B" * 32) is None
    await store.put(RECORD_KEY + session_id, sealed[:-1] + bytes([sealed[-1] ^ 1]))
    assert await SessionRecords(store, KeyRing([old]), 60).load(session_id) is None
    # Kept past its expiry (by a store that did not expire it, or a copy put back), it is refused.
    ring = KeyRing([old])
    await store.put(RECORD_KEY + session_id, ring.seal(record.encode(), session_id.encode(), time.time() - 1))
    assert await SessionRecords(store, ring, 60).load(session_id) is None
    await store.aclose()


def test_a_key_file_that_is_not_a_key_is_refused_naming_the_file(tmp_path: Path) -> None:
    short = tmp_path / "short.key"
    short.write_text("abcd")
    with pytest.raises(ValueError, match="short.key does not hold a key of 64 hex digits"):
        KeyRing.from_files(["short.key"], tmp_path)
    with pytest.raises(ValueError, match="cannot read"):
        KeyRing.from_files(["missing.key"], tmp_path)
    good = tmp_path / "good.key"
    good.write_text(secrets.token_hex(32) + "\n")
    ring = KeyRing.from_files(["good.key"], tmp_path)
    assert ring.open(ring.seal(b"x", b"id", time.time() + 5), b"id", time.time()) == b"x"


async def test_a_call_whose_replica_stopped_is_answered_on_resume_with_an_unknown_outcome(replicas: Replicas) -> None:
    async with fresh_connections() as http:
        headers = await initialize(http, replicas.url, "2025-11-25")
        await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        primed = None
        async with http.stream("POST", replicas.url, headers=headers, json={
                "jsonrpc": "2.0", "id": 41, "method": "tools/call",
                "params": {"name": f"{SERVER}__test_slow_cancellable", "arguments": {"tag": "replica-stops"}}}) as call:
            assert call.headers["content-type"].startswith("text/event-stream")
            async for line in call.aiter_lines():
                if line.startswith("id: "):
                    primed = line[4:]
                    break
            # The replica running the call stops (as one killed does, for the client: its stream ends unanswered).
            await replicas.a.frontend.stop()
        assert primed is not None and primed.endswith(".0")
        replicas.to(replicas.b)
        resumed = await http.get(replicas.url, headers={**headers, "last-event-id": primed})
        assert resumed.status_code == 200, resumed.text
        (error,) = [json.loads(line[6:]) for line in resumed.text.splitlines() if line.startswith("data: {")]
        assert error["id"] == 41 and error["error"]["data"] == {"outcome": "unknown"}
        # Told once: the same resume again finds nothing to resume, and the session goes on on B.
        again = await http.get(replicas.url, headers={**headers, "last-event-id": primed})
        assert again.status_code == 400
        ping = await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "id": 42, "method": "ping"})
        assert answer(ping) == {"jsonrpc": "2.0", "id": 42, "result": {}}


async def _the_rest(lines: Any) -> list[str]:
    return [line async for line in lines]


async def test_a_cancellation_posted_to_another_replica_cancels_the_call_where_it_runs(replicas: Replicas) -> None:
    async with fresh_connections() as http:
        headers = await initialize(http, replicas.url, "2025-11-25")
        await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        async with http.stream("POST", replicas.url, headers=headers, json={
                "jsonrpc": "2.0", "id": 51, "method": "tools/call",
                "params": {"name": f"{SERVER}__test_slow_cancellable", "arguments": {"tag": "cancel-elsewhere"}}}) as call:
            lines = aiter(call.aiter_lines())
            async for line in lines:
                if line.startswith("id: "):
                    break  # the call runs on A, its stream open
            (session_id,) = replicas.a.frontend.sessions
            replicas.to(replicas.b, drain=False)
            sent = await http.post(replicas.url, headers=headers, json={
                "jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 51}})
            assert sent.status_code == 202
            rest = await asyncio.wait_for(_the_rest(lines), READY_TIMEOUT)  # the bound of a cancellation lost
        # A's POST ends with no answer (as a cancelled call's does on one replica), and A holds nothing of it.
        assert not any(line.startswith("data: {") for line in rest), rest
        assert 51 not in replicas.a.frontend.sessions[session_id].exchanges


class AnswerDuringRecord(CountingStore):
    """Holds the write that records a call's answer stream as pending until the call's answer has come: the
    moment a loaded Redis round trip gives an answer to arrive in."""

    def __init__(self) -> None:
        super().__init__(shared=True)
        self.frontends: list[HttpFrontend] = []
        self.held = 0

    async def map_put(self, key: str, values: dict[str, bytes], seconds: float | None = None) -> None:
        if key.startswith(PENDING_KEY):
            session_id = key[len(PENDING_KEY):]
            (stream_key,) = values
            (exchange,) = [f.sessions[session_id].resumable[stream_key] for f in self.frontends
                           if session_id in f.sessions and stream_key in f.sessions[session_id].resumable]
            await until(exchange.first.done, "the call's answer never came")
            self.held += 1
        await super().map_put(key, values, seconds)


async def test_an_answer_that_comes_while_its_stream_is_recorded_is_sent_on_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the soak through HAProxy under load: the answer of a call that had just become a resumable stream
    arrived during the store write recording it, and the stream ended after its priming event with no answer."""
    monkeypatch.setattr(answers, "STREAM_AFTER_SECONDS", 0.0)  # every call's answer is a stream: no race to win
    store = AnswerDuringRecord()
    async for replicas in start_replicas(tmp_path, store=store):
        store.frontends = [replicas.a.frontend, replicas.b.frontend]
        async with fresh_connections() as http:
            headers = await initialize(http, replicas.url, "2025-11-25")
            await http.post(replicas.url, headers=headers,
                            json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            called = await http.post(replicas.url, headers=headers, json={
                "jsonrpc": "2.0", "id": 61, "method": "tools/call", "params": {"name": TEXT_TOOL, "arguments": {}}})
            assert called.headers["content-type"].startswith("text/event-stream")
            assert answer(called)["result"]["content"][0]["text"] == TEXT
        assert store.held == 1


async def test_the_answer_to_a_replicas_question_posted_to_another_replica_reaches_it(replicas: Replicas) -> None:
    async with fresh_connections() as http:
        headers = await initialize(http, replicas.url, "2025-11-25", capabilities={"sampling": {}})
        await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        frames = []
        async with http.stream("POST", replicas.url, headers=headers, json={
                "jsonrpc": "2.0", "id": 51, "method": "tools/call",
                "params": {"name": f"{SERVER}__test_sampling", "arguments": {"prompt": "hello"}}}) as call:
            lines = call.aiter_lines()
            async for line in lines:
                if line.startswith("data: {"):
                    frame = json.loads(line[6:])
                    if frame.get("method") == "sampling/createMessage":
                        break
            assert frame.get("method") == "sampling/createMessage", frame
            # The client's answer goes through the balancer, which now sends new connections to B.
            replicas.to(replicas.b, drain=False)
            async with fresh_connections() as other:
                relayed = await other.post(replicas.url, headers=headers, json={
                    "jsonrpc": "2.0", "id": frame["id"], "result": {
                        "role": "assistant", "content": {"type": "text", "text": "from the client"},
                        "model": "m"}})
                assert relayed.status_code == 202, relayed.text
            async for line in lines:  # the call's stream, still on A, gets the call's answer
                if line.startswith("data: {"):
                    frames.append(json.loads(line[6:]))
                    if frames[-1].get("id") == 51:
                        break
        assert frames[-1]["result"]["content"][0]["text"] == "LLM response: from the client"


async def test_a_get_stream_open_on_one_replica_hears_another_and_resumes_on_either(replicas: Replicas) -> None:
    """Messages for the GET stream go through the session's log in the store: a stream open on B hears what A's
    copy of the session sends, numbered there, and a client resuming with Last-Event-ID on A gets what it missed."""
    a, b = f"{replicas.a.base}/mcp", f"{replicas.b.base}/mcp"
    async with fresh_connections() as http:
        headers = await initialize(http, a, "2025-11-25")
        await http.post(a, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        json_only = {**headers, "accept": "application/json"}  # so that the call's logs go to the GET stream
        heard: list[tuple[int, dict[str, Any]]] = []
        async with http.stream("GET", b, headers={**headers, "accept": "text/event-stream"}) as stream:
            assert stream.status_code == 200
            call = asyncio.ensure_future(http.post(a, headers=json_only, json={
                "jsonrpc": "2.0", "id": 61, "method": "tools/call",
                "params": {"name": f"{SERVER}__test_tool_with_logging", "arguments": {}}}))
            event_id = None
            async for line in stream.aiter_lines():
                if line.startswith("id: "):
                    event_id = int(line[4:])
                elif line.startswith("data: {") and event_id is not None:
                    frame = json.loads(line[6:])
                    if frame.get("method") == "notifications/message":  # (a list change may come first)
                        heard.append((event_id, frame))
                        break  # the client's GET stream drops after the call's first message
        assert heard and heard[0][1]["method"] == "notifications/message"
        answered = await call
        assert answered.json()["result"]["content"][0]["text"] == "Tool with logging executed successfully"
        # Back on A with the last id it saw: the rest of the call's messages, none twice.
        async with http.stream("GET", a, headers={**headers, "accept": "text/event-stream",
                                                  "last-event-id": str(heard[0][0])}) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("id: "):
                    event_id = int(line[4:])
                elif line.startswith("data: {"):
                    frame = json.loads(line[6:])
                    if frame.get("method") == "notifications/message":
                        heard.append((event_id, frame))
                        if len(heard) == 3:
                            break
        numbers = [number for number, _ in heard]
        assert numbers == sorted(set(numbers)), numbers  # in order, none twice
        assert len({json.dumps(frame["params"]) for _, frame in heard}) == 3


async def test_a_listen_stream_stays_on_its_replica_while_the_clients_requests_go_to_another(
        replicas: Replicas) -> None:
    """2026-07-28: the client's listen stream is held by A, its other requests are served by B (each request
    stands alone); what A's servers announce still reaches the stream on A. (What B's servers announce reaches B's
    listen streams only: docs/http.md, Sessions across replicas.)"""
    from tests.http.test_listen import modern_headers
    from tests.http.test_sdk_clients import MODERN_META

    async with fresh_connections() as http:
        listen = {"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen",
                  "params": {"notifications": {"toolsListChanged": True}, "_meta": MODERN_META}}
        async with http.stream("POST", replicas.url, headers=modern_headers("subscriptions/listen"),
                               json=listen) as stream:
            lines = stream.aiter_lines()

            async def next_message() -> dict:
                async for line in lines:
                    if line.startswith("data: "):
                        return json.loads(line[6:])
                raise AssertionError("the listen stream ended")

            assert (await next_message())["method"] == "notifications/subscriptions/acknowledged"
            replicas.to(replicas.b, drain=False)  # the stream stays on A; the client's next requests reach B
            listed = await http.post(replicas.url, headers=modern_headers("tools/list"), json={
                "jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": MODERN_META}})
            assert TEXT_TOOL in {tool["name"] for tool in listed.json()["result"]["tools"]}
            assert replicas.b.frontend.modern.connections == set()  # served and gone: nothing held on B
            # A's server changes its list (another client's call on A): the stream on A says so.
            tool = f"{SERVER}__test_add_dynamic_tool"
            added = await http.post(f"{replicas.a.base}/mcp", headers=modern_headers("tools/call", tool), json={
                "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
                    "name": tool, "arguments": {}, "_meta": MODERN_META}})
            assert "result" in added.json()
            changed = await next_message()
            assert changed["method"] == "notifications/tools/list_changed"
            assert changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "listen-1"


@pytest.mark.skipif(not redis_available(), reason="redis-server is not installed (scripts/setup.sh)")
async def test_with_redis_gone_a_replica_serves_its_own_copies_refuses_what_needs_redis_and_recovers(
        tmp_path: Path) -> None:
    redis = RedisServer().start()
    store = RedisStore(redis.url, key_prefix=f"t{secrets.token_hex(4)}:", timeout=1)
    try:
        async for replicas in start_replicas(tmp_path, store=store):
            async with fresh_connections() as http:
                headers = await initialize(http, replicas.url, "2025-11-25")
                await http.post(replicas.url, headers=headers, json={
                    "jsonrpc": "2.0", "method": "notifications/initialized"})
                redis.stop()
                # A's own copy, its refresh due: served, the refresh tried and given up for now.
                replicas.a.frontend.sessions[headers["mcp-session-id"]].saved_at = 0.0
                ping = await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
                assert answer(ping) == {"jsonrpc": "2.0", "id": 1, "result": {}}
                # What needs Redis is refused, saying why: a new session (its quota), a session taken up on B.
                refused = await http.post(replicas.url, headers=headers_for("bob"), json={
                    "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "r", "version": "1"}}})
                assert refused.status_code == 503 and "cannot be" in refused.json()["error"]["message"]
                replicas.to(replicas.b)
                elsewhere = await http.post(replicas.url, headers=headers, json={
                    "jsonrpc": "2.0", "id": 2, "method": "ping"})
                assert elsewhere.status_code == 503
                assert "shared state cannot be reached" in elsewhere.json()["error"]["message"]
                # Redis back, no replica restarted: B answers from the store again (the session, or, if this Redis
                # kept nothing over its restart, an unknown session), and a new session moves between them.
                redis.start()
                after = await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "id": 3, "method": "ping"})
                assert after.status_code in (200, 404), after.text
                fresh = await initialize(http, replicas.url, "2025-11-25", identity="bob")
                replicas.to(replicas.a)
                moved = await http.post(replicas.url, headers=fresh, json={"jsonrpc": "2.0", "id": 4, "method": "ping"})
                assert answer(moved) == {"jsonrpc": "2.0", "id": 4, "result": {}}
    finally:
        redis.close()


async def test_a_2026_retry_with_input_responses_landing_on_another_replica_continues_the_call(
        tmp_path: Path) -> None:
    """A handshake-era server asks for sampling during a 2026-07-28 client's call on A: the client is answered
    input_required, and its retry (inputResponses, requestState) reaches B, which relays it to A, where the call
    waits; the call's answer comes back through B."""
    from mcp.types import CreateMessageResult, TextContent

    async for replicas in start_replicas(tmp_path, era="legacy"):
        async def on_sampling(context: Any, params: Any) -> CreateMessageResult:
            replicas.to(replicas.b)  # the retry that carries this answer lands on B
            return CreateMessageResult(role="assistant", content=TextContent(type="text", text="four"), model="m")

        http = fresh_connections(headers={IDENTITY_HEADER: "alice"})
        async with Client(streamable_http_client(replicas.url, http_client=http), mode="2026-07-28",
                          sampling_callback=on_sampling) as client:
            result = await client.call_tool(f"{SERVER}__test_sampling", {"prompt": "2+2?"})
        assert [block.text for block in result.content] == ["LLM response: four"]
        assert replicas.balancer.target == replicas.b.base


async def test_a_client_whose_info_would_make_a_huge_record_keeps_its_session_on_its_replica(
        replicas: Replicas) -> None:
    async with fresh_connections() as http:
        init = await http.post(replicas.url, headers=headers_for("alice"), json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {"experimental": {"x": "y" * 200_000}},
                "clientInfo": {"name": "huge", "version": "1"}}})
        assert init.status_code == 200
        headers = {**headers_for("alice"), "mcp-session-id": init.headers["mcp-session-id"]}
        assert await replicas.store.get(RECORD_KEY + headers["mcp-session-id"]) is None
        replicas.a.frontend.sessions[headers["mcp-session-id"]].saved_at = 0.0  # a refresh due: nothing to refresh
        ping = await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert answer(ping) == {"jsonrpc": "2.0", "id": 1, "result": {}}
        replicas.to(replicas.b)
        elsewhere = await http.post(replicas.url, headers=headers, json={"jsonrpc": "2.0", "id": 2, "method": "ping"})
        assert elsewhere.status_code == 404
