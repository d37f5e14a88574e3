"""Servers from a stock Claude Desktop file (``npx -y`` and ``uvx``) through ``bastion run``, under the default
sandbox with no network grant, installed offline from the caches scripts/setup.sh fills.

The packages are the real ones from npm and PyPI, installed by the host's own npm and pip (run offline: npm from
its cache, pip from the wheelhouse), and the servers run inside bubblewrap: nothing here reaches a network.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from bastion.launchers.lock import lock_path, user_index_path
from tests.support import BASTION, ROOT, RawClient

WHEELHOUSE = ROOT / ".cache" / "wheelhouse"
MEMORY = "@modelcontextprotocol/server-memory"
OLDER_MEMORY = "2026.7.4"  # scripts/setup.sh caches this version beside the newest
START_S = 240.0  # installs and four servers starting on a busy 2-core machine; never a measured duration


@pytest.fixture(autouse=True)
def offline_package_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    """The package clients' own offline settings, inherited by the bastion process and its installs."""
    if not any(WHEELHOUSE.glob("mcp_server_time-*.whl")):
        pytest.fail(f"{WHEELHOUSE} has no mcp-server-time wheel: run scripts/setup.sh (it fills the caches "
                    "these offline tests install from)")
    monkeypatch.setenv("npm_config_offline", "true")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(WHEELHOUSE))


def stock_file(folder: Path, servers: dict, **rest) -> Path:
    path = folder / "claude_desktop_config.json"
    # Every tool listed: these tests wait for each server's tools in the list (four servers are past auto's bound).
    path.write_text(json.dumps({"mcpServers": servers, "tools": {"exposure": "all"}, **rest}, indent=2))
    return path


def npx(package: str, *args: str) -> dict:
    return {"command": "npx", "args": ["-y", package, *args]}


def lock_file_of(config: Path) -> Path:
    """A client's file is locked in Bastion's state directory, never beside it."""
    lock = lock_path(config.resolve(), True, Path(os.environ["XDG_STATE_HOME"]) / "bastion")
    assert lock is not None
    return lock


def lock_of(config: Path) -> dict:
    assert not config.with_name(config.name + ".lock.json").exists()
    return json.loads(lock_file_of(config).read_text())["servers"]


