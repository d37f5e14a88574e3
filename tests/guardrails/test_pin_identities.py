"""Pins are kept per server identity (its configuration file and its name there), through real ``bastion run``
processes started by the official SDK's stdio client with a client's small environment, one after the other on one
state folder: two projects' ``filesystem`` servers raise no alarm against each other, a real rug pull is still
caught, ``bastion pins diff`` gives every reason a definition is withheld (the changed definition and the metadata
scan's finding) and which configuration pinned it, ``bastion pins accept`` says what stays withheld, a pins file of
before (servers by name alone) is carried over on first use, and so are the pins of a moved configuration file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.support import BASTION, FIXTURES, READY_TIMEOUT, raw_server

DEADLINE = 180.0
RUG = str(FIXTURES / "rug_pull_server.py")
RUG_TOOLS = {"filesystem__add", "filesystem__delete_file", "filesystem__advance"}


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The state folder of this test, passed to ``bastion run`` in the client's small environment (tests/conftest.py
    adds XDG_STATE_HOME to the variables the SDK's stdio client passes on)."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home / "bastion"


def cursor_file(folder: Path, entry: dict) -> Path:
    """A project's Cursor file with one server named ``filesystem``."""
    path = folder / ".cursor" / "mcp.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": {"filesystem": entry}, "ready_timeout": READY_TIMEOUT}))
    return path


def rug(stage: int) -> dict:
    return {"command": sys.executable, "args": [RUG], "env": {"RUG_STAGE": str(stage)}}


async def _listed(config: Path, mode: str = "legacy") -> set[str]:
    parameters = StdioServerParameters(command=BASTION, args=["run", str(config), "-q"])  # the small environment
    with anyio.fail_after(DEADLINE):
        async with Client(parameters, mode=mode, read_timeout_seconds=DEADLINE) as client:
            return {tool.name for tool in (await client.list_tools()).tools}


def listed(config: Path, mode: str = "legacy") -> set[str]:
    return anyio.run(_listed, config, mode)


def pins(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BASTION, "pins", *args], capture_output=True, text=True, timeout=DEADLINE,
                          stdin=subprocess.DEVNULL)


def tools(config: Path, state: Path) -> subprocess.CompletedProcess[str]:
    """``bastion tools``, whose log (what pinning says at start) is read from its stderr."""
    return subprocess.run([BASTION, "tools", str(config)], capture_output=True, text=True, timeout=DEADLINE,
                          stdin=subprocess.DEVNULL, env={**os.environ, "XDG_STATE_HOME": str(state.parent)})


def pins_file(state: Path) -> dict:
    return json.loads((state / "pins.json").read_text())


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_two_projects_servers_of_one_name_raise_no_alarm_and_a_rug_pull_is_still_caught(tmp_path: Path,
                                                                                         state: Path, mode: str) -> None:
    one = cursor_file(tmp_path / "shop", rug(0))
    other = cursor_file(tmp_path / "blog", raw_server(tag="blog-files"))  # another program, the same name
    assert listed(one, mode) == RUG_TOOLS
    others = listed(other, mode)
    assert others and all(name.startswith("filesystem__") for name in others)
    assert listed(one, mode) == RUG_TOOLS and listed(other, mode) == others  # no alarm either way, run after run
    # A link to the shop's file is the shop's configuration: one identity, not a new one trusted afresh.
    (tmp_path / "link.json").symlink_to(one)
    recorded = pins_file(state)["configurations"]
    assert set(recorded) == {str(one.resolve()), str(other.resolve())}
    table = pins("list")
    assert table.returncode == 0 and str(one.resolve()) in table.stdout and str(other.resolve()) in table.stdout

    # The shop's server is upgraded into a rug pull: caught, and only there.
    cursor_file(tmp_path / "shop", rug(1))
    # add (changed, and poisoned) and delete_file (now claims to be read-only) are withheld; multiply is new
    assert listed(tmp_path / "link.json", mode) == {"filesystem__advance", "filesystem__multiply"}
    assert listed(one, mode) == {"filesystem__advance", "filesystem__multiply"}
    assert listed(other, mode) == others

    diff = pins("diff", "filesystem")
    assert diff.returncode == 0, diff.stderr
    section = diff.stdout.split("filesystem/add (tool)")[1].split("\n\n")[0]
    assert f"configuration: {one.resolve()}" in section
    assert "withheld: definition changed: " in section and "new required parameter 'note'" in section
    assert "withheld: the metadata scan finds instructions (" in section  # the content finding, with its rules
    assert "metadata_injection = \"off\"" in section and str(one.resolve()) in section
    assert "blog" not in diff.stdout  # the other project's server has nothing withheld
    rows = {row["name"]: row for row in json.loads(pins("diff", "filesystem/add", "--json").stdout)}
    assert [reason["reason"] for reason in rows["add"]["reasons"]] == ["changed-definition", "injection"]
    assert rows["add"]["configuration"] == str(one.resolve())

    accepted = pins("accept", "filesystem")
    assert accepted.returncode == 0, accepted.stderr
    assert "accepted filesystem/add (tool)" in accepted.stdout
    assert f"accepted 3 changes of server 'filesystem' of {one.resolve()}" in accepted.stderr
    assert "tool 'add' of server 'filesystem' stays withheld: the metadata scan finds instructions" in accepted.stderr
    assert "accepting does not lift a content finding" in accepted.stderr
    reviews = [json.loads(line) for line in (state / "pins.json.reviews.jsonl").read_text().splitlines()]
    assert {(each["server"], each["configuration"]) for each in reviews} == {("filesystem", str(one.resolve()))}
    served = listed(one, mode)
    assert "filesystem__delete_file" in served and "filesystem__add" not in served  # the scan still withholds it


