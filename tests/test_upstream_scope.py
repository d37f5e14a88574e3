"""Upstream scope: a shared server is one process for every caller; a per_identity or per_session server gives each
identity or client session a process of its own, stops the ones left unused, and refuses callers past its bound.

Real gateways with real server processes (tests/fixtures/raw_server.py); callers are sessions of different
identities sent through the gateway's request path, as every frontend sends them.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest

from bastion.config import GatewayConfig, ServerConfig
from bastion.gateway.core import Gateway
from bastion.model import GatewayError, GatewayRequest, Identity, Session
from bastion.protocol import jsonrpc
from bastion.protocol.jsonrpc import RawResponse
from tests.support import pids_with_tag, raw_server

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
        gateway = Gateway(GatewayConfig(servers={"raw": ServerConfig.model_validate(entry)}, policy=None))
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
    gateway.detach(SimpleNamespace(id="a1"))
    assert await eventually(lambda: gone not in pids_with_tag(tag))
    assert pool.instance(first) is None and pool.instance(second) is not None


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
