"""Upstream scope: a shared server is one process for every caller; a per_identity or per_session server gives each
identity or client session a process of its own, stops the ones left unused, and refuses callers past its bound.

Real gateways with real server processes (tests/fixtures/raw_server.py); callers are sessions of different
identities sent through the gateway's request path, as every frontend sends them.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from types import SimpleNamespace
from typing import Any

import orjson
import pydantic
import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig, ServerConfig
from bastion.gateway.core import Gateway
from bastion.frontends.connection import ClientConnection
from bastion.model import GatewayError, GatewayRequest, Identity, Session
from bastion.protocol import jsonrpc
from bastion.protocol.jsonrpc import RawResponse
from tests.support import FIXTURES, pids_with_tag, raw_server
from tests.fixtures.handed_over import check_handed_over

ALICE = Identity("alice", ("dev",))
BOB = Identity("bob", ("dev",))


def session(identity: Identity, session_id: str) -> Session:
    return Session(identity, "legacy", "2025-11-25", {}, {"name": "test"}, session_id)


async def echo(gateway: Gateway, who: Session, text: str = "hi") -> dict[str, Any]:
    params = {"name": "raw__echo", "arguments": {"text": text}}
    result = await gateway.handle(GatewayRequest("tools/call", params, who, gateway.catalog, request_id=1))
    # With no interceptor reading it, a result may pass as the bytes the server sent.
    return result.decoded().result if isinstance(result, RawResponse) else result


async def eventually(predicate, timeout: float = 30.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


@pytest.fixture()
async def gateway_with():
    started: list[Gateway] = []

    async def make(**scope: Any) -> tuple[Gateway, str]:
        tag = f"scope-{uuid.uuid4().hex[:8]}"
        entry = raw_server(tag=tag, sandbox={"profile": "none"}, **scope)
        gateway = build_gateway(GatewayConfig(servers={"raw": ServerConfig.model_validate(entry)}, policy=None))
        started.append(gateway)
        gateway.start()
        await gateway.wait_ready(120)
        assert gateway.upstreams["raw"].ready.is_set()
        return gateway, tag

    yield make
    for gateway in started:
        await gateway.close()


def instance_pids(gateway: Gateway) -> set[int]:
    return {u.pid for u in gateway.pools["raw"].instances() if u.pid is not None}


async def test_shared_server_is_one_process_for_two_identities(gateway_with):
    gateway, tag = await gateway_with()
    assert "raw" not in gateway.pools
    for who in (session(ALICE, "a1"), session(BOB, "b1")):
        result = await echo(gateway, who)
        assert result["content"][0]["text"] == "hi"
    assert pids_with_tag(tag) == [gateway.upstreams["raw"].pid]


async def test_per_identity_gives_each_identity_its_own_process_and_one_identity_one(gateway_with):
    gateway, tag = await gateway_with(scope="per_identity")
    catalog_pid = gateway.upstreams["raw"].pid
    await echo(gateway, session(ALICE, "a1"))
    await echo(gateway, session(BOB, "b1"))
    pool = gateway.pools["raw"]
    alice = pool.instance(session(ALICE, "a1"))
    bob = pool.instance(session(BOB, "b1"))
    assert alice is not None and bob is not None and alice is not bob
    assert len({alice.pid, bob.pid, catalog_pid}) == 3
    # Alice's second connection reaches her process, not a new one.
    await echo(gateway, session(ALICE, "a2"))
    assert pool.instance(session(ALICE, "a2")) is alice and len(pool) == 2
    assert sorted(pids_with_tag(tag)) == sorted({alice.pid, bob.pid, catalog_pid})


async def test_per_session_gives_each_session_its_own_process_even_of_one_identity(gateway_with):
    gateway, tag = await gateway_with(scope="per_session")
    first, second = session(ALICE, "a1"), session(ALICE, "a2")
    await asyncio.gather(echo(gateway, first), echo(gateway, second))
    pool = gateway.pools["raw"]
    assert pool.instance(first).pid != pool.instance(second).pid
    assert len(pids_with_tag(tag)) == 3  # the catalog's and one per session
    # The session's process goes with its client.
    gone = pool.instance(first).pid
    gateway.detach(SimpleNamespace(id="a1"))  # the connection whose session is "a1" goes
    assert await eventually(lambda: gone not in pids_with_tag(tag))
    assert pool.instance(first) is None and pool.instance(second) is not None


async def test_per_session_sends_a_2026_07_28_clients_requests_to_its_identitys_instance(gateway_with):
    gateway, _ = await gateway_with(scope="per_session")
    # Each stateless request (each HTTP POST) is a session of its own: they must not each start a process.
    first = Session(ALICE, "modern", "2026-07-28", {}, {"name": "test"}, "post-1")
    second = Session(ALICE, "modern", "2026-07-28", {}, {"name": "test"}, "post-2")
    other = Session(BOB, "modern", "2026-07-28", {}, {"name": "test"}, "post-3")
    for who in (first, second, other):
        await echo(gateway, who)
    pool = gateway.pools["raw"]
    assert pool.instance(first) is pool.instance(second) is not None
    assert pool.instance(other) is not pool.instance(first) and len(pool) == 2
    gateway.detach(SimpleNamespace(id="post-1"))  # the POST's connection ends; the identity's process stays
    await asyncio.sleep(0.2)
    assert pool.instance(second) is not None and pool.instance(second).pid is not None


async def test_calls_of_two_identities_run_at_once_on_their_own_processes(gateway_with):
    gateway, _ = await gateway_with(scope="per_identity")
    results = await asyncio.gather(*(echo(gateway, session(who, f"{who.name}{n}"), f"{who.name}{n}")
                                     for who in (ALICE, BOB) for n in range(5)))
    assert sorted(r["content"][0]["text"] for r in results) == sorted(f"{w}{n}" for w in ("alice", "bob") for n in range(5))
    assert len(instance_pids(gateway)) == 2


async def test_an_unused_instance_is_stopped_and_the_next_call_starts_a_new_one(gateway_with):
    gateway, tag = await gateway_with(scope="per_identity", idle_timeout=0.5)
    await echo(gateway, session(ALICE, "a1"))
    [first] = instance_pids(gateway)
    assert await eventually(lambda: first not in pids_with_tag(tag))
    assert len(gateway.pools["raw"]) == 0
    result = await echo(gateway, session(ALICE, "a1"), "again")
    assert result["content"][0]["text"] == "again"
    [second] = instance_pids(gateway)
    assert second != first and second in pids_with_tag(tag)


async def test_an_instance_with_a_call_in_flight_is_never_stopped_as_idle(gateway_with):
    gateway, _ = await gateway_with(scope="per_identity", idle_timeout=0.2)
    alice = session(ALICE, "a1")
    slow = asyncio.ensure_future(gateway.handle(GatewayRequest(
        "tools/call", {"name": "raw__slow", "arguments": {}}, alice, gateway.catalog, request_id=7)))
    assert await eventually(lambda: gateway.pools["raw"].instance(alice) is not None)
    await asyncio.sleep(1.0)  # five idle periods
    instance = gateway.pools["raw"].instance(alice)
    assert instance is not None and instance.pid is not None
    slow.cancel()
    await asyncio.gather(slow, return_exceptions=True)


async def test_past_max_instances_a_caller_is_refused_at_once_with_retry_after(gateway_with):
    gateway, tag = await gateway_with(scope="per_identity", max_instances=1, idle_timeout=30)
    await echo(gateway, session(ALICE, "a1"))
    with pytest.raises(GatewayError) as refused:
        await asyncio.wait_for(echo(gateway, session(BOB, "b1")), 10)
    error = refused.value
    assert error.code == jsonrpc.SERVER_BUSY == -32000
    assert "max_instances" in error.message and "'raw'" in error.message
    assert isinstance(error.data["retryAfterSeconds"], int) and 1 <= error.data["retryAfterSeconds"] <= 30
    assert len(pids_with_tag(tag)) == 2  # nothing was started for the refused caller
    await echo(gateway, session(ALICE, "a2"))  # the identity holding the place still gets through


async def test_scope_keys_are_checked():
    with pytest.raises(pydantic.ValidationError, match="scope"):
        ServerConfig(command="x", scope="global")
    with pytest.raises(pydantic.ValidationError, match="max_instances"):
        ServerConfig(command="x", scope="per_identity", max_instances=0)
    with pytest.raises(pydantic.ValidationError, match="idle_timeout"):
        ServerConfig(command="x", idle_timeout=0)
    assert ServerConfig(command="x").scope == "shared"


# ------------------------------------------------------------------ through client connections, a stateful server
class Client:
    """A handshake-era client on an in-memory transport to the gateway's frontend driver."""

    def __init__(self, gateway: Gateway, identity: Identity) -> None:
        self.answers: dict[Any, dict[str, Any]] = {}
        self.arrived = asyncio.Event()
        self.connection = ClientConnection(gateway, self._receive, identity=identity)
        self._ids = iter(range(1, 10_000))

    def _receive(self, frame: bytes, handed: Any) -> None:
        check_handed_over(frame, handed)
        message = orjson.loads(frame)
        if "id" in message and ("result" in message or "error" in message):
            self.answers[message["id"]] = message
            self.arrived.set()

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = next(self._ids)
        self.connection.feed(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}))
        while request_id not in self.answers:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 60)
        return self.answers.pop(request_id)

    async def start(self) -> None:
        answer = await self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                                   "clientInfo": {"name": "scope-test", "version": "1"}})
        assert "result" in answer, answer
        self.connection.feed(orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))

    async def call(self, tool: str, **arguments: Any) -> str:
        answer = await self.request("tools/call", {"name": f"memory__{tool}", "arguments": arguments})
        assert "result" in answer, answer
        return answer["result"]["content"][0]["text"]

    async def recall(self) -> dict[str, Any]:
        return orjson.loads(await self.call("recall"))


