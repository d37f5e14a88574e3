"""Pins across replicas: with a store the replicas share, every gateway judges against one book kept in the store
(bastion/guardrails/pin_state.py), not in a pins file. Two gateways built in one process on one shared store are two
replicas, each in front of its own real SDK server (the rug-pull fixture) at the stage it is told."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig, ServerConfig
from bastion.gateway.core import Gateway
from bastion.guardrails.pin_state import BOOK_KEY, LOCK_KEY, StatePins
from bastion.model import GatewayError, GatewayRequest

from tests.policy.test_pipeline import session
from tests.state.shared_memory import SharedMemoryStore
from tests.support import FIXTURES

RUG = str(FIXTURES / "rug_pull_server.py")


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "bastion"


@pytest.fixture
async def replica():
    started: list[Gateway] = []

    async def make(store: Any, stage: int) -> Gateway:
        server = ServerConfig(command=sys.executable, args=[RUG], env={"RUG_STAGE": str(stage)}, sandbox="none")
        gateway = build_gateway(GatewayConfig(servers={"rug": server}, policy=None), state=store)
        gateway.start({})
        await gateway.wait_ready(60)
        started.append(gateway)
        return gateway

    yield make
    for gateway in started:
        await gateway.close()


async def tools(gateway: Gateway) -> set[str]:
    listed = await gateway.handle(GatewayRequest("tools/list", {}, session(), gateway.catalog))
    return {tool["name"] for tool in listed["tools"]}


async def refused(gateway: Gateway, name: str) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        await gateway.handle(GatewayRequest("tools/call", {"name": name, "arguments": {"path": "x"}}, session(),
                                            gateway.catalog, request_id=1))
    return caught.value


async def test_a_change_withheld_on_replicas_is_released_on_every_one_by_one_acceptance(
        state_dir: Path, replica) -> None:
    store = SharedMemoryStore()
    first = await replica(store, 0)
    assert "rug__delete_file" in await tools(first)
    await first.close()  # the replica that pinned it is gone: the pins are in the store, not in it
    a, b = await replica(store, 1), await replica(store, 1)
    # Stage 1's delete_file claims to be read-only: withheld on both, and the offer is in the store.
    assert "rug__delete_file" not in await tools(a)
    assert "rug__delete_file" not in await tools(b)
    assert "changed" in (await refused(b, "rug__delete_file")).message
    book, _ = await StatePins(store).load_async()
    assert book.records[("rug", "tools", "delete_file")].offered is not None
    assert not (state_dir / "pins.json").exists()  # nothing of it in a file of one host
    accepted, _ = await StatePins(store).accept_async("rug", "delete_file", by="ops")
    assert accepted == [("rug", "tools", "delete_file")]
    assert "rug__delete_file" in await tools(a)
    assert "rug__delete_file" in await tools(b)
    assert (await StatePins(store).reviews_async())[0]["by"] == "ops"


async def test_with_the_store_unreachable_nothing_is_served_that_cannot_be_checked(state_dir: Path, replica) -> None:
    store = SharedMemoryStore()
    await tools(await replica(store, 0))
    store.down = True
    down = await replica(store, 1)
    assert "rug__delete_file" not in await tools(down)
    assert "rug__multiply" not in await tools(down)  # new, and unchecked: nothing says it is not a rename
    message = (await refused(down, "rug__delete_file")).message
    assert "shared state store" in message and "cannot be reached" in message
    store.down = False  # back: the next request reads the pins again, no restart
    listed = await tools(down)
    assert "rug__multiply" in listed and "rug__delete_file" not in listed


async def test_a_replica_that_died_holding_the_lock_delays_a_change_by_the_lock_s_expiry_only() -> None:
    store = SharedMemoryStore()
    assert await store.claim(LOCK_KEY, 0.2)  # held by a replica that died before it let go
    pins = StatePins(store)
    accepted, book = await pins.accept_async("rug", None, by="ops")
    assert accepted == [] and book.records == {}
    assert not await store.recorded(LOCK_KEY)


async def test_a_damaged_book_in_the_store_is_named_and_left_alone() -> None:
    from bastion.guardrails.pin_store import PinStoreError

    store = SharedMemoryStore()
    await store.put(BOOK_KEY, b"{not json")
    with pytest.raises(PinStoreError, match="not a pins document"):
        await StatePins(store).load_async()
    with pytest.raises(PinStoreError):
        await StatePins(store).forget_async("rug", None)
    assert await store.get(BOOK_KEY) == b"{not json"


async def test_replicas_pinning_at_once_lose_none_of_each_other_s_pins() -> None:
    from bastion.guardrails.pin_book import Observation

    store = SharedMemoryStore()
    a, b = StatePins(store), StatePins(store)
    await asyncio.gather(*(replica.record_async([Observation("pin", f"server:{n}*", "tools", "t", {"name": "t"})])
                           for n, replica in enumerate([a, b] * 8)))
    book, _ = await b.load_async()
    assert {server for server, _, _ in book.records} == {f"server:{n}*" for n in range(16)}


async def test_a_running_replica_that_loses_the_store_keeps_judging_against_the_pins_it_read(
        state_dir: Path, replica) -> None:
    store = SharedMemoryStore()
    await tools(await replica(store, 0))
    running = await replica(store, 1)
    served = await tools(running)
    assert "rug__delete_file" not in served and "rug__multiply" in served
    store.down = True  # nothing served is withdrawn, nothing withheld is released, by an outage
    assert await tools(running) == served
    assert "changed" in (await refused(running, "rug__delete_file")).message
    with pytest.raises(Exception, match="cannot be reached"):
        await StatePins(store).accept_async("rug", "delete_file", by="ops")
    store.down = False
    await StatePins(store).accept_async("rug", "delete_file", by="ops")
    assert "rug__delete_file" in await tools(running)
