"""``[metrics] listen`` beside ``bastion run`` on stdio, driven by the official SDK's stdio client of both eras: the
separate listener serves /metrics, /healthz and /readyz to anyone who reaches it; readiness follows the audit
trail; the table's errors name the key."""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import subprocess
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from prometheus_client.parser import text_string_to_metric_families

from tests.support import BASTION, READY_TIMEOUT, raw_server, wait_for

pytestmark = pytest.mark.slow

PERMIT_ALL = '@id("all") permit (principal, action, resource);\n'


def write_config(tmp: Path, metrics: Any, **extra: Any) -> Path:
    (tmp / "all.cedar").write_text(PERMIT_ALL)
    path = tmp / "bastion.json"
    path.write_text(json.dumps({
        "servers": {"raw": raw_server(trust="trusted")}, "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"},
        "policy": {"policy_files": ["all.cedar"], "audit": {"path": str(tmp / "audit.jsonl")}},
        "metrics": metrics, **extra}))
    return path


def client(config: Path, errlog: Any, mode: str) -> Client:
    return Client(stdio_client(StdioServerParameters(command=BASTION, args=["run", str(config)]), errlog=errlog),
                  mode=mode, read_timeout_seconds=120)


def listener_of(stderr: Path) -> str:
    """The metrics listener's base URL, once ``bastion run`` has said it."""
    found: list[str] = []

    def said() -> bool:
        match = re.search(r"serving metrics on (http://[^ ]+)/metrics", stderr.read_text(errors="replace"))
        if match:
            found.append(match.group(1))
        return bool(match)

    assert wait_for(said, timeout=120), stderr.read_text()
    return found[0]


def samples(text: str) -> list[Any]:
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def value(text: str, name: str, **labels: str) -> float:
    return sum(s.value for s in samples(text) if s.name == name and all(s.labels.get(k) == v
                                                                         for k, v in labels.items()))


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_stdio_gateway_serves_metrics_and_health_on_its_own_listener(tmp_path: Path, mode: str) -> None:
    config = write_config(tmp_path, {"listen": "127.0.0.1:0"})
    stderr = tmp_path / "stderr"
    with stderr.open("w") as errlog:
        async with client(config, errlog, mode) as session:
            for _ in range(2):
                assert not (await session.call_tool("raw__echo", {"text": "hi"})).is_error
            base = listener_of(stderr)
            async with httpx2.AsyncClient(timeout=60) as http:
                scraped = await http.get(f"{base}/metrics")  # no credentials: this listener asks for none
                assert scraped.status_code == 200
                text = scraped.text
                assert value(text, "bastion_requests_total", method="tools/call", tool="raw__echo", server="raw",
                             outcome="ok", identity="configured") == 2
                assert value(text, "bastion_sessions_open", transport="stdio") == 1
                assert value(text, "bastion_client_received_bytes_total", transport="stdio") > 0
                assert value(text, "bastion_server_up", server="raw") == 1
                ready = await http.get(f"{base}/readyz")
                assert ready.status_code == 200 and ready.json()["status"] == "ready"
                assert (await http.get(f"{base}/healthz")).status_code == 200
                assert (await http.get(f"{base}/mcp")).status_code == 404  # nothing of MCP here


async def test_readiness_follows_an_audit_trail_that_cannot_be_written(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"listen": "127.0.0.1:0"})
    stderr = tmp_path / "stderr"
    audit = tmp_path / "audit.jsonl"
    with stderr.open("w") as errlog:
        async with client(config, errlog, "legacy") as session:
            assert not (await session.call_tool("raw__echo", {"text": "first"})).is_error
            base = listener_of(stderr)
            assert wait_for(lambda: audit.exists() and audit.stat().st_size > 0, timeout=60)
            # The sealer that writes the trail may write no more than it has: every record from now cannot be.
            [sealer] = [pid for pid in _children_of_bastion(stderr) if b"audit_sealer" in _cmdline(pid)]
            resource.prlimit(sealer, resource.RLIMIT_FSIZE, (audit.stat().st_size, resource.RLIM_INFINITY))
            url = f"{base}/readyz"

            def answers(status: int) -> bool:
                return httpx2.get(url, timeout=60).status_code == status

            assert answers(200)
            assert not (await session.call_tool("raw__echo", {"text": "unwritable"})).is_error
            assert await asyncio.to_thread(wait_for, lambda: answers(503), 60)
            body = httpx2.get(url, timeout=60).json()
            assert body["checks"]["audit"] == {"ok": False} and body["checks"]["servers"]["ok"]
            assert str(tmp_path) not in json.dumps(body)
            assert value(httpx2.get(f"{base}/metrics", timeout=60).text, "bastion_audit_writable") == 0
            resource.prlimit(sealer, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            assert not (await session.call_tool("raw__echo", {"text": "again"})).is_error
            assert await asyncio.to_thread(wait_for, lambda: answers(200), 60)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _children_of_bastion(stderr: Path) -> list[int]:
    """The processes whose parent is a ``bastion run`` (this test's one)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(") ", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"bastion\x00run\x00" in _cmdline(parent) and str(stderr.parent).encode() in _cmdline(parent):
            found.append(int(entry))
    return found


@pytest.mark.parametrize(("metrics", "named"), [
    ({"listen": "nowhere"}, "metrics.listen"),
    ({"listen": "127.0.0.1:99999"}, "metrics.listen"),
    ({"identity_labels": "email"}, "metrics.identity_labels"),
    ({"enabled": True, "port": 9464}, "metrics.port"),
])
def test_a_wrong_metrics_table_is_refused_naming_the_key(tmp_path: Path, metrics: dict[str, Any], named: str) -> None:
    config = write_config(tmp_path, metrics)
    done = subprocess.run([BASTION, "run", str(config)], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert named in done.stderr, done.stderr


def test_a_metrics_listener_address_in_use_is_said_at_start(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = write_config(tmp_path, {"listen": f"127.0.0.1:{port}"})
        done = subprocess.run([BASTION, "run", str(config)], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port} (metrics.listen)" in done.stderr, done.stderr
