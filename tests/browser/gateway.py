"""A real ``bastion serve --http`` for the console's browser tests: the default policy, API keys for an operator
(group ``admins``) and for an agent (no group), the console fixture server (tests/fixtures/console_server.py) whose
tool definitions come from a stage file, and the audit trail and approval queue in the test's folder."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support import BASTION, FIXTURES, READY_TIMEOUT, pids_with_tag

SERVER = "kb"


@dataclass
class Gateway:
    base: str  # http://127.0.0.1:PORT
    folder: Path
    process: subprocess.Popen
    admin_key: str
    agent_key: str
    tag: str  # in the fixture server's command line: how a test finds its process

    @property
    def mcp(self) -> str:
        return f"{self.base}/mcp"

    @property
    def admin(self) -> str:
        return f"{self.base}/admin"

    @property
    def audit(self) -> Path:
        return self.folder / "audit.jsonl"

    @property
    def stage_file(self) -> Path:
        return self.folder / "stage"

    def agent(self, mode: str = "legacy") -> Client:
        """An SDK client as the agent (no elicitation: a call that needs approval waits in the queue)."""
        http = httpx2.AsyncClient(headers={"x-api-key": self.agent_key}, timeout=httpx2.Timeout(120, read=300))
        return Client(streamable_http_client(self.mcp, http_client=http), mode=mode)

    def server_pids(self) -> list[int]:
        return pids_with_tag(self.tag)

    def kill_server(self) -> None:
        for pid in self.server_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stderr(self) -> str:
        return (self.folder / "bastion.stderr").read_text(errors="replace")


def make_key(file: Path, name: str, *args: str) -> str:
    made = subprocess.run([BASTION, "keys", "create", name, "--file", str(file), *args], capture_output=True,
                          text=True, timeout=120, check=True)
    return made.stdout.strip()


def start_gateway(folder: Path, tag: str) -> Gateway:
    keys = folder / "keys.json"
    admin_key = make_key(keys, "olga", "--groups", "admins")
    agent_key = make_key(keys, "agent-7")
    config = folder / "bastion.json"
    config.write_text(json.dumps({
        "ready_timeout": READY_TIMEOUT,
        "tools": {"exposure": "all"},
        "auth": {"api_keys": "keys.json"},
        "policy": {"audit": {"path": str(folder / "audit.jsonl")},
                   "approval": {"queue_dir": str(folder / "approvals"), "poll_seconds": 0.1, "timeout_seconds": 300}},
        "servers": {SERVER: {"command": sys.executable, "args": [str(FIXTURES / "console_server.py"), tag],
                             "env": {"CONSOLE_STAGE_FILE": str(folder / "stage")},
                             "sandbox": {"writable": [str(folder)]}}},
    }))
    stderr = folder / "bastion.stderr"
    process = subprocess.Popen([BASTION, "serve", str(config), "--http", "127.0.0.1:0"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=stderr.open("wb"),
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"serving MCP on (https?://[^ ]+)/mcp", stderr.read_text(errors="replace"))
        if found:
            return Gateway(found.group(1), folder, process, admin_key, agent_key, tag)
        if process.poll() is not None:
            raise AssertionError(f"bastion serve exited with {process.returncode}: {stderr.read_text()}")
        time.sleep(0.1)  # waiting on another process's output, which no event announces
    process.kill()
    raise AssertionError(f"bastion serve did not say where it listens: {stderr.read_text()}")


def stop_gateway(gateway: Gateway) -> None:
    if gateway.process.poll() is None:
        gateway.process.send_signal(signal.SIGTERM)
        try:
            gateway.process.wait(60)
        except subprocess.TimeoutExpired:
            gateway.process.kill()
            gateway.process.wait()
