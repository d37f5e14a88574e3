"""A server's resources/updated and list_changed notifications pass the interceptors that name their method, with
``request.server`` naming the server that sent them, in both eras of the server; one that drops them keeps them
from every client (and a dropped list_changed leaves the catalog as it was).

Real SDK-written server processes, client connections in process (tests/gateway_units/test_client_routing.py has
the same for log messages, progress and servers' requests).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig

from tests.gateway_units.test_client_routing import DEADLINE, Client, legacy
from tests.support import FIXTURES

WATCHED = "test://watched-resource"
UPDATED = "notifications/resources/updated"
TOOLS_CHANGED = "notifications/tools/list_changed"


class NoticeWatch:
    """Names resources/updated and tools list_changed; records what it sees and drops the first ``drop`` of them."""

    methods = frozenset({UPDATED, TOOLS_CHANGED})
    reads_params = True
    reads_results = False

    def __init__(self, drop: int) -> None:
        self.drop = drop
        self.seen: list[tuple[str, str | None, Any]] = []
        self.saw = asyncio.Event()

    async def __call__(self, request: Any, call_next: Any) -> Any:
        if request.method not in self.methods:  # the clients' own requests pass the chain too
            return await call_next(request)
        self.seen.append((request.method, request.server, request.params.get("uri")))
        self.saw.set()
        if len(self.seen) <= self.drop:
            return {}
        return await call_next(request)

    async def wait_seen(self, count: int) -> None:
        async def enough() -> None:
            while len(self.seen) < count:
                self.saw.clear()
                await self.saw.wait()
        await asyncio.wait_for(enough(), DEADLINE)


@pytest.fixture
async def watched(tmp_path: Path):
    started = []

    async def make(era: str, drop: int) -> tuple[Any, NoticeWatch]:
        watch = NoticeWatch(drop)
        config = GatewayConfig.model_validate({"policy": "off", "tools": {"exposure": "all"}, "ready_timeout": 60, "servers": {"fx": {
            "command": sys.executable, "args": [str(FIXTURES / "sdk_server.py")], "era": era,
            "env": {"FIXTURE_EVENTS": str(tmp_path / f"events-{era}.log")}, "sandbox": "none",
            "request_timeout": 300}}})
        gateway = build_gateway(config, interceptors=[watch])
        started.append(gateway)
        gateway.start()
        await gateway.wait_ready()
        assert gateway.upstreams["fx"].ready.is_set()
        return gateway, watch

    yield make
    for gateway in started:
        await gateway.close()


async def touch(client: Client) -> None:
    answer = await client.call("tools/call", {"name": "fx__test_touch_watched_resource", "arguments": {}})
    assert answer["result"]["content"][0]["text"] == "updated", answer


async def tool_names(client: Client) -> set[str]:
    answer = await client.call("tools/list", {})
    return {tool["name"] for tool in answer["result"]["tools"]}


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_resources_updated_passes_the_interceptor_with_its_server_and_reaches_the_subscriber(
        watched: Any, era: str) -> None:
    gateway, watch = await watched(era, drop=0)
    subscriber = await legacy(gateway, "subscriber", {})
    assert "result" in await subscriber.call("resources/subscribe", {"uri": WATCHED})
    await touch(subscriber)
    updated = await subscriber.wait_for(UPDATED)
    assert updated["params"]["uri"] == WATCHED
    assert watch.seen == [(UPDATED, "fx", WATCHED)]


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_an_interceptor_that_drops_resources_updated_keeps_it_from_the_subscriber(watched: Any, era: str) -> None:
    gateway, watch = await watched(era, drop=1)
    subscriber = await legacy(gateway, "subscriber", {})
    assert "result" in await subscriber.call("resources/subscribe", {"uri": WATCHED})
    await touch(subscriber)  # dropped
    await watch.wait_seen(1)
    await touch(subscriber)  # passed: notifications pass the chain in order, so the first is settled by then
    await subscriber.wait_for(UPDATED)
    await watch.wait_seen(2)
    assert watch.seen == [(UPDATED, "fx", WATCHED)] * 2
    assert len(subscriber.received(UPDATED)) == 1


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_list_changed_passes_the_interceptor_with_its_server_and_the_catalog_follows(
        watched: Any, era: str) -> None:
    gateway, watch = await watched(era, drop=0)
    client = await legacy(gateway, "client", {})
    assert "fx__test_dynamic_tool" not in await tool_names(client)
    await client.call("tools/call", {"name": "fx__test_add_dynamic_tool", "arguments": {}})
    await client.wait_for(TOOLS_CHANGED)
    assert watch.seen == [(TOOLS_CHANGED, "fx", None)]
    assert "fx__test_dynamic_tool" in await tool_names(client)


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_an_interceptor_that_drops_list_changed_keeps_it_from_clients_and_the_catalog(
        watched: Any, era: str) -> None:
    gateway, watch = await watched(era, drop=1)
    client = await legacy(gateway, "client", {})
    await client.call("tools/call", {"name": "fx__test_add_dynamic_tool", "arguments": {}})
    await watch.wait_seen(1)
    # The drop is final once the chain has returned; a refresh it had let through would take the server's list.
    await asyncio.sleep(0.5)
    assert client.received(TOOLS_CHANGED) == []
    assert "fx__test_dynamic_tool" not in await tool_names(client)
    assert watch.seen == [(TOOLS_CHANGED, "fx", None)]


async def test_one_client_holds_a_bounded_number_of_subscriptions_and_unsubscribing_keeps_nothing(watched: Any) -> None:
    from bastion.protocol.server_session import MAX_SUBSCRIPTIONS
    gateway, _ = await watched("legacy", 0)
    client = await legacy(gateway, "subscriber", {})
    other = await legacy(gateway, "other", {})
    # unsubscribing from resources never subscribed to leaves no trace, however many
    for n in range(50):
        assert "result" in await client.call("resources/unsubscribe", {"uri": f"test://template/never-{n}/data"})
    assert gateway.subscriptions._subscribers == {}
    answers = await asyncio.gather(*(client.call("resources/subscribe", {"uri": f"test://template/{n}/data"})
                                     for n in range(MAX_SUBSCRIPTIONS)))
    assert all("result" in answer for answer in answers)
    assert "result" in await client.call("resources/subscribe", {"uri": "test://template/0/data"})  # already held
    refused = await client.call("resources/subscribe", {"uri": "test://template/one-more/data"})
    assert refused["error"]["code"] == -32602 and str(MAX_SUBSCRIPTIONS) in refused["error"]["message"]
    # the bound is per client: another client subscribes as before
    assert "result" in await other.call("resources/subscribe", {"uri": "test://template/one-more/data"})
    # and one unsubscription makes room
    assert "result" in await client.call("resources/unsubscribe", {"uri": "test://template/0/data"})
    assert "result" in await client.call("resources/subscribe", {"uri": "test://template/one-more/data"})