def test_a_pins_file_from_before_is_carried_over_without_an_alarm(tmp_path: Path, state: Path) -> None:
    one = cursor_file(tmp_path / "shop", rug(0))
    assert listed(one) == RUG_TOOLS
    # The same records as Bastion kept them before, by server name alone (version 1).
    written = pins_file(state)
    (state / "pins.json").write_text(json.dumps({"version": 1, "servers": written["configurations"][
        str(one.resolve())]}))
    other = cursor_file(tmp_path / "blog", raw_server(tag="blog-files"))
    # Another entry of that name: trusted on first use, the old pins left to their own, and said.
    first = tools(other, state)
    assert first.returncode == 0 and "filesystem__" in first.stdout, first.stderr
    assert (f"server 'filesystem' of {other.resolve()} is trusted on first use: the pins of 'filesystem' have "
            "another configuration entry" in first.stderr and "bastion pins forget filesystem --of -" in first.stderr)
    assert "filesystem" in pins_file(state)["servers"]
    assert listed(one) == RUG_TOOLS  # the same entry: the old pins are its own, carried over, no alarm
    after = pins_file(state)
    assert after["version"] == 2 and after["servers"] == {}
    assert after["configurations"][str(one.resolve())]["filesystem"]["tools"]["add"]["pinned"]["description"] \
        == "Adds two numbers"
    cursor_file(tmp_path / "shop", rug(1))
    assert "filesystem__add" not in listed(one)  # they are the pins it is held to: the rug pull is caught


def test_a_moved_configuration_file_keeps_its_pins_and_says_so(tmp_path: Path, state: Path) -> None:
    one = cursor_file(tmp_path / "shop", rug(0))
    assert listed(one) == RUG_TOOLS
    moved = tmp_path / "renamed-shop" / ".cursor" / "mcp.json"
    moved.parent.mkdir(parents=True)
    shutil.move(one, moved)
    run = tools(moved, state)
    assert run.returncode == 0, run.stderr
    assert f"the pins of server 'filesystem' of {moved.resolve()} carry over from 'filesystem' of {one}" in run.stderr
    assert set(pins_file(state)["configurations"]) == {str(moved.resolve())}
    moved.write_text(json.dumps({"mcpServers": {"filesystem": rug(1)}, "ready_timeout": READY_TIMEOUT}))
    assert "filesystem__add" not in listed(moved)  # still held to the pins it carried over


def test_servers_of_one_name_started_at_once_each_keep_their_own_pins(tmp_path: Path, state: Path) -> None:
    """Two gateways meeting two namesakes for the first time at once, one of them taking over a pins file of
    before: each is trusted on first use as itself, and neither is held against the other's pins."""
    one = cursor_file(tmp_path / "shop", rug(0))
    assert listed(one) == RUG_TOOLS
    written = pins_file(state)
    (state / "pins.json").write_text(json.dumps({"version": 1, "servers": written["configurations"][
        str(one.resolve())]}))
    others = [cursor_file(tmp_path / f"blog-{n}", raw_server(tag=f"blog-{n}")) for n in range(2)]
    found: dict[Path, set[str]] = {}

    async def each(config: Path) -> None:
        found[config] = await _listed(config)

    async def together() -> None:
        async with anyio.create_task_group() as group:
            for config in (one, *others):
                group.start_soon(each, config)

    anyio.run(together)
    assert found[one] == RUG_TOOLS
    assert found[others[0]] and found[others[0]] == found[others[1]]
    after = pins_file(state)
    assert set(after["configurations"]) == {str(config.resolve()) for config in (one, *others)}
    assert after["servers"] == {}  # the pins of before went to the one server whose entry they pinned