@pytest.fixture()
async def memory_gateway():
    started: list[Gateway] = []

    async def make(scope: str) -> Gateway:
        entry = {"command": sys.executable, "args": [str(FIXTURES / "memory_server.py")], "sandbox": "none",
                 "scope": scope}
        gateway = build_gateway(GatewayConfig(servers={"memory": ServerConfig.model_validate(entry)}, policy=None))
        started.append(gateway)
        gateway.start()
        await gateway.wait_ready(120)
        return gateway

    yield make
    for gateway in started:
        await gateway.close()


async def test_a_shared_stateful_server_mixes_two_identities_state(memory_gateway):
    gateway = await memory_gateway("shared")
    alice, bob = Client(gateway, ALICE), Client(gateway, BOB)
    await asyncio.gather(alice.start(), bob.start())
    await alice.call("remember", text="alice's secret")
    await bob.call("remember", text="bob's secret")
    seen_by_alice, seen_by_bob = await alice.recall(), await bob.recall()
    assert seen_by_alice == seen_by_bob  # one process: what "shared" means, and why scope exists
    assert seen_by_alice["kept"] == ["alice's secret", "bob's secret"]


async def test_per_identity_keeps_two_identities_state_apart_and_one_identitys_together(memory_gateway):
    gateway = await memory_gateway("per_identity")
    alice, bob, alice_again = Client(gateway, ALICE), Client(gateway, BOB), Client(gateway, ALICE)
    await asyncio.gather(alice.start(), bob.start(), alice_again.start())
    await asyncio.gather(alice.call("remember", text="alice's secret"), bob.call("remember", text="bob's secret"))
    seen_by_alice, seen_by_bob = await alice.recall(), await bob.recall()
    assert seen_by_alice["kept"] == ["alice's secret"] and seen_by_bob["kept"] == ["bob's secret"]
    assert seen_by_alice["pid"] != seen_by_bob["pid"]
    assert await alice_again.recall() == seen_by_alice  # her second connection, her process


