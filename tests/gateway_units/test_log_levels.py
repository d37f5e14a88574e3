"""Each client's log level is its own when clients share a server: several client connections in process, one real
server that keeps to the level it is asked for (``tests/fixtures/raw_server.py`` with ``RAW_SERVER_LOGGING``).

The server is asked for the most verbose level any of its clients wants, and each client is sent what its own
level admits: one client's ``logging/setLevel`` never narrows, nor widens, what another receives.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig
from bastion.gateway.core import Gateway
from tests.gateway_units.test_client_routing import DEADLINE, Client, legacy
from tests.support import FIXTURES

LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


def from_level(level: str) -> list[str]:
    return list(LEVELS[LEVELS.index(level):])


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    return tmp_path / "marks"


@pytest.fixture
async def gateway(marks: Path):
    config = GatewayConfig.model_validate({"policy": "off", "ready_timeout": 60, "servers": {"raw": {
        "command": sys.executable, "args": [str(FIXTURES / "raw_server.py"), "log-levels"], "era": "legacy",
        "env": {"RAW_SERVER_LOGGING": "1", "RAW_SERVER_MARKS": str(marks)}, "sandbox": "none"}}})
    gateway = build_gateway(config)
    gateway.start()
    await gateway.wait_ready()
    assert gateway.upstreams["raw"].ready.is_set()
    try:
        yield gateway
    finally:
        await gateway.close()


async def set_level(client: Client, level: str) -> None:
    assert (await client.call("logging/setLevel", {"level": level}))["result"] == {}


async def logs(client: Client, ends: int) -> list[str]:
    """The data of every log message ``client`` received, once the ``ends``-th ``end`` (each ``log`` call's last
    message, after all the others) has come."""
    async def arrived() -> None:
        while sum(m["params"]["data"] == "end" for m in client.received("notifications/message")) < ends:
            client.arrived.clear()
            await client.arrived.wait()

    await asyncio.wait_for(arrived(), DEADLINE)
    return [m["params"]["data"] for m in client.received("notifications/message")]


async def set_levels(marks: Path, count: int) -> list[str]:
    """The levels the server was asked for, once it was asked ``count`` times."""
    async def asked() -> list[str]:
        while True:
            lines = marks.read_text().splitlines() if marks.exists() else []
            found = [line.split()[1] for line in lines if line.startswith("set-level ")]
            if len(found) >= count:
                return found
            await asyncio.sleep(0.02)

    return await asyncio.wait_for(asked(), DEADLINE)


async def test_one_clients_level_does_not_narrow_what_another_receives(gateway: Gateway, marks: Path) -> None:
    verbose = await legacy(gateway, "verbose", {})
    terse = await legacy(gateway, "terse", {})
    await set_level(verbose, "debug")
    await set_level(terse, "error")  # the last level asked of the shared server, were levels passed on as they come
    assert (await verbose.call("tools/call", {"name": "raw__log", "arguments": {}}))["result"]
    # During its call the messages are the caller's; after it, every client's that takes them.
    assert await logs(verbose, 1) == [*(f"during {each}" for each in LEVELS), *(f"after {each}" for each in LEVELS),
                                      "end"]
    assert await logs(terse, 1) == [*(f"after {each}" for each in from_level("error")), "end"]
    assert (await terse.call("tools/call", {"name": "raw__log", "arguments": {}}))["result"]
    assert (await logs(terse, 2))[5:] == [*(f"during {each}" for each in from_level("error")),
                                          *(f"after {each}" for each in from_level("error")), "end"]
    assert (await logs(verbose, 2))[17:] == [*(f"after {each}" for each in LEVELS), "end"]
    assert await set_levels(marks, 1) == ["debug"]  # never narrowed to "error" while "debug" is wanted


async def test_the_servers_level_follows_its_clients(gateway: Gateway, marks: Path) -> None:
    steady = await legacy(gateway, "steady", {})
    changing = await legacy(gateway, "changing", {})
    await set_level(steady, "info")  # the other set none yet, so it still wants every level
    await set_level(changing, "error")  # now "info" is the most verbose level wanted
    await set_level(changing, "debug")  # more verbose than the other's: the server is asked for it
    assert await set_levels(marks, 3) == ["debug", "info", "debug"]
    assert (await changing.call("tools/call", {"name": "raw__log", "arguments": {}}))["result"]
    assert (await logs(changing, 1))[:8] == [f"during {each}" for each in LEVELS]
    # What the other receives stays at its own level, although the server now logs at debug.
    assert await logs(steady, 1) == [*(f"after {each}" for each in from_level("info")), "end"]
    await changing.connection.closed()  # it leaves: the server follows the client that remains
    assert await set_levels(marks, 4) == ["debug", "info", "debug", "info"]
    await set_level(steady, "warning")  # it lowers its level, and so does the server
    assert await set_levels(marks, 5) == ["debug", "info", "debug", "info", "warning"]
    assert (await steady.call("tools/call", {"name": "raw__log", "arguments": {}}))["result"]
    assert (await logs(steady, 2))[8:] == [*(f"during {each}" for each in from_level("warning")),
                                           *(f"after {each}" for each in from_level("warning")), "end"]


async def test_a_client_that_sets_no_level_gets_every_level_whatever_another_set(gateway: Gateway,
                                                                                 marks: Path) -> None:
    terse = await legacy(gateway, "terse", {})
    await set_level(terse, "critical")
    assert await set_levels(marks, 1) == ["critical"]  # alone, it has the server log what it wants
    unset = await legacy(gateway, "unset", {})  # it gets every level until it sets one
    assert await set_levels(marks, 2) == ["critical", "debug"]
    assert (await unset.call("tools/call", {"name": "raw__log", "arguments": {}}))["result"]
    assert await logs(unset, 1) == [*(f"during {each}" for each in LEVELS), *(f"after {each}" for each in LEVELS),
                                    "end"]
    assert await logs(terse, 1) == [*(f"after {each}" for each in from_level("critical")), "end"]
