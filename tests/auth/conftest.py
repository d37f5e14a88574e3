"""The auth tests' authorization server: tests/fixtures/oauth_server.py as a real process on 127.0.0.1, one per test
(tests rotate its keys and take its JWKS down), with three pre-registered clients; and ``bastion serve --http`` as
a real process whose ``auth`` table trusts it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.fixtures.oauth_server import AuthorizationServer, running
from tests.support import BASTION, FIXTURES, READY_TIMEOUT

# The gateway's own client (introspection, token exchange), an MCP client without a secret, and a service.
GATEWAY_CLIENT = ("bastion-gateway", "gateway-secret")
PUBLIC_CLIENT = "mcp-client"
SERVICE_CLIENT = ("reporting-service", "service-secret")
SERVER = "mem"  # the federated server's name: its tools are mem__remember and mem__recall


@pytest.fixture
def authorization_server() -> Iterator[AuthorizationServer]:
    with running(":".join(GATEWAY_CLIENT), PUBLIC_CLIENT, ":".join(SERVICE_CLIENT)) as server:
        yield server


@dataclass
class Gateway:
    url: str  # .../mcp
    base: str
    stderr: Path
    state: Path
    process: subprocess.Popen
    config: dict = field(default_factory=dict)

    def logged(self) -> str:
        """Everything the gateway wrote for people: its stderr and every file in its state directory (audit
        trail and logs)."""
        parts = [self.stderr.read_text(errors="replace")]
        for path in sorted(self.state.rglob("*")):
            if path.is_file():
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_gateway(tmp: Path, auth: dict[str, Any], *, port: int = 0, http: dict[str, Any] | None = None,
                  policy: Any = "off") -> Gateway:
    """``bastion serve --http 127.0.0.1:PORT`` with ``auth`` as its auth table, federating the small memory server
    over stdio (guardrails off: these tests are about who may call, not what the calls do)."""
    tmp.mkdir(parents=True, exist_ok=True)
    state = tmp / "state"
    state.mkdir(exist_ok=True)
    config = {"policy": policy, "guardrails": "off", "ready_timeout": READY_TIMEOUT, "http": http or {},
              "auth": auth, "servers": {SERVER: {"command": sys.executable,
                                                 "args": [str(FIXTURES / "memory_server.py")]}}}
    path = tmp / "bastion.json"
    path.write_text(json.dumps(config))
    stderr = tmp / "bastion.stderr"
    process = subprocess.Popen([BASTION, "serve", str(path), "--http", f"127.0.0.1:{port}"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr.open("wb"),
                               env={**os.environ, "PYTHONUNBUFFERED": "1", "XDG_STATE_HOME": str(state)})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"serving MCP on (https?://[^ ]+/mcp)", stderr.read_text(errors="replace"))
        if found:
            url = found.group(1)
            return Gateway(url, url[: -len("/mcp")], stderr, state, process, config)
        if process.poll() is not None:
            raise AssertionError(f"bastion serve exited with {process.returncode}: {stderr.read_text()}")
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"bastion serve did not say where it listens: {stderr.read_text()}")


@contextlib.contextmanager
def gateway(tmp: Path, auth: dict[str, Any], **options: Any) -> Iterator[Gateway]:
    served = start_gateway(tmp, auth, **options)
    try:
        yield served
    finally:
        served.stop()
