"""One package cache and lock for the user: an imported file runs what its client's file locked, configurations
asking for the same thing share one install, and an install is never reused for another request (``uvx --with
"mcp<2"``). Real installs, offline from the caches scripts/setup.sh fills."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bastion.config import ServerConfig, load_config
from bastion.launchers.lock import LockEntry, lock_path, read_lock, record, user_index_path
from bastion.launchers.prepare import prepare
from tests.launchers.test_real_launchers import (  # noqa: F401  (offline_package_clients: autouse fixture)
    MEMORY, OLDER_MEMORY, START_S, cached_npm, lock_file_of, npx, offline_package_clients, run_and_close,
    wait_for_tools)
from tests.support import BASTION

SQLITE = "mcp-server-sqlite==2025.4.25"


def state() -> Path:
    return Path(os.environ["XDG_STATE_HOME"]) / "bastion"


def installs() -> set[str]:
    packages = state() / "packages"
    return {f"{kind.name}/{folder.name}" for kind in packages.iterdir() if kind.is_dir()
            for folder in kind.iterdir() if not folder.name.startswith(".")} if packages.is_dir() else set()


@pytest.mark.slow  # installs real packages
def test_an_imported_file_runs_what_the_clients_file_locked_without_resolving_again(tmp_path: Path) -> None:
    home = tmp_path / "home"
    cursor = home / ".cursor" / "mcp.json"
    cursor.parent.mkdir(parents=True)
    cursor.write_text(json.dumps({"mcpServers": {
        "memory": npx(MEMORY), "time": {"command": "uvx", "args": ["mcp-server-time"]}},
        "policy": "off", "ready_timeout": START_S, "tools": {"exposure": "all"}}))
    run_and_close(cursor, lambda client: wait_for_tools(client, {"memory", "time"}))
    assert sorted(os.listdir(cursor.parent)) == ["mcp.json"]  # no lock left in the client's folder
    locked = read_lock(lock_file_of(cursor))
    assert sorted(locked) == ["memory", "time"]
    before = installs()

    output = tmp_path / "bastion.toml"
    imported = subprocess.run([BASTION, "import", str(cursor), "--output", str(output)], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "HOME": str(home)})
    assert imported.returncode == 0, imported.stderr
    own_lock = output.with_name("bastion.toml.lock.json")  # Bastion's own file keeps its lock beside it
    assert f"carried the locked versions of memory, time over to {own_lock}" in imported.stderr
    assert read_lock(own_lock) == locked

    # What another file locked is not what makes it reuse them: its own lock does.
    user_index_path(state()).unlink()
    output.write_text(f"ready_timeout = {START_S}\n{output.read_text()}\n[tools]\nexposure = \"all\"\n")
    stderr = run_and_close(output, lambda client: wait_for_tools(client, {"memory", "time"}))
    for name in ("memory", "time"):
        assert f"{locked[name].package} {locked[name].version} (locked)" in stderr, stderr[-3000:]
    assert installs() == before  # nothing installed again
    assert read_lock(own_lock) == locked

    # A third file asking for the same package reuses what is locked for the user, in the same install folder.
    other = tmp_path / "project" / ".vscode" / "mcp.json"
    other.parent.mkdir(parents=True)
    other.write_text(json.dumps({"servers": {"mem": npx(MEMORY)}, "policy": "off", "ready_timeout": START_S, "tools": {"exposure": "all"}}))
    stderr = run_and_close(other, lambda client: wait_for_tools(client, {"mem"}))
    assert (f"server mem: {MEMORY} {locked['memory'].version} is locked for the same request by another "
            "configuration; using it") in stderr, stderr[-3000:]
    assert installs() == before
    assert read_lock(lock_file_of(other))["mem"] == locked["memory"]
    assert sorted(os.listdir(other.parent)) == ["mcp.json"]

    update = subprocess.run([BASTION, "servers", "update", "--config", str(other)], capture_output=True, text=True,
                            timeout=START_S)
    assert update.returncode == 0, update.stderr
    assert f"lock file {lock_file_of(other)}" in update.stderr


def sqlite(*launcher: str) -> ServerConfig:
    server = ServerConfig(command="uvx", args=[*launcher, SQLITE, "--db-path", "/tmp/never-opened.db"])
    return server


def mcp_in(installed: ServerConfig) -> str:
    venv = Path(installed.command).parent.parent
    found = [p.name for p in venv.glob("lib/python*/site-packages/mcp-*.dist-info")]
    assert len(found) == 1, found
    return found[0].removesuffix(".dist-info").split("-")[1]


def test_with_an_older_sdk_is_a_tree_of_its_own_and_a_lock_that_contradicts_its_request_is_refused(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = tmp_path / "bastion.json"  # Bastion's own format: its lock is beside it
    config.write_text(json.dumps({"servers": {"plain": sqlite().model_dump(include={"command", "args"}),
                                              "older": sqlite("--with", "mcp<2").model_dump(
                                                  include={"command", "args"})}}))
    servers = load_config(config).servers
    lock = lock_path(config.resolve())
    assert lock == tmp_path / "bastion.json.lock.json"

    plain = asyncio.run(prepare("plain", servers["plain"]))
    older = asyncio.run(prepare("older", servers["older"]))
    assert mcp_in(plain).startswith("2.") and mcp_in(older) == "1.30.0"
    assert plain.command != older.command  # the same package and version, two trees: two installs
    entries = read_lock(lock)
    assert entries["older"].tree["mcp"]["version"] == "1.30.0" and entries["older"].requested == f"{SQLITE} mcp<2"

    # A lock that records the newer SDK for the request that refuses it (written by hand, or by an older Bastion
    # that reused the first install) is refused, said so, and the request installed again.
    wrong = entries["plain"]
    record(lock, {"older": LockEntry("python", wrong.package, f"{SQLITE} mcp<2", wrong.version, wrong.integrity,
                                     wrong.tree)})
    with caplog.at_level(logging.WARNING, logger="bastion.launchers"):
        again = asyncio.run(prepare("older", servers["older"]))
    assert mcp_in(again) == "1.30.0" and again.command == older.command
    assert any(f"records a tree that does not satisfy {SQLITE} mcp<2 (the locked tree has mcp "
               f"{wrong.tree['mcp']['version']}, which is not <2); refused" in record.getMessage()
               for record in caplog.records), [r.getMessage() for r in caplog.records]
    assert read_lock(lock)["older"].tree["mcp"]["version"] == "1.30.0"


def test_several_npx_packages_are_installed_in_one_tree_and_installed_again_from_its_lock(tmp_path: Path) -> None:
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {"both": {"command": "npx", "args": [
        "-y", "-p", MEMORY, "--package=@modelcontextprotocol/server-filesystem", "mcp-server-filesystem", "/tmp"]}}}))
    server = load_config(config).servers["both"]
    installed = asyncio.run(prepare("both", server))
    # the program comes from the second package, which the first does not depend on
    assert installed.command.endswith("/node_modules/.bin/mcp-server-filesystem") and installed.args == ["/tmp"]
    entry = read_lock(lock_path(config.resolve()))["both"]
    assert entry.package == MEMORY and entry.requested == f"{MEMORY} @modelcontextprotocol/server-filesystem"
    assert {f"node_modules/{MEMORY}", "node_modules/@modelcontextprotocol/server-filesystem"} <= set(entry.tree)

    # Another machine, or a cleared packages folder: the locked tree of both is installed again (npm ci).
    tree = Path(installed.command).parent.parent.parent
    subprocess.run(["rm", "-rf", str(tree)], check=True)
    again = asyncio.run(prepare("both", server))
    assert again.command == installed.command and Path(again.command).exists()
    assert read_lock(lock_path(config.resolve()))["both"] == entry


def test_the_python_a_command_line_asks_for_is_found_or_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from bastion.launchers.install import PackageInstallFailed, python_interpreter
    from bastion.launchers.plan import plan_launch

    asked = plan_launch("uvx", ["-p", "3.11", "mcp-server-time"])
    missing = plan_launch("uvx", ["--python", "9.99", "mcp-server-time"])
    assert asked is not None and missing is not None
    found = shutil.which("python3.11", path="/usr/bin")
    assert found is not None
    assert python_interpreter(asked, "/usr/bin") == os.path.realpath(found)
    with pytest.raises(PackageInstallFailed, match=r"asks for Python '9.99', and no python9.99 is on PATH"):
        python_interpreter(missing, "/usr/bin")


def test_a_lock_an_older_bastion_left_beside_a_clients_file_is_read_and_moved_to_the_state_directory(
        tmp_path: Path) -> None:
    client = tmp_path / "claude_desktop_config.json"
    client.write_text(json.dumps({"mcpServers": {"mem": npx(MEMORY)}}))
    legacy = tmp_path / "claude_desktop_config.json.lock.json"
    legacy.write_text(json.dumps({"version": 1, "servers": {"mem": {
        "ecosystem": "npm", "package": MEMORY, "requested": MEMORY, "version": OLDER_MEMORY,
        "integrity": cached_npm("dist.integrity", f"{MEMORY}@{OLDER_MEMORY}")}}}))
    before = legacy.read_text()
    user_index_path(state()).unlink(missing_ok=True)  # what is reused comes from the old lock, not the user's index
    asyncio.run(prepare("mem", load_config(client).servers["mem"]))
    moved = read_lock(lock_file_of(client))["mem"]
    assert moved.version == OLDER_MEMORY and f"node_modules/{MEMORY}" in moved.tree
    assert legacy.read_text() == before  # read, never written


def test_what_other_files_locked_only_saves_a_resolve(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    index = user_index_path(state())
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text("{not json")
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {"memory": npx(MEMORY)}}))
    server = load_config(config).servers["memory"]
    with caplog.at_level(logging.WARNING, logger="bastion.launchers"):
        installed = asyncio.run(prepare("memory", server))
    assert Path(installed.command).exists()
    assert any("not valid JSON" in r.getMessage() and "starting it afresh" in r.getMessage() for r in caplog.records)
    good = read_lock(index)[f"npm: {MEMORY}"]
    assert good == read_lock(lock_path(config.resolve()))["memory"]

    # An entry there that cannot be installed here (another Python's wheels, a package changed since) is not this
    # file's lock: the request is resolved again instead of the server failing.
    record(index, {f"npm: {MEMORY}": LockEntry("npm", MEMORY, MEMORY, OLDER_MEMORY, "sha512-" + "C" * 86 + "==")})
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"servers": {"memory": npx(MEMORY)}}))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bastion.launchers"):
        again = asyncio.run(prepare("memory", load_config(other).servers["memory"]))
    assert again.command == installed.command
    assert any("the version locked elsewhere could not be installed here" in r.getMessage() for r in caplog.records)
    assert read_lock(lock_path(other.resolve()))["memory"] == good


def test_two_processes_installing_the_same_request_at_once_leave_one_install(tmp_path: Path) -> None:
    own_state = tmp_path / "s"  # fresh, so both processes really install
    env = {**os.environ, "XDG_STATE_HOME": str(own_state)}
    configs = []
    for name in ("one", "two"):
        config = tmp_path / f"{name}.json"
        config.write_text(json.dumps({"servers": {name: {"command": "uvx", "args": ["mcp-server-time"]},
                                                  f"{name}-memory": npx(MEMORY)}}))
        configs.append(config)
    processes = [subprocess.Popen([BASTION, "servers", "update", "--config", str(config)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for config in configs]
    outputs = [process.communicate(timeout=START_S) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    packages = own_state / "bastion" / "packages"
    assert len([p for p in (packages / "python").iterdir() if not p.name.startswith(".")]) == 1
    assert len([p for p in (packages / "npm").iterdir() if not p.name.startswith(".")]) == 1
    index = read_lock(user_index_path(own_state / "bastion"))
    assert sorted(index) == [f"npm: {MEMORY}", "python: mcp-server-time"]
    assert read_lock(lock_path(configs[0].resolve()))["one"] == read_lock(lock_path(configs[1].resolve()))["two"]