async def test_a_callers_log_level_reaches_its_own_instance_and_no_other_callers(memory_gateway):
    gateway = await memory_gateway("per_identity")
    alice, bob = Client(gateway, ALICE), Client(gateway, BOB)
    await asyncio.gather(alice.start(), bob.start())
    await asyncio.gather(alice.recall(), bob.recall())  # each has its instance now
    answer = await alice.request("logging/setLevel", {"level": "debug"})
    assert answer.get("result") == {}, answer
    assert (await alice.recall())["level"] == "debug"
    assert (await bob.recall())["level"] is None


@pytest.mark.parametrize("scope", ["per_identity", "per_session"])
async def test_a_callers_roots_change_reaches_its_own_instance_and_no_other_callers(memory_gateway, scope):
    gateway = await memory_gateway(scope)
    alice, bob = Client(gateway, ALICE), Client(gateway, BOB)
    await asyncio.gather(alice.start(), bob.start())
    await asyncio.gather(alice.recall(), bob.recall())  # each has its instance now
    alice.connection.feed(orjson.dumps({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}))
    # A notification has no answer; the next call travels behind it on the same pipe, so it counts it.
    assert (await alice.recall())["roots_changed"] == 1
    assert (await bob.recall())["roots_changed"] == 0


async def test_per_session_keeps_two_sessions_of_one_identity_apart_and_stops_a_closed_ones(memory_gateway):
    gateway = await memory_gateway("per_session")
    first, second = Client(gateway, ALICE), Client(gateway, ALICE)
    await asyncio.gather(first.start(), second.start())
    await first.call("remember", text="first")
    await second.call("remember", text="second")
    seen_first, seen_second = await first.recall(), await second.recall()
    assert seen_first["kept"] == ["first"] and seen_second["kept"] == ["second"]
    await first.connection.closed()  # what a transport calls when its client goes
    assert await eventually(lambda: not _alive(seen_first["pid"]))
    assert _alive(seen_second["pid"]) and (await second.recall())["kept"] == ["second"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"
