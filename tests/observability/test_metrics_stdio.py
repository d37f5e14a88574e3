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
AWS_KEY = "AKIAQ3EGRV7HZ2K4MPXN"
APPROVE_ECHO = """
@id("lists") permit (principal, action in [Bastion::Action::"list_tools", Bastion::Action::"list_resources",
                                           Bastion::Action::"list_prompts"], resource);
@id("echo-asks") @approval("required") permit (principal, action == Bastion::Action::"call_tool", resource);
"""


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
    config = write_config(tmp_path, {"listen": "127.0.0.1:0"}, guardrails={"argument_secrets": "off"})
    stderr = tmp_path / "stderr"
    with stderr.open("w") as errlog:
        async with client(config, errlog, mode) as session:
            assert not (await session.call_tool("raw__echo", {"text": "hi"})).is_error
            # a key in the answer: the result scan redacts it, an intervention
            redacted = await session.call_tool("raw__echo", {"text": f"the key is {AWS_KEY}"})
            assert AWS_KEY not in str(redacted.content)
            base = listener_of(stderr)
            async with httpx2.AsyncClient(timeout=60) as http:
                scraped = await http.get(f"{base}/metrics")  # no credentials: this listener asks for none
                assert scraped.status_code == 200
                text = scraped.text
                assert value(text, "bastion_requests_total", method="tools/call", tool="raw__echo", server="raw",
                             outcome="ok", identity="configured") == 2
                assert value(text, "bastion_sessions_open", transport="stdio") == 1
                assert value(text, "bastion_guardrail_interventions_total", guardrail="secrets",
                             kind="aws-access-key") == 1
                assert value(text, "bastion_client_received_bytes_total", transport="stdio") > 0
                assert value(text, "bastion_server_up", server="raw") == 1
                ready = await http.get(f"{base}/readyz")
                assert ready.status_code == 200 and ready.json()["status"] == "ready"
                assert (await http.get(f"{base}/healthz")).status_code == 200
                assert (await http.get(f"{base}/mcp")).status_code == 404  # nothing of MCP here
                # a page that points its own name at 127.0.0.1 (DNS rebinding) reads nothing
                rebound = await http.get(f"{base}/metrics", headers={"host": "attacker.example:9464"})
                assert rebound.status_code == 403 and "bastion_" not in rebound.text


async def test_readiness_follows_an_audit_trail_that_cannot_be_written(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"listen": "127.0.0.1:0"})
    stderr = tmp_path / "stderr"
    audit = tmp_path / "audit.jsonl"
    with stderr.open("w") as errlog:
        async with client(config, errlog, "legacy") as session:
            assert not (await session.call_tool("raw__echo", {"text": "first"})).is_error
            base = listener_of(stderr)
            # every record so far on disk (the call's is the last), so the limit below cuts only later ones
            assert wait_for(lambda: any(b'"kind":"call"' in line and b"raw__echo" in line
                                        for line in (audit.read_bytes() if audit.exists() else b"").splitlines()),
                            timeout=60)
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
    ({"enabled": False, "listen": "127.0.0.1:9464"}, "metrics"),
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


async def test_the_unauthenticated_listener_bounds_connections_from_one_address(tmp_path: Path) -> None:
    import socket
    from urllib.parse import urlsplit

    from bastion.observability.endpoints import LISTENER_CONNECTIONS_PER_ADDRESS

    config = write_config(tmp_path, {"listen": "127.0.0.1:0"})
    stderr = tmp_path / "stderr"
    with stderr.open("w") as errlog:
        async with client(config, errlog, "legacy") as session:
            assert not (await session.call_tool("raw__echo", {"text": "hi"})).is_error
            address = urlsplit(listener_of(stderr))
            held = [socket.create_connection((address.hostname, address.port), timeout=60)
                    for _ in range(LISTENER_CONNECTIONS_PER_ADDRESS)]  # each sends nothing: a slow client's
            try:
                with socket.create_connection((address.hostname, address.port), timeout=60) as one_more:
                    answer = one_more.recv(4096)
                assert answer.startswith(b"HTTP/1.1 503"), answer
                for connection in held:
                    connection.close()
                # once they are gone, a scraper gets in again
                assert await asyncio.to_thread(wait_for, lambda: httpx2.get(
                    f"http://{address.netloc}/metrics", timeout=60).status_code == 200, 60)
            finally:
                for connection in held:
                    connection.close()


