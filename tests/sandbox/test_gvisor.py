"""The gVisor tier with real runsc containers: a server serves SDK clients through `bastion run`, its limits hold,
nothing of it outlives the gateway, and the doctor and the configuration say what is wrong in runsc's words.

The escape suite (test_escape.py) and the egress tests (test_egress_proxy.py) run against this tier as well.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from pydantic import ValidationError

from bastion.sandbox import SandboxConfig, SandboxError, spawn
from bastion.sandbox.gvisor import WORKDIR_PREFIX, sweep_stale, workdir_prefix
from tests.sandbox.conftest import MALICIOUS_SERVER, alive, descendants, require_gvisor
from tests.sandbox.rpc import RpcClient
from tests.support import BASTION, FIXTURES, READY_TIMEOUT, ROOT

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

DEADLINE = 120


@pytest.fixture
def gvisor() -> None:
    require_gvisor()


def _sdk_config(tmp_path: Path, events: Path) -> Path:
    config = tmp_path / "bastion.json"
    server = {"command": sys.executable, "args": [str(FIXTURES / "sdk_server.py")],
              "env": {"FIXTURE_EVENTS": str(events)},
              "sandbox": {"runtime": "gvisor", "writable": [str(events.parent)]}}
    config.write_text(json.dumps({"servers": {"sdk": server}, "policy": "off", "ready_timeout": READY_TIMEOUT,
                                  "tools": {"exposure": "all"}}))
    return config


def _sentries() -> set[int]:
    """Host pids of gVisor Sentries that Bastion started (their state lives under its private directories)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                command = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if command[0].endswith(b"runsc-sandbox") and any(WORKDIR_PREFIX.encode() in word for word in command):
                found.add(int(entry))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_an_sdk_server_under_gvisor_serves_an_sdk_client_through_bastion_run(gvisor, tmp_path, mode):
    events_dir = tmp_path / "events"
    events_dir.mkdir()
    events = events_dir / "events.txt"
    before = _sentries()
    params = StdioServerParameters(command=BASTION, args=["run", str(_sdk_config(tmp_path, events))])
    with (tmp_path / "stderr.txt").open("w") as errlog, anyio.fail_after(DEADLINE):
        async with Client(stdio_client(params, errlog=errlog), mode=mode, read_timeout_seconds=DEADLINE) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert "sdk__test_simple_text" in tools
            answer = await client.call_tool("sdk__test_simple_text", {})
            assert answer.content[0].text == "This is a simple text response for testing."
            running = _sentries() - before
            assert running, "the server should run in a gVisor Sentry"
    assert "start " in events.read_text(), "the server wrote to its writable grant"
    assert "gVisor" in (tmp_path / "stderr.txt").read_text()
    with anyio.fail_after(10):
        while alive(sorted(running)):
            await anyio.sleep(0.05)


async def _attacker(config: SandboxConfig) -> RpcClient:
    process = await spawn("malicious", sys.executable, [MALICIOUS_SERVER], {}, None, config)
    client = RpcClient(process)
    await client.initialize()
    return client


async def test_the_pids_limit_refuses_forks_past_it(gvisor):
    # Each forked Python costs the Sentry several MiB (see docs/sandbox.md): 16 of them fit in 512 MiB.
    client = await _attacker(SandboxConfig(pids=16, runtime="gvisor"))
    try:
        outcome = await client.call("fork_many", {"count": 64})
        assert not outcome["ok"] and outcome["started"] < 16, outcome
        assert "Resource temporarily unavailable" in outcome["error"]
        assert (await client.call("list_dir", {"path": "/"}))["ok"], "refused, not stopped: the server still answers"
    finally:
        await client.process.terminate(grace=0.5)


async def test_a_server_that_exits_by_itself_leaves_no_container(gvisor):
    process = await spawn("once", "/bin/sh", ["-c", "exit 3"], {}, None, SandboxConfig(runtime="gvisor"))
    runsc = [process.pid, *descendants(process.pid)]
    with anyio.fail_after(60):
        assert await process.wait() == 3
    assert not alive(runsc)
    assert not [entry for entry in os.listdir(tempfile.gettempdir()) if entry.startswith(workdir_prefix())]


def _bastion_sandbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bastion", "sandbox", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env=env, stdin=subprocess.DEVNULL)


def test_sandbox_run_reports_the_memory_kill_under_gvisor(gvisor):
    result = _bastion_sandbox("run", "--quiet", "--runtime", "gvisor", "--memory", "64MiB", "--", "python3", "-c",
                              "b = bytearray(256 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1")
    assert result.returncode == 137 and "killed: memory limit 64 MiB exceeded" in result.stderr, result.stderr