def cached_npm(what: str, spec: str) -> str:
    """A fact of the registry's document as npm's cache holds it (offline)."""
    return subprocess.run(["npm", "view", spec, what], capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


def wait_for_tools(client: RawClient, prefixes: set[str], deadline_s: float = START_S) -> list[dict]:
    """tools/list until every server's tools are in (servers that come late join with list_changed)."""
    deadline = time.monotonic() + deadline_s
    request_id = 100
    while True:
        request_id += 1
        tools = client.request(request_id, "tools/list", {}, timeout=deadline_s)["result"]["tools"]
        present = {tool["name"].split("__", 1)[0] for tool in tools}
        if prefixes <= present or time.monotonic() > deadline:
            assert prefixes <= present, f"missing servers: {prefixes - present}"
            return tools
        time.sleep(0.5)


def call(client: RawClient, name: str, arguments: dict) -> str:
    answer = client.request(name, "tools/call", {"name": name, "arguments": arguments}, timeout=120)
    assert "result" in answer, answer
    assert not answer["result"].get("isError"), answer
    return "".join(part.get("text", "") for part in answer["result"]["content"])


def run_and_close(config: Path, work) -> str:
    client = RawClient(config)
    try:
        client.initialize()
        work(client)
    except BaseException as failure:
        _, stderr = client.close()
        failure.add_note(f"the gateway's stderr (its end):\n{stderr[-6000:]}")  # why a server never came
        raise
    _, stderr = client.close()
    return stderr


@pytest.mark.slow  # installs real npm and PyPI packages
def test_a_stock_claude_desktop_file_of_npx_and_uvx_servers_works_sandboxed_offline(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "note.txt").write_text("written before the test\n")
    config = stock_file(tmp_path, {
        "filesystem": npx("@modelcontextprotocol/server-filesystem", str(data)),
        "memory": npx(MEMORY),
        "everything": npx("@modelcontextprotocol/server-everything"),
        "time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone", "UTC"]},
    }, policy="off", guardrails={"taint": "off"})  # four untrusted servers and a client nobody answers for
    seen: dict[str, str] = {}

    def work(client: RawClient) -> None:
        tools = wait_for_tools(client, {"filesystem", "memory", "everything", "time"})
        assert {"memory__read_graph", "filesystem__read_text_file", "everything__echo",
                "time__get_current_time"} <= {tool["name"] for tool in tools}
        seen["file"] = call(client, "filesystem__read_text_file", {"path": str(data / "note.txt")})
        seen["graph"] = call(client, "memory__read_graph", {})
        seen["echo"] = call(client, "everything__echo", {"message": "through the sandbox"})
        seen["time"] = call(client, "time__get_current_time", {"timezone": "UTC"})

    stderr = run_and_close(config, work)
    assert seen["file"] == "written before the test\n"
    assert '"entities"' in seen["graph"]
    assert "through the sandbox" in seen["echo"]
    assert '"timezone": "UTC"' in seen["time"] or "UTC" in seen["time"]
    for name in ("filesystem", "memory", "everything", "time"):
        # the installed program runs inside the sandbox, with no network granted
        assert re.search(rf"server '{name}' sandboxed: .*network off", stderr), stderr[-3000:]
        assert re.search(rf"server {name}: (npx|uvx) \S+ \S+ \((newest|locked)\), installed in "
                         rf"{re.escape(os.environ['XDG_STATE_HOME'])}/bastion/packages/", stderr), stderr[-3000:]

    lock = lock_of(config)
    assert sorted(lock) == ["everything", "filesystem", "memory", "time"]
    assert lock["memory"]["ecosystem"] == "npm" and lock["memory"]["package"] == MEMORY
    assert lock["memory"]["integrity"] == cached_npm("dist.integrity", f"{MEMORY}@{lock['memory']['version']}")
    assert lock["time"]["ecosystem"] == "python" and re.fullmatch(r"sha256=[0-9a-f]{64}", lock["time"]["integrity"])
    wheel = next(WHEELHOUSE.glob(f"mcp_server_time-{lock['time']['version']}-*.whl"))
    import hashlib

    assert lock["time"]["integrity"] == "sha256=" + hashlib.sha256(wheel.read_bytes()).hexdigest()

    # The whole tree is locked: every dependency with its version and hash
    sdk = lock["memory"]["tree"]["node_modules/@modelcontextprotocol/sdk"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", sdk["version"]) and sdk["integrity"].startswith("sha512-")
    assert lock["time"]["tree"]["mcp"]["integrity"].startswith("sha256=") and "mcp-server-time" in lock["time"]["tree"]

    # A second start uses what the lock says, installed already: nothing to resolve
    again = run_and_close(config, lambda client: wait_for_tools(client, {"filesystem", "memory", "everything", "time"}))
    for name in ("filesystem", "memory", "everything", "time"):
        assert f"{lock[name]['version']} (locked)" in again
    assert lock_of(config) == lock


def forget_what_other_files_locked() -> None:
    """This user's other configurations' locks (earlier tests') would be reused for the same request."""
    user_index_path(Path(os.environ["XDG_STATE_HOME"]) / "bastion").unlink(missing_ok=True)


@pytest.mark.slow  # installs real npm packages twice
def test_a_locked_older_version_is_honoured_and_servers_update_moves_it_on(tmp_path: Path) -> None:
    forget_what_other_files_locked()
    config = stock_file(tmp_path, {"memory": npx(MEMORY)}, policy="off")
    older_integrity = cached_npm("dist.integrity", f"{MEMORY}@{OLDER_MEMORY}")
    newest = cached_npm("version", MEMORY)
    assert newest != OLDER_MEMORY

    unlocked = check(config)
    assert any("not locked yet" in finding["message"] for finding in unlocked), unlocked

    lock_file_of(config).parent.mkdir(parents=True, exist_ok=True)
    lock_file_of(config).write_text(json.dumps({"version": 1, "servers": {"memory": {
        "ecosystem": "npm", "package": MEMORY, "requested": MEMORY, "version": OLDER_MEMORY,
        "integrity": older_integrity}}}))
    stderr = run_and_close(config, lambda client: wait_for_tools(client, {"memory"}))
    assert f"npx {MEMORY} {OLDER_MEMORY} (locked)" in stderr
    assert lock_of(config)["memory"]["version"] == OLDER_MEMORY
    assert check(config) == []

    update = subprocess.run([BASTION, "servers", "update", "memory", "--config", str(config)],
                            capture_output=True, text=True, timeout=START_S)
    assert update.returncode == 0, update.stderr
    assert update.stdout.strip() == f"memory: {MEMORY} {OLDER_MEMORY} -> {newest}"
    assert lock_of(config)["memory"]["version"] == newest
    assert lock_of(config)["memory"]["integrity"] == cached_npm("dist.integrity", f"{MEMORY}@{newest}")

    stderr = run_and_close(config, lambda client: wait_for_tools(client, {"memory"}))
    assert f"npx {MEMORY} {newest} (locked)" in stderr

    unchanged = subprocess.run([BASTION, "servers", "update", "--config", str(config)],
                               capture_output=True, text=True, timeout=START_S)
    assert unchanged.returncode == 0, unchanged.stderr
    assert unchanged.stdout.strip() == f"memory: {MEMORY} {newest} (unchanged)"


def test_a_lock_whose_hash_does_not_match_refuses_the_package(tmp_path: Path) -> None:
    config = stock_file(tmp_path, {"memory": npx(MEMORY), "time": {"command": "uvx", "args": ["mcp-server-time"]}},
                        policy="off")
    forged = "sha512-" + "A" * 86 + "=="
    lock_file_of(config).parent.mkdir(parents=True, exist_ok=True)
    lock_file_of(config).write_text(json.dumps({"version": 1, "servers": {"memory": {
        "ecosystem": "npm", "package": MEMORY, "requested": MEMORY, "version": OLDER_MEMORY, "integrity": forged}}}))
    refusals: list[dict] = []

    def work(client: RawClient) -> None:
        wait_for_tools(client, {"time"})
        # A call of the refused server's tool waits for its start to settle, then answers why it is not there.
        refusals.append(client.request("call", "tools/call", {"name": "memory__read_graph", "arguments": {}},
                                       timeout=START_S))

    stderr = run_and_close(config, work)
    assert forged in json.dumps(refusals[0]["error"]), refusals
    assert f"the lock file records {forged}" in stderr
    said = [line for line in stderr.splitlines() if "the lock file records" in line]
    assert len(said) == 1, said  # said once, not retried in a loop


def test_a_package_that_cannot_be_installed_says_why_in_the_package_clients_words(tmp_path: Path) -> None:
    forget_what_other_files_locked()  # an earlier test's lock of an older memory server would be reused
    config = stock_file(tmp_path, {
        "missing-npm": npx("@modelcontextprotocol/server-that-does-not-exist"),
        "missing-pypi": {"command": "uvx", "args": ["mcp-server-that-does-not-exist"]},
        "memory": npx(MEMORY),
    }, policy="off")
    stderr = run_and_close(config, lambda client: (wait_for_tools(client, {"memory"}), time.sleep(3)))
    # An install slower than the gateway's first answer (a loaded machine) adds the gateway's "not ready yet" line
    # before the failure: a notice of the wait, not a second telling of why the install failed.
    warnings = [line for line in stderr.splitlines() if "WARNING" in line and "is not ready yet" not in line]
    npm_lines = [line for line in warnings if "server missing-npm" in line]
    assert len(npm_lines) == 1, stderr[-3000:]
    assert "npm install @modelcontextprotocol/server-that-does-not-exist failed" in stderr
    assert "npm error code ENOTCACHED" in stderr  # npm's own words, quoted
    pip_lines = [line for line in warnings if "server missing-pypi" in line]
    assert len(pip_lines) == 1, stderr[-3000:]
    assert "No matching distribution found for mcp-server-that-does-not-exist" in stderr
    assert "missing-npm" not in lock_of(config) and "memory" in lock_of(config)

    update = subprocess.run([BASTION, "servers", "update", "--config", str(config)],
                            capture_output=True, text=True, timeout=START_S)
    assert update.returncode == 1, update.stderr
    assert f"memory: {MEMORY} {lock_of(config)['memory']['version']} (unchanged)" in update.stdout
    assert "missing-npm: not updated: npm install" in update.stderr and "ENOTCACHED" in update.stderr
    assert "missing-pypi: not updated: pip install" in update.stderr


def test_a_dependency_changed_since_it_was_locked_is_refused_by_the_package_client(tmp_path: Path) -> None:
    config = stock_file(tmp_path, {"memory": npx(MEMORY), "time": {"command": "uvx", "args": ["mcp-server-time"]}},
                       policy="off")
    lock_file = lock_file_of(config)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock_file.write_text(json.dumps({"version": 1, "servers": {"memory": {
        "ecosystem": "npm", "package": MEMORY, "requested": MEMORY, "version": OLDER_MEMORY,
        "integrity": cached_npm("dist.integrity", f"{MEMORY}@{OLDER_MEMORY}")}}}))
    run_and_close(config, lambda client: wait_for_tools(client, {"memory", "time"}))
    lock = lock_of(config)
    assert lock["memory"]["version"] == OLDER_MEMORY and "node_modules/ajv" in lock["memory"]["tree"]

    # Another machine, or a cleared packages folder: the locked trees are installed again, with one dependency's
    # hash no longer the one recorded.
    packages = Path(os.environ["XDG_STATE_HOME"]) / "bastion" / "packages"
    for installed in [*(packages / "npm").glob(f"{MEMORY.replace('/', '+')}@{OLDER_MEMORY}-*"),
                      *(packages / "python").glob(f"mcp-server-time=={lock['time']['version']}-*")]:
        subprocess.run(["rm", "-rf", str(installed)], check=True)
    lock["memory"]["tree"]["node_modules/ajv"]["integrity"] = "sha512-" + "B" * 86 + "=="
    lock["time"]["tree"]["tzdata"]["integrity"] = "sha256=" + "0" * 64
    lock_file.write_text(json.dumps({"version": 1, "servers": lock}))
    # a long ready_timeout: the client's initialize is answered once both servers have failed
    config.write_text(json.dumps({**json.loads(config.read_text()), "ready_timeout": START_S}))
    stderr = run_and_close(config, lambda client: None)
    assert "npm ci @modelcontextprotocol/server-memory@2026.7.4 (locked tree) failed" in stderr, stderr[-3000:]
    assert "npm error code EINTEGRITY" in stderr
    assert "pip install mcp-server-time==2026.10.19 (locked tree) failed" in stderr
    assert "DO NOT MATCH THE HASHES" in stderr, stderr[-3000:]


def check(config: Path) -> list[dict]:
    result = subprocess.run([BASTION, "check", str(config), "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)["findings"]
