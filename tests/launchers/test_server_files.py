"""A server's own files through ``bastion run``: the real ``uvx`` servers of a Cursor file, installed offline from
the wheelhouse scripts/setup.sh fills, sandboxed, and driven by the official SDK's stdio client with a client's
small environment (HOME, LOGNAME, PATH, SHELL, TERM, USER and the test's state folders; the package clients'
offline settings stand in for the user's own pip configuration).

- ``mcp-server-sqlite --db-path DATA/shop.db`` on an existing database: the import review says it writes DATA, and
  so it does (the sandbox once bound the database read-only on top of its writable folder).
- a ``uvx`` server installed under a state path so long that pip writes its program as a ``/bin/sh`` wrapper
  instead of a ``#!`` line over 127 characters still starts (its interpreter was not in the sandbox).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import TextContent

from tests.support import BASTION, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")]

WHEELHOUSE = ROOT / ".cache" / "wheelhouse"
DEADLINE = 600.0  # an offline install and a sandboxed start on a busy 2-core machine; never a measured duration
ERAS = ["legacy", "2026-07-28"]


def offline(**more: str) -> dict[str, str]:
    """What the SDK's stdio client adds to its small environment: pip's offline settings (a user's pip
    configuration names their index; here it is the wheelhouse), and what a test sets besides."""
    if not any(WHEELHOUSE.glob("mcp_server_sqlite-*.whl")):
        pytest.fail(f"{WHEELHOUSE} has no mcp-server-sqlite wheel: run scripts/setup.sh (it fills the caches these "
                    "offline tests install from)")
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE), **more}


def cursor_file(home: Path, servers: dict[str, Any]) -> Path:
    """Cursor's file, with Bastion's keys a test needs: no approvals asked of a client nobody answers for, and the
    first request waiting for the install instead of a list that is empty until the server joins."""
    path = home / ".cursor" / "mcp.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers, "policy": "off", "guardrails": {"taint": "off"},
                                "ready_timeout": DEADLINE}, indent=2))
    return path


def sdk_client(config: Path, mode: str, env: dict[str, str], log: Path) -> Client:
    # Bastion's stderr goes to a file the test reads afterwards (the client's own stderr would interleave).
    command = 'exec "$0" run "$1" 2>>"$2"'
    return Client(StdioServerParameters(command="/bin/sh", args=["-c", command, BASTION, str(config), str(log)],
                                        env=env), mode=mode, read_timeout_seconds=DEADLINE)


def text_of(result: Any) -> str:
    assert not result.is_error, result
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def shop_with_a_table(data: Path) -> Path:
    """The user's database as it is before the server first opens it."""
    database = data / "shop.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        connection.execute("INSERT INTO customers (name) VALUES ('Ana')")
    connection.close()
    return database


def import_review(home: Path, state: Path) -> dict[str, Any]:
    """``bastion import --dry-run --json`` as the user runs it on this home."""
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "XDG_STATE_HOME": str(state)}
    done = subprocess.run([BASTION, "import", "--dry-run", "--json"], capture_output=True, text=True, env=env,
                          cwd=home, stdin=subprocess.DEVNULL, timeout=DEADLINE)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("mode", ERAS)
def test_sqlite_writes_its_existing_database_where_the_review_says_it_writes(tmp_path: Path, mode: str) -> None:
    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir()
    data.mkdir()
    database = shop_with_a_table(data)
    sqlite = {"command": "uvx", "args": ["--with", "mcp<2", "mcp-server-sqlite", f"--db-path={database}"]}
    config = cursor_file(home, {"shop": sqlite})

    [reviewed] = [server for server in import_review(home, tmp_path / "import-state")["servers"]]
    assert reviewed["writes"] == [str(data)]
    assert reviewed["reads"] == [str(data)], "the database is in its writable folder: nothing is bound on top"

    log = tmp_path / "bastion.log"
    seen: dict[str, str] = {}

    async def session() -> None:
        with anyio.fail_after(DEADLINE):
            async with sdk_client(config, mode, offline(), log) as client:
                names = {tool.name for tool in (await client.list_tools()).tools}
                assert "shop__write_query" in names, (names, log.read_text()[-3000:])
                seen["create"] = text_of(await client.call_tool(
                    "shop__create_table", {"query": "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)"}))
                seen["insert"] = text_of(await client.call_tool(
                    "shop__write_query", {"query": "INSERT INTO items (name) VALUES ('widget')"}))
                seen["read"] = text_of(await client.call_tool(
                    "shop__read_query", {"query": "SELECT items.name, customers.name AS buyer FROM items, customers"}))

    anyio.run(session)
    stderr = log.read_text()
    assert "readonly" not in stderr, stderr[-3000:]
    assert seen["insert"] == "[{'affected_rows': 1}]", seen
    assert seen["read"] == "[{'name': 'widget', 'buyer': 'Ana'}]", seen
    # The log's review (run straight from the client's file) says what the import's did.
    assert f"server 'shop' reads {data}; writes {data};" in stderr, stderr[-3000:]
    with sqlite3.connect(database) as connection:
        assert connection.execute("SELECT name FROM items").fetchall() == [("widget",)]
    connection.close()


def long_state_home(tmp_path: Path) -> Path:
    """A state folder whose package venvs' ``bin/python`` is past the 127 characters a ``#!`` line may have."""
    folder = tmp_path / ("state-" + "s" * 60) / ("nested-" + "n" * 60)
    folder.mkdir(parents=True)
    return folder


@pytest.mark.parametrize("mode", ERAS)
def test_a_uvx_server_installed_under_a_long_state_path_starts_in_the_sandbox(tmp_path: Path, mode: str) -> None:
    state = long_state_home(tmp_path)
    config = cursor_file(tmp_path / "home", {"time": {"command": "uvx",
                                                      "args": ["mcp-server-time", "--local-timezone", "UTC"]}})
    log = tmp_path / "bastion.log"
    seen: dict[str, str] = {}

    async def session() -> None:
        with anyio.fail_after(DEADLINE):
            async with sdk_client(config, mode, offline(XDG_STATE_HOME=str(state)), log) as client:
                names = {tool.name for tool in (await client.list_tools()).tools}
                assert "time__get_current_time" in names, (names, log.read_text()[-3000:])
                seen["time"] = text_of(await client.call_tool("time__get_current_time", {"timezone": "UTC"}))

    anyio.run(session)
    [program] = (state / "bastion" / "packages" / "python").glob("mcp-server-time==*/bin/mcp-server-time")
    assert program.read_text().startswith("#!/bin/sh\n"), "the install is not the long-path case this test is about"
    assert '"timezone": "UTC"' in seen["time"], seen
