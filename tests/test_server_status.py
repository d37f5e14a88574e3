"""Honest server status, end to end: ``bastion run`` launched by the official SDK's stdio client with a client's small
environment, a real server that crashes at every start (a traceback, exit status 1), and ``bastion servers`` in
another process. The failure is said once with its stderr lines, the server is not restarted forever, ``bastion
servers`` shows it failed with the command that retries it, a call to its tool is told the same, and the retry
command brings it in once it is fixed; a server that fails once and then works joins."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from bastion.running import running_gateways
from tests.support import BASTION, FIXTURES, wait_for

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

SERVER = str(FIXTURES / "start_gate_server.py")
DEADLINE = 120
TRACEBACK = "Traceback (most recent call last)"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state folder of this test's own: its gateway's status file, and `bastion servers` reading it."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


def _flags(tmp_path: Path) -> Path:
    """Where the servers' flag files are: a folder their sandbox sees, read-write."""
    flags = tmp_path / "flags"
    flags.mkdir(exist_ok=True)
    return flags


def _config(tmp_path: Path, **servers: dict) -> Path:
    path = tmp_path / "bastion.json"
    path.write_text(json.dumps({
        "servers": {name: {"command": sys.executable, "args": [SERVER], "env": {"START_NAME": name, **env},
                           "sandbox": {"writable": [str(_flags(tmp_path))]}}
                    for name, env in servers.items()},
        "policy": "off", "tools": {"exposure": "all"}, "ready_timeout": 60, "guardrails": {"taint": "off"},
    }))
    return path


def _client(config: Path, errlog, mode: str = "legacy") -> Client:
    # No env given: the SDK passes the small environment a client does (HOME, LOGNAME, PATH, SHELL, TERM, USER).
    params = StdioServerParameters(command=BASTION, args=["run", str(config)])
    return Client(stdio_client(params, errlog=errlog), mode=mode, read_timeout_seconds=DEADLINE)


def _status(name: str) -> dict:
    for gateway in running_gateways():
        if name in gateway.servers:
            return gateway.servers[name]
    return {}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BASTION, "servers", *args], capture_output=True, text=True, timeout=DEADLINE,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_server_that_crashes_at_every_start_is_failed_once_and_retried_on_request(tmp_path, state,
                                                                                          mode) -> None:
    fixed = _flags(tmp_path) / "settings.toml"
    config = _config(tmp_path, crashy={"START_CRASH_UNLESS": str(fixed)}, steady={})
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as errlog, anyio.fail_after(DEADLINE):
        async with _client(config, errlog, mode) as session:
            assert await session.call_tool("steady__hello", {}) is not None
            # It is given up on after its bounded starts, and says so in its status file.
            assert await anyio.to_thread.run_sync(
                lambda: wait_for(lambda: _status("crashy").get("retried") == "when asked", DEADLINE))
            shown = await anyio.to_thread.run_sync(_cli)
            with pytest.raises(MCPError) as refused:
                await session.call_tool("crashy__hello", {})  # asks for one more start, which fails as before
            message = refused.value.error.message

            fixed.write_text("fixed")
            retried = await anyio.to_thread.run_sync(lambda: _cli("retry", "crashy"))
            ok = await anyio.to_thread.run_sync(
                lambda: wait_for(lambda: _status("crashy").get("status") == "ready", 20))
            assert ok, (errors.read_text(), retried.stderr, _status("crashy"))
            joined = await session.call_tool("crashy__hello", {})
    stderr = errors.read_text()

    # Said once, with its stderr lines, however often it was started.
    assert stderr.count(TRACEBACK) == 1 and stderr.count("RuntimeError: settings file missing") == 1, stderr
    assert stderr.count("server crashy failed: 5 starts in a row failed") == 1  # not again when a call retried it
    assert "`bastion servers retry crashy`" in stderr
    assert "server crashy is not ready yet" not in stderr  # never "joins when it is": it failed

    assert shown.returncode == 0, shown.stderr
    assert "crashy: failed: exited during the handshake (exited with status 1)" in shown.stdout
    assert "RuntimeError: settings file missing" in shown.stdout
    assert "retry: bastion servers retry crashy" in shown.stdout
    assert "steady: ready" in shown.stdout

    assert "server 'crashy' is not available: it failed to start" in message and "exited with status 1" in message
    assert "RuntimeError: settings file missing" in message
    assert "`bastion servers retry crashy`" in message

    assert retried.returncode == 0, retried.stderr
    assert joined.content[0].text == "hello from crashy"


async def test_a_server_that_fails_once_then_works_joins(tmp_path, state) -> None:
    config = _config(tmp_path, flaky={"START_FAIL_ONCE": str(_flags(tmp_path) / "failed-once")})
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as errlog, anyio.fail_after(DEADLINE):
        async with _client(config, errlog) as session:
            result = await session.call_tool("flaky__hello", {})
            status = _status("flaky")
    stderr = errors.read_text()
    assert result.content[0].text == "hello from flaky"
    assert status.get("status") == "ready"
    assert stderr.count(TRACEBACK) == 1 and stderr.count("RuntimeError: first start") == 1, stderr
    assert "server flaky failed to start" in stderr and "restarting in" in stderr