def test_sandbox_run_passes_stdio_and_the_exit_status_under_gvisor(gvisor):
    result = subprocess.run([sys.executable, "-m", "bastion", "sandbox", "run", "--quiet", "--runtime", "gvisor",
                             "--", "/bin/sh", "-c", "cat; cat /proc/version; exit 7"], input="piped in\n",
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 7, result.stderr
    piped, version = result.stdout.splitlines()[:2]
    assert piped == "piped in"
    assert version != Path("/proc/version").read_text().strip(), "the kernel inside is gVisor's, not the host's"


async def test_a_stale_container_of_a_killed_gateway_is_swept_at_the_next_start(gvisor, tmp_path):
    """A gateway SIGKILLed leaves its private directory (runsc's state) behind; the next gVisor start removes it."""
    script = ("import asyncio, sys\n"
              "from bastion.sandbox import SandboxConfig, spawn\n"
              "async def main():\n"
              "    p = await spawn('s', '/bin/cat', [], {}, None, SandboxConfig(runtime='gvisor'))\n"
              "    print(p.pid, flush=True)\n"
              "    await asyncio.sleep(60)\n"
              "asyncio.run(main())\n")
    gateway = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        server_pid = int(gateway.stdout.readline())
        runsc = [server_pid, *descendants(server_pid)]
        left_behind = [entry for entry in os.listdir("/tmp") if entry.startswith(WORKDIR_PREFIX)
                       and f"-{gateway.pid}-" in entry]
        assert len(left_behind) == 1
    finally:
        gateway.kill()
        gateway.wait()
    with anyio.fail_after(10):
        while alive(runsc):
            await anyio.sleep(0.05)
    assert os.path.isdir(f"/tmp/{left_behind[0]}"), "nothing ran in the killed gateway to remove it"
    process = await spawn("next", "/bin/cat", [], {}, None, SandboxConfig(runtime="gvisor"))
    try:
        assert not os.path.exists(f"/tmp/{left_behind[0]}")
    finally:
        await process.terminate(grace=0.5)
    assert sweep_stale("runsc") == []


def test_runtime_config_errors_name_the_key_and_the_fix():
    with pytest.raises(ValidationError, match="runtime 'gvisor' confines the server but profile 'none'"):
        SandboxConfig(profile="none", runtime="gvisor")
    with pytest.raises(ValidationError, match="unknown sandbox runtime 'firecracker'; use one of bubblewrap, gvisor"):
        SandboxConfig(runtime="firecracker")
    assert SandboxConfig.model_validate("gvisor") == SandboxConfig(runtime="gvisor")
    assert SandboxConfig(profile="strict", runtime="gvisor").limits.pids == 32


def _path_without_runsc(tmp_path: Path, runsc: str | None = None) -> dict[str, str]:
    """A PATH with bwrap and, if given, a runsc of the test's making: the host's own bin directories also hold
    runsc."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bwrap", "setpriv"):
        (bin_dir / tool).symlink_to(subprocess.check_output(["which", tool], text=True).strip())
    if runsc is not None:
        (bin_dir / "runsc").write_text(runsc)
        (bin_dir / "runsc").chmod(0o755)
    return {**os.environ, "PATH": str(bin_dir)}


def test_doctor_reports_gvisor(gvisor):
    result = _bastion_sandbox("doctor", "--json")
    gvisor_check = next(check for check in json.loads(result.stdout)["checks"] if check["name"] == "gvisor")
    assert gvisor_check["ok"] and "a container ran /bin/true" in gvisor_check["detail"]


def test_doctor_says_how_to_install_runsc_when_it_is_missing(tmp_path):
    result = _bastion_sandbox("doctor", env=_path_without_runsc(tmp_path))
    assert result.returncode == 0, "gVisor is optional: bubblewrap still sandboxes every server"
    assert "[--] gvisor: gVisor (runsc) is not on PATH; install gVisor's runsc: apt-get install runsc" in result.stderr


def test_doctor_quotes_runscs_own_error_when_it_cannot_run(gvisor, tmp_path):
    # The real runsc, on a platform this host does not have: its own words must reach the report.
    real = subprocess.check_output(["which", "runsc"], text=True).strip()
    env = _path_without_runsc(tmp_path, f'#!/bin/sh\nexec {real} --platform=no-such-platform "$@"\n')
    result = _bastion_sandbox("doctor", env=env)
    line = next(line for line in result.stderr.splitlines() if "] gvisor:" in line)
    assert line.startswith("  [--] gvisor:") and "runsc probe failed" in line and "no-such-platform" in line, line


async def test_a_gvisor_server_is_refused_not_run_unconfined_without_runsc(tmp_path, monkeypatch):
    from bastion.sandbox import gvisor as gvisor_module

    monkeypatch.setenv("PATH", str(tmp_path))
    gvisor_module.find_runsc.cache_clear()
    try:
        with pytest.raises(SandboxError, match="gVisor \\(runsc\\) is not on PATH; install gVisor's runsc"):
            await spawn("s", "/bin/cat", [], {}, None, SandboxConfig(runtime="gvisor"))
    finally:
        gvisor_module.find_runsc.cache_clear()