def test_a_call_waiting_for_a_person_is_counted_as_waiting_then_refused(tmp_path: Path) -> None:
    from tests.support import RawClient

    (tmp_path / "approve.cedar").write_text(APPROVE_ECHO)
    queue = tmp_path / "queue"
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"raw": raw_server(trust="trusted")}, "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"},
        "metrics": {"listen": "127.0.0.1:0"},
        "policy": {"policy_files": ["approve.cedar"], "audit": {"path": str(tmp_path / "audit.jsonl")},
                   "approval": {"fallback": "queue", "timeout_seconds": 300, "poll_seconds": 0.1,
                                "queue_dir": str(queue)}}}))
    stderr = tmp_path / "stderr"
    client = RawClient(config, log=stderr)
    try:
        client.initialize()
        base = listener_of(stderr)

        def scraped() -> str:
            return httpx2.get(f"{base}/metrics", timeout=60).text

        client.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "raw__echo", "arguments": {"text": "hello"}}})
        assert wait_for(lambda: list(queue.glob("*.json")), timeout=60)  # the call waits in the queue
        text = scraped()
        assert value(text, "bastion_approvals_waiting") == 1
        assert value(text, "bastion_server_queue_depth", server="raw") == 1  # waiting in the gateway for it
        assert value(text, "bastion_server_calls_in_flight", server="raw") == 0
        [pending] = queue.glob("*.json")
        denied = subprocess.run([BASTION, "deny", pending.stem, "--queue-dir", str(queue)], capture_output=True,
                                text=True, timeout=60)
        assert denied.returncode == 0, denied.stderr
        assert "error" in client.recv_response(1, timeout=60)
        text = scraped()
        assert value(text, "bastion_approvals_waiting") == 0
        assert value(text, "bastion_server_queue_depth", server="raw") == 0
        assert value(text, "bastion_requests_total", method="tools/call", tool="raw__echo", outcome="refused") == 1
        assert value(text, "bastion_policy_decisions_total", stage="approval", effect="deny") == 1
    finally:
        client.close()


def test_a_server_its_memory_limit_ended_is_counted_as_a_memory_kill(tmp_path: Path) -> None:
    from tests.support import _NO_SANDBOX, RawClient

    if _NO_SANDBOX is not None:
        pytest.skip(f"no sandbox: {_NO_SANDBOX}")
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"raw": raw_server(sandbox={"memory": "64MiB"})}, "policy": "off", "ready_timeout": READY_TIMEOUT,
        "metrics": {"listen": "127.0.0.1:0"}}))
    stderr = tmp_path / "stderr"
    client = RawClient(config, log=stderr)
    try:
        client.initialize()
        base = listener_of(stderr)
        answer = client.request(1, "tools/call", {"name": "raw__hog", "arguments": {"mib": 400}}, timeout=60)
        assert "memory limit 64 MiB exceeded" in answer["error"]["message"]

        def scraped() -> str:
            return httpx2.get(f"{base}/metrics", timeout=60).text

        text = scraped()
        assert value(text, "bastion_server_memory_kills_total", server="raw") == 1
        assert value(text, "bastion_server_crashes_total", server="raw") == 1
        assert value(text, "bastion_requests_total", tool="raw__hog", outcome="error") == 1
        # it is started again
        assert wait_for(lambda: value(scraped(), "bastion_server_up", server="raw") == 1, timeout=60)
        assert value(scraped(), "bastion_server_restarts_total", server="raw") == 1
    finally:
        client.close()
