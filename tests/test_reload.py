"""Hot reload, end to end: ``bastion serve --http`` with the official SDK's HTTP clients of both eras, and ``bastion
run`` under the SDK's stdio client. The configuration file (or a Cedar policy file it names) is changed while a
client stays connected, and the gateway applies it on its own (the file watch) or on SIGHUP: a server added joins
and the client is told, a server removed goes with its process, a policy change decides the next call (and not a
call already in flight), a guardrail setting takes effect, and a file that does not validate is refused with its
file and key while the running configuration keeps serving. Every wait is on what the gateway says (its stderr,
its notifications, its status file), never on a clock."""

from __future__ import annotations

import json
import os
import signal
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from bastion.running import running_gateways
from tests.http.conftest import Served, serve_config, stop_bastion
from tests.support import BASTION, FIXTURES, pids_with_tag, wait_for

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

SERVER = str(FIXTURES / "reload_server.py")
DEADLINE = 120
ERAS = ("legacy", "auto")  # auto probes server/discover and so speaks 2026-07-28
APPLIED = "bastion.reload: reloaded "
REFUSED = "refused, the running configuration stays"
ALLOW_ALL = '@id("everything")\npermit (principal, action, resource);\n'
NO_HOLD = ALLOW_ALL + ('@id("no-hold")\nforbid (principal, action == Bastion::Action::"call_tool", resource)\n'
                       'when { resource.name like "*hold" };\n')


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state folder of this test's own: its gateway's status file and audit trail."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


def server(name: str, tmp: Path) -> dict[str, Any]:
    # The tag in its command line finds its process; the events file is where it says a call reached it.
    return {"command": sys.executable, "args": [SERVER, name, f"reload-test-{tmp.name}-{name}"],
            "env": {"RELOAD_EVENTS": str(tmp / f"{name}.events")}, "sandbox": {"writable": [str(tmp)]}}


def write(config: Path, tmp: Path, names: tuple[str, ...], **settings: Any) -> None:
    """The configuration of servers ``names``, written as an editor does: a new file renamed into place."""
    data = {"policy": "off", "tools": {"exposure": "all"}, "ready_timeout": 60, "reload": {"interval": 0.1},
            "guardrails": {"pinning": "off"}, "servers": {name: server(name, tmp) for name in names}, **settings}
    replace(config, json.dumps(data))


def replace(path: Path, text: str) -> None:
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(text)
    os.replace(fresh, path)


def said(stderr: Path, line: str) -> int:
    return stderr.read_text().count(line) if stderr.exists() else 0


async def until_said(stderr: Path, line: str, count: int) -> None:
    """Until ``line`` is in the gateway's stderr ``count`` times."""
    assert await anyio.to_thread.run_sync(lambda: wait_for(lambda: said(stderr, line) >= count, DEADLINE)), \
        stderr.read_text()


async def until_gone(tag: str) -> None:
    assert await anyio.to_thread.run_sync(lambda: wait_for(lambda: not pids_with_tag(tag), DEADLINE)), tag


class Notices:
    """The tools/list_changed notifications a client got."""

    def __init__(self) -> None:
        self.changed = anyio.Event()

    async def on_message(self, message: Any) -> None:
        if getattr(getattr(message, "root", message), "method", None) == "notifications/tools/list_changed":
            self.changed.set()

    async def next(self) -> None:
        await self.changed.wait()
        self.changed = anyio.Event()


@asynccontextmanager
async def tool_changes(client: Client, mode: str, notices: Notices) -> AsyncIterator[Callable[[], Awaitable[Any]]]:
    """What waits for the client's next news that the tools changed: a handshake-era session's notification, or a
    2026-07-28 client's event on the subscriptions/listen stream it opened."""
    if mode == "legacy":
        yield notices.next
        return
    async with client.listen(tools_list_changed=True) as subscription:
        yield subscription.__anext__


async def tool_names(client: Client) -> set[str]:
    return {tool.name for tool in (await client.list_tools()).tools}


def http_client(served: Served, mode: str, notices: Notices) -> Client:
    http = httpx2.AsyncClient(timeout=httpx2.Timeout(120, read=300))
    return Client(streamable_http_client(served.url, http_client=http), mode=mode,
                  message_handler=notices.on_message, read_timeout_seconds=DEADLINE)


def stdio(config: Path, errlog: Any, mode: str, notices: Notices | None = None) -> Client:
    params = StdioServerParameters(command=BASTION, args=["run", str(config)])
    return Client(stdio_client(params, errlog=errlog), mode=mode, read_timeout_seconds=DEADLINE,
                  message_handler=notices.on_message if notices else None)


def status_servers() -> set[str]:
    return {name for gateway in running_gateways() for name in gateway.servers}


