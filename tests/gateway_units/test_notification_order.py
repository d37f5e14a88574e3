"""A server's notifications keep its order even when one has interceptors on its route and the next has none (a
reload swapped the chain in between, or the methods differ): the one with nothing to pass waits behind those still
passing, instead of being delivered at once ahead of them. A real server process (tests/fixtures/writers_server.py),
the client connection in process."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from bastion.compose import build_gateway
from bastion.config import GatewayConfig
from bastion.gateway.pipeline import Chain

from tests.gateway_units.test_client_routing import DEADLINE, legacy
from tests.support import FIXTURES

UPDATED = "notifications/resources/updated"
URI = "mem://counter"


class HoldFirst:
    """Names resources/updated; holds the first until ``release`` is set."""

    methods = frozenset({UPDATED})
    reads_params = True
    reads_results = False

    def __init__(self) -> None:
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, request: Any, call_next: Any) -> Any:
        if not self.held.is_set():
            self.held.set()
            await self.release.wait()
        return await call_next(request)


async def until(condition: Any) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), DEADLINE)


async def test_an_update_with_an_empty_route_waits_behind_one_still_passing_the_chain(tmp_path: Path) -> None:
    hold = HoldFirst()
    config = GatewayConfig.model_validate({"policy": "off", "tools": {"exposure": "all"}, "ready_timeout": 60,
                                           "servers": {"w": {"command": sys.executable,
                                                             "args": [str(FIXTURES / "writers_server.py")],
                                                             "sandbox": "none"}}})
    gateway = build_gateway(config, interceptors=[hold])
    gateway.start()
    try:
        await gateway.wait_ready()
        client = await legacy(gateway, "subscriber", {})
        assert "result" in await client.call("resources/subscribe", {"uri": URI})
        bump = {"name": "w__bump", "arguments": {"writer": "one", "times": 1}}
        first_call = asyncio.ensure_future(client.call("tools/call", bump))
        await asyncio.wait_for(hold.held.wait(), DEADLINE)
        first = gateway.relay.notices.pending()
        assert first is not None
        # The chain toward clients is swapped for one with nothing on the route, as a reload may do.
        gateway.relay.use_chain(Chain([], lambda raw_results: gateway.router.route))
        second_call = asyncio.ensure_future(client.call("tools/call", {**bump, "arguments": {"writer": "two",
                                                                                             "times": 1}}))
        # The second update reached the relay, and queued behind the first instead of overtaking it.
        await until(lambda: gateway.relay.notices.pending() not in (None, first))
        assert not [f for f in client.frames if f.get("method") == UPDATED]
        hold.release.set()
        await asyncio.wait_for(asyncio.gather(first_call, second_call), DEADLINE)
        await until(lambda: len([f for f in client.frames if f.get("method") == UPDATED]) == 2)
        updates = [f["params"]["_meta"] for f in client.frames if f.get("method") == UPDATED]
        assert updates == [{"seq": 1, "writer": "one"}, {"seq": 2, "writer": "two"}]
    finally:
        await gateway.close()
