"""``bastion check`` on launcher servers: what would need the network at the next start, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bastion.config import load_config
from bastion.diagnostics import diagnose
import os
import sys

from bastion.launchers.install import MARKER, install_folder
from bastion.launchers.lock import LockEntry, lock_path, record

MEMORY = "@modelcontextprotocol/server-memory"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # npm, and neither npx nor uvx needed
    return tmp_path / "state" / "bastion" / "packages"


def findings_of(path: Path, servers: dict) -> list:
    path.write_text(json.dumps({"mcpServers": servers, "policy": "off"}))
    return [f for f in diagnose(load_config(path)) if f.where.startswith("mcpServers.")]


def test_unlocked_then_locked_but_absent_then_installed(tmp_path: Path, state: Path) -> None:
    config = tmp_path / "claude_desktop_config.json"
    servers = {"memory": {"command": "npx", "args": ["-y", MEMORY]},
               "time": {"command": "uvx", "args": ["mcp-server-time"]}}
    unlocked = findings_of(config, servers)
    assert [(f.level, f.where) for f in unlocked] == [("warning", "mcpServers.memory.command"),
                                                      ("warning", "mcpServers.time.command")]
    assert "not locked yet" in unlocked[0].message and "npm" in unlocked[0].message
    assert "pip" in unlocked[1].message
    assert f"bastion servers update memory --config {config}" in unlocked[0].fix
    assert not any("not on PATH" in f.message for f in unlocked), "uvx is never run, so it need not exist"

    npm_tree = {f"node_modules/{MEMORY}": {"version": "1.0.0", "integrity": "sha512-x"}}
    python_tree = {"mcp-server-time": {"version": "2026.10.19", "integrity": "sha256=y"}}
    # a client's file is locked in the state directory, never beside it
    lock = lock_path(config.resolve(), True, state.parent)
    assert lock is not None and lock.parent == state.parent / "locks"
    record(lock, {
        "memory": LockEntry("npm", MEMORY, MEMORY, "1.0.0", "sha512-x", npm_tree),
        "time": LockEntry("python", "mcp-server-time", "mcp-server-time", "2026.10.19", "sha256=y", python_tree)})
    absent = findings_of(config, servers)
    assert len(absent) == 2 and all("locked but not installed" in f.message for f in absent)

    interpreter = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    for ecosystem, package, version, tree, python in (
            ("npm", MEMORY, "1.0.0", npm_tree, ""),
            ("python", "mcp-server-time", "2026.10.19", python_tree, interpreter)):
        folder = install_folder(state, ecosystem, package, version, tree, python)
        folder.mkdir(parents=True)
        (folder / MARKER).write_text(json.dumps({"version": version}))
    assert findings_of(config, servers) == []

    servers["memory"]["args"] = ["-y", f"{MEMORY}@^2"]  # another request than the lock's: resolved again
    again = findings_of(config, servers)
    assert [f.where for f in again] == ["mcpServers.memory.command"] and "not locked yet" in again[0].message


def test_a_launcher_form_bastion_cannot_install_is_a_warning(tmp_path: Path, state: Path) -> None:
    found = findings_of(tmp_path / "c.json", {"shell": {"command": "npx", "args": ["-c", "mcp-thing --serve"]}})
    assert [(f.level, f.where) for f in found] == [("warning", "mcpServers.shell.args")]
    assert "'-c'" in found[0].message and "network" in found[0].message


def test_a_request_another_configuration_locked_and_installed_needs_no_network(tmp_path: Path, state: Path) -> None:
    from bastion.launchers.lock import user_index_path

    tree = {f"node_modules/{MEMORY}": {"version": "1.0.0", "integrity": "sha512-x"}}
    record(user_index_path(state.parent), {f"npm: {MEMORY}": LockEntry("npm", MEMORY, MEMORY, "1.0.0", "sha512-x",
                                                                       tree)})
    folder = install_folder(state, "npm", MEMORY, "1.0.0", tree)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(json.dumps({"version": "1.0.0"}))
    assert findings_of(tmp_path / "mcp.json", {"memory": {"command": "npx", "args": ["-y", MEMORY]}}) == []
    pinned = findings_of(tmp_path / "mcp.json", {"memory": {"command": "npx", "args": ["-y", f"{MEMORY}@1.0.0"]}})
    assert len(pinned) == 1 and "not locked yet" in pinned[0].message  # another request
