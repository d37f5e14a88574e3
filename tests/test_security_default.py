"""Security on for every configuration: a plain client file gets the default policy, the approval queue and the
audit trail (under XDG_STATE_HOME); turning them off takes `policy = "off"` and is warned at every start. And the
demo configuration works from any working directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import BASTION, FIXTURES, RawClient, raw_server, wait_for

POLICY_OFF_WARNING = "policy is off: every call is allowed and nothing is audited"


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    """This test's own XDG_STATE_HOME, inherited by every Bastion process it starts."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home / "bastion"


def _bastion(*args: str, timeout: float = 120, **options) -> subprocess.CompletedProcess:
    return subprocess.run([BASTION, *args], capture_output=True, text=True, timeout=timeout, **options)


def _pending() -> list[dict]:
    listed = _bastion("approvals", "--json", timeout=30)
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


def test_a_plain_mcp_servers_file_runs_the_default_policy_with_the_queue_and_the_audit_trail(tmp_path, state):
    config = tmp_path / "claude_desktop_config.json"
    # ready_timeout only so that a slow machine still lists the tool at the first answer.
    config.write_text(json.dumps({"ready_timeout": 120, "mcpServers": {
        "raw": {"command": sys.executable, "args": [str(FIXTURES / "raw_server.py")]}}}))
    client = RawClient(config)
    try:
        client.initialize()
        # An untrusted server's tool (every server of a plain file is) waits for a person, in the local queue.
        client.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "raw__echo", "arguments": {"text": "approved"}}})
        assert wait_for(lambda: any(item["tool"] == "echo" for item in _pending()), timeout=60)
        (waiting,) = [item for item in _pending() if item["tool"] == "echo"]
        approved = _bastion("approve", waiting["id"], timeout=30)
        assert approved.returncode == 0, approved.stderr
        answer = client.recv_response(1, timeout=60)
        assert answer["result"]["content"][0]["text"] == "approved"
        assert sorted(state.glob("audit*.jsonl")), f"no audit trail under {state}"
    finally:
        _, stderr = client.close()
    assert POLICY_OFF_WARNING not in stderr
    verified = _bastion("audit", "verify", str(state / "audit.jsonl"), timeout=60)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_bastions_own_file_without_a_policy_section_gets_the_default_policy_too(tmp_path, state):
    config = tmp_path / "bastion.toml"
    config.write_text(f'[servers.raw]\ncommand = "{sys.executable}"\nargs = ["{FIXTURES / "raw_server.py"}"]\n')
    checked = _bastion("check", "--json", str(config), timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert "the default policy" in json.loads(checked.stdout)["policy"]
    call = subprocess.Popen([BASTION, "call", str(config), "raw__echo", "--args", '{"text": "x"}', "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: [item["tool"] for item in _pending()] == ["echo"], timeout=60)
        assert call.poll() is None  # still waiting for a person
    finally:
        call.kill()
        call.communicate()


@pytest.mark.parametrize("off", ['policy = "off"', "policy = false"])
def test_policy_off_is_explicit_and_warned_at_every_start(tmp_path, state, off):
    config = tmp_path / "bastion.toml"
    config.write_text(f'{off}\n[servers.raw]\ncommand = "{sys.executable}"\nargs = ["{FIXTURES / "raw_server.py"}"]\n')
    for _ in range(2):
        called = _bastion("call", str(config), "raw__echo", "--args", '{"text": "unasked"}')
        assert called.returncode == 0, called.stderr
        assert json.loads(called.stdout)["content"][0]["text"] == "unasked"
        assert POLICY_OFF_WARNING in called.stderr
    assert not list(state.glob("audit*.jsonl"))
    checked = _bastion("check", str(config), timeout=60)
    assert checked.returncode == 0 and "policy: off" in checked.stderr


def test_policy_off_in_a_client_file_and_under_bastion_run(tmp_path, state):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"policy": "off", "ready_timeout": 120, "mcpServers": {"raw": raw_server()}}))
    client = RawClient(config)
    try:
        client.initialize()
        answer = client.request(1, "tools/call", {"name": "raw__echo", "arguments": {"text": "direct"}}, timeout=60)
        assert answer["result"]["content"][0]["text"] == "direct"
    finally:
        _, stderr = client.close()
    assert POLICY_OFF_WARNING in stderr


def test_a_policy_switch_that_is_not_off_is_an_error_naming_the_fix(tmp_path):
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"policy": "none", "servers": {}}))
    checked = _bastion("check", str(config), timeout=60)
    assert checked.returncode == 2 and "policy" in checked.stderr and '"off"' in checked.stderr


def test_the_demo_configuration_works_from_any_working_directory(tmp_path, state):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for cwd in (elsewhere, Path("/tmp")):
        listed = _bastion("tools", "-q", timeout=240, cwd=cwd)
        assert listed.returncode == 0, listed.stderr
        servers = {line.split()[1] for line in listed.stdout.splitlines()[1:] if line.strip()}
        assert {"files", "git", "time"} <= servers, listed.stdout
        assert "files__read_text_file" in listed.stdout
    assert (state / "scratch" / "files" / "hello.txt").is_file()  # the demo's data follows XDG_STATE_HOME too