@pytest.mark.parametrize("mode", ERAS)
async def test_servers_added_and_removed_over_http_keep_the_session(tmp_path: Path, state: Path, mode: str) -> None:
    config = tmp_path / "bastion.json"
    write(config, tmp_path, ("a",))
    served = serve_config(config, tmp_path, tmp_path / "events.log")
    notices = Notices()
    try:
        with anyio.fail_after(DEADLINE):
            async with http_client(served, mode, notices) as client, tool_changes(client, mode, notices) as changed:
                assert (await client.call_tool("a__hello", {})).content[0].text == "hello from a"

                write(config, tmp_path, ("a", "b"))  # the file watch applies it
                await until_said(served.stderr, APPLIED, 1)
                await changed()  # told on the session (or stream) it already had
                assert (await client.call_tool("b__hello", {})).content[0].text == "hello from b"
                assert {"a__hello", "b__hello"} <= await tool_names(client)
                assert await anyio.to_thread.run_sync(lambda: wait_for(lambda: status_servers() == {"a", "b"}))

                write(config, tmp_path, ("b",))
                await until_said(served.stderr, APPLIED, 2)
                await until_gone(f"reload-test-{tmp_path.name}-a")
                await changed()
                names = await tool_names(client)
                assert "a__hello" not in names and "b__hello" in names
                with pytest.raises(MCPError):
                    await client.call_tool("a__hello", {})
                assert (await client.call_tool("b__hello", {})).content[0].text == "hello from b"
                assert await anyio.to_thread.run_sync(lambda: wait_for(lambda: status_servers() == {"b"}))
    finally:
        stop_bastion(served)
    stderr = served.stderr.read_text()
    assert "servers added: b" in stderr and "removed: a" in stderr


async def test_an_invalid_file_is_refused_and_the_running_configuration_keeps_serving(tmp_path: Path,
                                                                                     state: Path) -> None:
    config = tmp_path / "bastion.json"
    write(config, tmp_path, ("a",))
    served = serve_config(config, tmp_path, tmp_path / "events.log")
    notices = Notices()
    try:
        with anyio.fail_after(DEADLINE):
            async with http_client(served, "legacy", notices) as client:
                replace(config, '{"servers": {"b": ')  # not JSON
                await until_said(served.stderr, REFUSED, 1)
                assert (await client.call_tool("a__hello", {})).content[0].text == "hello from a"

                write(config, tmp_path, ("a", "b"), ready_timeout="soon")  # JSON, with a key of the wrong type
                await until_said(served.stderr, REFUSED, 2)
                assert (await client.call_tool("a__hello", {})).content[0].text == "hello from a"
                assert "b__hello" not in await tool_names(client)

                fifo = tmp_path / "fifo"
                os.mkfifo(fifo)
                os.replace(fifo, config)  # a FIFO in its place: never read (it would wait for a writer forever)
                await until_said(served.stderr, "not a regular file", 1)
                assert (await client.call_tool("a__hello", {})).content[0].text == "hello from a"

                config.unlink()  # deleted: a warning, and the running configuration stays
                await until_said(served.stderr, "deleted or unreadable", 1)
                assert (await client.call_tool("a__hello", {})).content[0].text == "hello from a"

                write(config, tmp_path, ("a", "b"))  # back, and valid
                await until_said(served.stderr, APPLIED, 1)
                assert (await client.call_tool("b__hello", {})).content[0].text == "hello from b"
    finally:
        stop_bastion(served)
    stderr = served.stderr.read_text()
    assert f"{config}: not valid JSON" in stderr
    assert f"{config}" in stderr and "ready_timeout" in stderr  # the file and the key
    assert served.process.returncode == 0


