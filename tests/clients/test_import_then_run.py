"""The first hour: import a stock Claude Desktop file of ``npx`` servers, run it through Bastion with the default
policy and audit on, and use the folders it lists without being asked.

The packages are installed by the host's npm from its cache (offline), as tests/launchers does; the servers run
in the default sandbox with no network.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.support import RawClient

START_S = 240.0  # package installs and two servers starting on a busy 2-core machine; never a measured duration


@pytest.fixture
def offline_npm(monkeypatch):
    cache = subprocess.run(["npm", "config", "get", "cache"], capture_output=True, text=True, check=True,
                           timeout=60).stdout.strip()
    monkeypatch.setenv("npm_config_cache", cache)  # the cache set-up filled, whatever HOME the test gives
    monkeypatch.setenv("npm_config_offline", "true")


def tools_of(client: RawClient, prefixes: set[str]) -> set[str]:
    deadline = time.monotonic() + START_S
    request_id = 100
    while True:
        request_id += 1
        names = {tool["name"] for tool in client.request(request_id, "tools/list", {}, timeout=START_S)["result"]["tools"]}
        if prefixes <= {name.split("__", 1)[0] for name in names} or time.monotonic() > deadline:
            return names
        time.sleep(0.5)


def call(client: RawClient, name: str, arguments: dict) -> str:
    # A read-only tool of a reviewed server runs at once: an approval wait would run past this deadline.
    answer = client.request(name, "tools/call", {"name": name, "arguments": arguments}, timeout=90)
    assert "result" in answer and not answer["result"].get("isError"), answer
    return "".join(part.get("text", "") for part in answer["result"]["content"])


def test_an_imported_stock_file_runs_with_security_on_and_reads_its_folders_at_once(machine, monkeypatch, offline_npm):
    for variable, value in (("HOME", machine.home), ("XDG_CONFIG_HOME", machine.config_home),
                            ("XDG_STATE_HOME", machine.state_home), ("XDG_CACHE_HOME", machine.home / ".cache")):
        monkeypatch.setenv(variable, str(value))
    machine.write_json(".config/Claude/claude_desktop_config.json", {"mcpServers": {
        "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem",
                                                  f"{machine.home}/Documents", f"{machine.home}/Desktop"]},
        "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]},
    }})
    imported = machine.bastion("import")
    assert imported.returncode == 0, imported.stderr
    assert "[tools]" not in machine.bastion_toml.read_text()
    # Every tool listed, so the test can wait for both servers' tools: the two servers' 23 tools are past the
    # default exposure's bound, which would list the search meta-tools instead.
    with machine.bastion_toml.open("a") as toml:
        toml.write('\n[tools]\nexposure = "all"\n')

    client = RawClient(machine.bastion_toml)
    seen: dict[str, str] = {}
    try:
        client.initialize()
        names = tools_of(client, {"filesystem", "memory"})
        assert {"filesystem__read_text_file", "memory__read_graph"} <= names, names
        seen["note"] = call(client, "filesystem__read_text_file", {"path": f"{machine.home}/Documents/notes.txt"})
        seen["allowed"] = call(client, "filesystem__list_allowed_directories", {})
        seen["graph"] = call(client, "memory__read_graph", {})
    finally:
        _, stderr = client.close()
    assert seen["note"] == "groceries\n", stderr[-3000:]
    assert f"{machine.home}/Documents" in seen["allowed"] and f"{machine.home}/Desktop" in seen["allowed"]
    assert '"entities"' in seen["graph"]

    # Security was on: the calls are in an audit trail, and it verifies.
    trail = machine.state_home / "bastion" / "audit.jsonl"
    verified = machine.bastion("audit", "verify", str(trail))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    recorded = "".join(path.read_text() for path in trail.parent.glob("audit*.jsonl"))
    assert "read_text_file" in recorded and "read_graph" in recorded
