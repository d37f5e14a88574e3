"""The malicious server of the escape suite, run through ``bastion run`` as a user would: the default profile
stops each attack, and the same server with ``sandbox = "none"`` succeeds at each, so every check can fail."""

from __future__ import annotations

import json
import socket
import sys
import threading
import uuid
from pathlib import Path

import pytest

from tests.support import READY_TIMEOUT, RawClient

MALICIOUS = Path(__file__).parent / "sandbox" / "malicious_server.py"
SECRET = "BASTION_TEST_SECRET_TOKEN"


@pytest.fixture
def loopback_service():
    """A TCP service on the host's loopback that a confined server must not reach."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            with connection:
                connection.sendall(b"host service banner\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    listener.close()


def _attacks(tmp_path: Path, sandbox, monkeypatch, port: int) -> dict[str, dict]:
    monkeypatch.setenv(SECRET, "s3cr3t-value")  # in Bastion's environment, never granted to the server
    outside = tmp_path / "outside"
    outside.mkdir()
    config = tmp_path / "bastion.json"
    # Policy off: every attack must reach the server, so it is the sandbox alone that stops it.
    config.write_text(json.dumps({"policy": "off", "ready_timeout": READY_TIMEOUT, "servers": {"evil": {
        "command": sys.executable, "args": [str(MALICIOUS)], "sandbox": sandbox}}}))
    calls = {
        "read_shadow": ("read_file", {"path": "/etc/shadow"}),
        "list_root_home": ("list_dir", {"path": "/root"}),
        "write_outside": ("write_file", {"path": str(outside / "pwned"), "method": "direct"}),
        "environment": ("environment", {}),
        "tcp_loopback": ("tcp_connect", {"host": "127.0.0.1", "port": port}),
        "processes": ("list_processes", {}),
    }
    client = RawClient(config)
    outcomes = {}
    try:
        client.initialize()
        for i, (label, (tool, arguments)) in enumerate(calls.items()):
            answer = client.request(i + 1, "tools/call", {"name": f"evil__{tool}", "arguments": arguments}, timeout=60)
            outcomes[label] = json.loads(answer["result"]["content"][0]["text"])
    finally:
        client.close()
    outcomes["wrote_outside"] = {"ok": (outside / "pwned").exists()}
    return outcomes


def test_default_profile_stops_each_attack(tmp_path, monkeypatch, loopback_service):
    outcomes = _attacks(tmp_path, "default", monkeypatch, loopback_service)
    assert not outcomes["read_shadow"]["ok"]
    # Only the interpreter's own install may show through (here Python lives under /root/.pyenv), read-only.
    assert not outcomes["list_root_home"]["ok"] or set(outcomes["list_root_home"]["entries"]) <= {".pyenv"}
    assert not outcomes["wrote_outside"]["ok"]
    assert SECRET not in json.dumps(outcomes["environment"])
    assert not outcomes["tcp_loopback"]["ok"]
    assert not any("pytest" in command for command in outcomes["processes"]["commands"])


def test_without_the_sandbox_each_attack_succeeds(tmp_path, monkeypatch, loopback_service):
    outcomes = _attacks(tmp_path, "none", monkeypatch, loopback_service)
    assert outcomes["read_shadow"]["ok"]
    assert outcomes["list_root_home"]["ok"] and set(outcomes["list_root_home"]["entries"]) - {".pyenv"}
    assert outcomes["wrote_outside"]["ok"]
    assert SECRET in json.dumps(outcomes["environment"])
    assert outcomes["tcp_loopback"]["ok"] and "host service banner" in outcomes["tcp_loopback"]["banner"]
    assert any("pytest" in command for command in outcomes["processes"]["commands"])


def test_a_server_over_its_memory_limit_is_reported_and_restarted(tmp_path):
    from tests.support import raw_server, wait_for

    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {"raw": raw_server(sandbox={"memory": "64MiB"})}, "policy": "off",
                                  "ready_timeout": READY_TIMEOUT}))
    client = RawClient(config)
    try:
        client.initialize()
        answer = client.request(1, "tools/call", {"name": "raw__hog", "arguments": {"mib": 400}}, timeout=60)
        assert answer["error"]["code"] == -32001
        assert "memory limit 64 MiB exceeded" in answer["error"]["message"]

        def back() -> bool:
            reply = client.request(f"r{uuid.uuid4().hex}", "tools/call", {"name": "raw__echo", "arguments": {"text": "back"}})
            return "result" in reply

        assert wait_for(back, timeout=30, interval=0.3)
    finally:
        client.close()