async def test_retry_names_what_no_running_gateway_has(state) -> None:
    done = await anyio.to_thread.run_sync(lambda: _cli("retry", "nothing-of-the-kind"))
    assert done.returncode == 1 and "no running gateway has a server 'nothing-of-the-kind'" in done.stderr


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_while_a_server_is_starting_clients_get_search_tools_and_are_told_what_it_is_doing(tmp_path, state,
                                                                                                mode) -> None:
    gate = _flags(tmp_path) / "gate"
    config = _config(tmp_path, steady={}, gated={"START_GATE": str(gate)})
    settings = json.loads(config.read_text())
    del settings["tools"]  # exposure "auto", the default: two tools in all, once both servers are in
    settings["ready_timeout"] = 1  # the client's start waits this long at most for the gated server; it never comes
    # Far beyond every deadline here: the server is ready when the test opens the gate, never failed by a timeout.
    settings["servers"]["gated"]["startup_timeout"] = 900
    config.write_text(json.dumps(settings))
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as errlog, anyio.fail_after(DEADLINE):
        async with _client(config, errlog, mode) as session:
            listed = {tool.name for tool in (await session.list_tools()).tools}
            found = await session.call_tool("search_tools", {"query": "say hello"})
            through = await session.call_tool("call_tool", {"name": "gated__hello"})
            with pytest.raises(MCPError) as refused:
                await session.call_tool("gated__hello", {})
            starting = _status("gated")

            gate.touch()  # the server may answer now
            assert await anyio.to_thread.run_sync(
                lambda: wait_for(lambda: _status("gated").get("status") == "ready", DEADLINE))
            joined = await session.call_tool("gated__hello", {})
            meta = await session.call_tool("search_tools", {"query": "say hello"})  # still answered, never unknown
    stderr = errors.read_text()

    # Search mode from the first moment: the catalog's size is not known while a server is starting.
    assert listed == {"search_tools", "call_tool"}
    assert json.loads(found.content[0].text)["starting"] == [{"server": "gated", "doing": "starting"}]
    assert not found.is_error
    assert through.is_error and "gated: starting" in "".join(c.text for c in through.content)
    assert "server 'gated' is not available: starting; it joins when it is ready" in refused.value.error.message
    assert "Unknown tool" not in refused.value.error.message
    assert starting == {"status": "starting", "reason": "starting", "era": None, "restarts": 0,
                        "sandbox": "default, network off", "stderr": []}
    assert "servers still starting" in stderr and "server gated is not ready yet (starting)" in stderr

    assert joined.content[0].text == "hello from gated"
    assert not meta.is_error and "starting" not in json.loads(meta.content[0].text)


async def test_a_server_that_fails_instead_of_joining_ends_search_mode_with_list_changed(tmp_path, state) -> None:
    gate = _flags(tmp_path) / "gate"
    config = _config(tmp_path, steady={}, crashy={"START_GATE": str(gate),
                                                   "START_CRASH_UNLESS": str(_flags(tmp_path) / "never")})
    settings = json.loads(config.read_text())
    del settings["tools"]  # exposure "auto"
    settings["ready_timeout"] = 1
    config.write_text(json.dumps(settings))
    changed = [anyio.Event()]

    async def on_message(message) -> None:
        if getattr(getattr(message, "root", message), "method", None) == "notifications/tools/list_changed":
            changed[0].set()

    params = StdioServerParameters(command=BASTION, args=["run", str(config)])
    with (tmp_path / "stderr.txt").open("w") as errlog, anyio.fail_after(DEADLINE):
        async with Client(stdio_client(params, errlog=errlog), mode="legacy", read_timeout_seconds=DEADLINE,
                          message_handler=on_message) as session:
            first = {tool.name for tool in (await session.list_tools()).tools}
            # The steady server in, its list_changed delivered (before the answer of a call that waited for its lists):
            # what comes after the gate opens is the crashing server's news alone.
            assert await anyio.to_thread.run_sync(
                lambda: wait_for(lambda: _status("steady").get("status") == "ready", DEADLINE))
            assert (await session.call_tool("steady__hello", {})).content[0].text == "hello from steady"
            changed[0] = anyio.Event()
            gate.touch()  # it crashes now: it will not join
            while True:  # each list_changed, listed again, until the list is whole: never without one
                await changed[0].wait()
                changed[0] = anyio.Event()
                listed = {tool.name for tool in (await session.list_tools()).tools}
                if listed == {"steady__hello"}:
                    break
    assert first == {"search_tools", "call_tool"}
