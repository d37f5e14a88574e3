"""``bastion serve`` as a real subprocess on a free loopback port, federating the SDK fixture server over stdio."""

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
from typing import Any, Iterator

import pytest

from tests.support import BASTION, FIXTURES, READY_TIMEOUT

IDENTITY_HEADER = "X-Bastion-Identity"
SERVER = "fx"


@dataclass
class Served:
    url: str
    base: str
    events: Path
    stderr: Path
    process: subprocess.Popen

    def events_seen(self) -> list[str]:
        return self.events.read_text().splitlines() if self.events.exists() else []


def start_bastion(tmp: Path, http: dict[str, Any] | None = None, *, extra_args: tuple[str, ...] = (),
                  servers: dict[str, Any] | None = None, auth: dict[str, Any] | None = None) -> Served:
    """``servers`` replaces the SDK fixture server, federated as ``fx``, with other entries; ``auth`` is the auth
    table (paths in it relative to ``tmp``)."""
    events = tmp / "events.log"
    config = tmp / "bastion.json"
    # Every tool listed: these tests are about the HTTP frontend, not the exposure the fixture's 25 tools would get.
    config.write_text(json.dumps({"policy": "off", "tools": {"exposure": "all"}, "ready_timeout": READY_TIMEOUT,
                                  **({"auth": auth} if auth is not None else {}),
                                  "http": http or {}, "servers": servers or {
        SERVER: {"command": sys.executable, "args": [str(FIXTURES / "sdk_server.py")],
                 "env": {"FIXTURE_EVENTS": str(events)}, "request_timeout": 900,
                 "sandbox": {"writable": [str(tmp)]}}}}))
    return serve_config(config, tmp, events, extra_args)


def serve_config(config: Path, tmp: Path, events: Path, extra_args: tuple[str, ...] = ()) -> Served:
    """``bastion serve CONFIG`` on a free loopback port, once it says where it listens (its stderr in ``tmp``)."""
    stderr = tmp / "bastion.stderr"
    process = subprocess.Popen([BASTION, "serve", str(config), "--http", "127.0.0.1:0", *extra_args],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr.open("wb"),
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"serving MCP on (https?://[^ ]+/mcp)", stderr.read_text())
        if found:
            url = found.group(1)
            return Served(url, url[: -len("/mcp")], events, stderr, process)
        if process.poll() is not None:
            raise AssertionError(f"bastion serve exited with {process.returncode}: {stderr.read_text()}")
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"bastion serve did not say where it listens: {stderr.read_text()}")


def stop_bastion(served: Served) -> None:
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGTERM)
        try:
            served.process.wait(60)
        except subprocess.TimeoutExpired:
            served.process.kill()
            served.process.wait()


@pytest.fixture(scope="module")
def bastion_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_bastion(tmp_path_factory.mktemp("http"), {
        "identity_header": IDENTITY_HEADER, "max_body_bytes": 65536, "heartbeat_seconds": 0.5, "body_timeout": 2,
        "stream_buffer_messages": 16})
    try:
        yield served
    finally:
        stop_bastion(served)
