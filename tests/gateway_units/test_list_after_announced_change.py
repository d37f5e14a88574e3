"""A list asked for after an answer whose server announced, before answering, that the list changed shows the change:
it waits for the catalog's fetch under way, never answers from the catalog as it was. (A rug pull's ``advance``
announces its new tools and answers; an agent that lists right after must not be shown the old definitions.) This
holds for a handshake-era server, whose notifications and answers share one ordered stream; a 2026-07-28 server's
announcements come on its ``subscriptions/listen`` stream, in no order with its answers (docs/federation.md).

A real SDK server process (tests/fixtures/rug_pull_server.py) whose list after the change is held on a FIFO until
the test has seen the client's list reach the router; client connections in process."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig

from tests.gateway_units.test_client_routing import DEADLINE, envelope, legacy, modern
from tests.support import FIXTURES


class ListWatch:
    """Sees each client's tools/list on its way to the router (the innermost step before it)."""

    reads_params = False
    reads_results = False

    def __init__(self) -> None:
        self.listing = asyncio.Event()

    async def __call__(self, request: Any, call_next: Any) -> Any:
        if request.method == "tools/list":
            self.listing.set()
        return await call_next(request)


@pytest.mark.parametrize("client_era", ["legacy", "modern"])
async def test_a_list_right_after_an_announced_change_waits_for_the_changed_list(tmp_path: Path, client_era: str) -> None:
    hold = tmp_path / "hold-lists"
    os.mkfifo(hold)
    config = GatewayConfig.model_validate({"policy": "off", "tools": {"exposure": "all"}, "ready_timeout": 60,
                                           "servers": {"rug": {
                                               "command": sys.executable, "args": [str(FIXTURES / "rug_pull_server.py")],
                                               "era": "legacy", "sandbox": "none", "request_timeout": 300,
                                               "env": {"RUG_HOLD_LISTS": str(hold)}}}})
    watch = ListWatch()
    gateway = build_gateway(config, interceptors=[watch])
    gateway.start()
    try:
        with anyio.fail_after(DEADLINE):
            await gateway.wait_ready()
            client = await legacy(gateway, "agent", {}) if client_era == "legacy" else modern(gateway, "agent")
            extra = envelope({}) if client_era == "modern" else {}
            advanced = await client.call("tools/call", {"name": "rug__advance", "arguments": {}, **extra})
            assert advanced["result"]["content"][0]["text"] == "stage 1", advanced
            watch.listing.clear()
            listed = asyncio.create_task(client.call("tools/list", dict(extra)))
            await watch.listing.wait()
            # The client's list has reached the router, and the server's changed list is still held: a list answered
            # from the catalog as it was would be answered now. Release the server's list.
            def release() -> None:
                with open(hold, "w") as fifo:
                    fifo.write("go\n")
            await anyio.to_thread.run_sync(release)
            names = {tool["name"] for tool in (await listed)["result"]["tools"]}
    finally:
        await gateway.close()
    assert "rug__multiply" in names, names  # new at stage 1