async def test_sighup_reloads_and_twice_in_a_row_gives_one_consistent_result(tmp_path: Path, state: Path) -> None:
    config = tmp_path / "bastion.json"
    write(config, tmp_path, ("a",), reload={"watch": False})
    served = serve_config(config, tmp_path, tmp_path / "events.log")
    try:
        with anyio.fail_after(DEADLINE):
            async with http_client(served, "legacy", Notices()) as client:
                write(config, tmp_path, ("a", "b"), reload={"watch": False})
                served.process.send_signal(signal.SIGHUP)
                served.process.send_signal(signal.SIGHUP)  # the kernel may merge the two into one
                await until_said(served.stderr, APPLIED, 1)
                assert served.process.poll() is None  # SIGHUP reloads; it no longer stops the gateway
                assert (await client.call_tool("b__hello", {})).content[0].text == "hello from b"
                assert (await client.call_tool("a__hello", {})).content[0].text == "hello from a"
    finally:
        stop_bastion(served)
    stderr = served.stderr.read_text()
    # The first applied the new server, a second (if the two were not merged) found nothing more to do: never two
    # halves interleaved, and the server started once.
    assert stderr.count("servers added: b") == 1, stderr
    assert stderr.count("server b ready (modern era") == 1, stderr
    assert stderr.count(f"{APPLIED}{config} (SIGHUP): guardrails reloaded") <= 1, stderr


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_policy_change_decides_the_next_call_and_not_the_one_in_flight(tmp_path: Path, state: Path,
                                                                               mode: str) -> None:
    rules = tmp_path / "rules.cedar"
    rules.write_text(ALLOW_ALL)
    config = tmp_path / "bastion.json"
    policy = {"policy_files": ["rules.cedar"], "audit": {"path": str(tmp_path / "audit.jsonl")}}
    write(config, tmp_path, ("a",), policy=policy)
    stderr = tmp_path / "stderr.txt"
    events = tmp_path / "a.events"
    with stderr.open("w") as errlog, anyio.fail_after(DEADLINE):
        async with stdio(config, errlog, mode) as client, anyio.create_task_group() as tasks:
            held: list[Any] = []

            async def hold() -> None:
                held.append(await client.call_tool("a__hold", {}))

            tasks.start_soon(hold)
            assert await anyio.to_thread.run_sync(
                lambda: wait_for(lambda: events.exists() and "hold" in events.read_text(), DEADLINE))

            replace(rules, NO_HOLD)  # a policy file changed: the file watch reloads
            await until_said(stderr, APPLIED, 1)
            with pytest.raises(MCPError) as refused:
                await client.call_tool("a__hold", {})
            assert "refused by policy" in refused.value.error.message
            assert (await client.call_tool("a__release", {})).content[0].text == "released"
            # The call that entered under the old policy finishes under it.
            await anyio.to_thread.run_sync(lambda: wait_for(lambda: bool(held), DEADLINE))

            replace(rules, ALLOW_ALL)  # and back: allowed again, on the same connection
            await until_said(stderr, APPLIED, 2)
            assert (await client.call_tool("a__hold", {})).content[0].text == "held by a"
    assert held[0].content[0].text == "held by a"
    records = [json.loads(line) for path in tmp_path.glob("audit*.jsonl") for line in path.read_text().splitlines()]
    reloads = [r for r in records if r["kind"] == "call" and r["what"]["method"] == "admin/reload"]
    assert len(reloads) == 2 and all(r["who"]["name"] == "local-process" and r["outcome"] == 0 for r in reloads)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_guardrail_setting_takes_effect_on_sighup_to_bastion_run(tmp_path: Path, state: Path,
                                                                          mode: str) -> None:
    config = tmp_path / "bastion.json"
    manual = {"watch": False}  # SIGHUP alone reloads
    write(config, tmp_path, ("a",), guardrails={"pinning": "off", "pii": "off"}, reload=manual)
    stderr = tmp_path / "stderr.txt"
    notices = Notices()
    with stderr.open("w") as errlog, anyio.fail_after(DEADLINE):
        async with stdio(config, errlog, mode, notices) as client, tool_changes(client, mode, notices) as changed:
            text = "write to jane.roe@acme-mail.io"
            assert (await client.call_tool("a__contact", {})).content[0].text == text
            assert await anyio.to_thread.run_sync(lambda: wait_for(lambda: len(running_gateways()) == 1, DEADLINE))
            [gateway] = running_gateways()
            write(config, tmp_path, ("a",), guardrails={"pinning": "off", "pii": "redact"}, reload=manual)
            os.kill(gateway.pid, signal.SIGHUP)
            await until_said(stderr, APPLIED, 1)
            assert (await client.call_tool("a__contact", {})).content[0].text == "write to [redacted: email]"

            write(config, tmp_path, ("a", "b"), guardrails={"pinning": "off", "pii": "redact"}, reload=manual)
            os.kill(gateway.pid, signal.SIGHUP)
            await until_said(stderr, APPLIED, 2)
            await changed()
            assert "b__hello" in await tool_names(client)
            assert (await client.call_tool("b__hello", {})).content[0].text == "hello from b"
    assert "(SIGHUP): servers added: b" in stderr.read_text()

async def test_a_changed_server_restarts_an_unchanged_one_keeps_running_and_restart_keys_are_named(
        tmp_path: Path, state: Path) -> None:
    config = tmp_path / "bastion.json"
    write(config, tmp_path, ("a", "b"))
    served = serve_config(config, tmp_path, tmp_path / "events.log")
    try:
        with anyio.fail_after(DEADLINE):
            async with http_client(served, "legacy", Notices()) as client:
                assert (await client.call_tool("a__hello", {})).content[0].text == "hello from a"
                assert (await client.call_tool("b__hello", {})).content[0].text == "hello from b"
                a_before = set(pids_with_tag(f"reload-test-{tmp_path.name}-a"))
                b_before = set(pids_with_tag(f"reload-test-{tmp_path.name}-b"))
                data = json.loads(config.read_text())
                data["servers"]["a"]["env"]["CHANGED"] = "1"  # a changed entry: that server restarts
                data["http"] = {"max_body_bytes": 65536}  # the listener's: only a restart changes it
                replace(config, json.dumps(data))
                await until_said(served.stderr, APPLIED, 1)
                await anyio.to_thread.run_sync(lambda: wait_for(
                    lambda: not a_before & set(pids_with_tag(f"reload-test-{tmp_path.name}-a")), DEADLINE))
                assert (await client.call_tool("a__hello", {})).content[0].text == "hello from a"
                assert set(pids_with_tag(f"reload-test-{tmp_path.name}-b")) == b_before
                assert (await client.call_tool("b__hello", {})).content[0].text == "hello from b"
    finally:
        stop_bastion(served)
    stderr = served.stderr.read_text()
    assert "restarted: a" in stderr and "restarted: a, b" not in stderr
    assert f"http changed in {config}: it takes effect only when Bastion restarts" in stderr
