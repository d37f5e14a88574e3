"""The lock file beside a configuration: entries kept across writes, a bad file named with its fix."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from bastion.launchers.install import _python_requirements
from bastion.launchers.lock import LockEntry, LockFileError, lock_path, read_lock, record
from bastion.launchers.plan import plan_launch


def entry(version: str, package: str = "@modelcontextprotocol/server-memory") -> LockEntry:
    return LockEntry("npm", package, package, version, f"sha512-{version}")


def test_the_lock_file_is_named_after_the_configuration(tmp_path: Path) -> None:
    assert lock_path(tmp_path / "claude_desktop_config.json") == tmp_path / "claude_desktop_config.json.lock.json"
    assert lock_path(None) is None


def test_a_clients_file_is_locked_in_the_state_directory_by_its_full_path(tmp_path: Path) -> None:
    state = tmp_path / "state"
    one = lock_path(tmp_path / "a" / ".cursor" / "mcp.json", True, state)
    other = lock_path(tmp_path / "b" / ".cursor" / "mcp.json", True, state)
    assert one is not None and other is not None and one != other
    assert one.parent == other.parent == state / "locks" and one.name.startswith("mcp.json-")
    long_name = lock_path(tmp_path / ("x" * 250 + ".json"), True, state)
    assert long_name is not None and len(long_name.name) < 100
    with pytest.raises(ValueError):
        lock_path(tmp_path / "mcp.json", True)


def test_record_keeps_the_other_servers_entries(tmp_path: Path) -> None:
    path = tmp_path / "bastion.toml.lock.json"
    assert read_lock(path) == {}
    record(path, {"memory": entry("1.0.0"), "other": entry("2.0.0", "x")})
    record(path, {"memory": entry("1.1.0")})
    assert read_lock(path) == {"memory": entry("1.1.0"), "other": entry("2.0.0", "x")}
    assert json.loads(path.read_text())["version"] == 1


def test_writers_at_once_lose_no_entry(tmp_path: Path) -> None:
    path = tmp_path / "c.json.lock.json"
    writers = [threading.Thread(target=record, args=(path, {f"server{i}": entry(f"1.0.{i}")})) for i in range(16)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert sorted(read_lock(path)) == sorted(f"server{i}" for i in range(16))


@pytest.mark.parametrize("text, said", [
    ("{not json", "not valid JSON"),
    ('{"servers": []}', 'no "servers" object'),
    ('{"servers": {"memory": {"ecosystem": "npm"}}}', "servers.memory lacks"),
])
def test_a_bad_lock_file_is_named_with_its_fix(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "c.json.lock.json"
    path.write_text(text)
    with pytest.raises(LockFileError) as raised:
        read_lock(path)
    assert str(path) in str(raised.value) and said in str(raised.value) and "delete it" in str(raised.value)


def test_python_requirements_keep_extras_and_pin_the_locked_version() -> None:
    plan = plan_launch("uvx", ["--with", "tzdata", "mcp-server-time[cli]>=2025"])
    assert plan is not None
    assert _python_requirements(plan, None) == ["mcp-server-time[cli]>=2025", "tzdata"]
    assert _python_requirements(plan, "2026.10.19") == ["mcp-server-time[cli]==2026.10.19", "tzdata"]
