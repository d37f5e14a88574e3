"""The escape suite: a malicious MCP server attacks from inside the default profile and fails.

Every test runs twice (see the ``profile`` fixture): under ``default`` the attack must fail, and the
same attack with profile ``none`` must succeed, which proves each test is able to fail. Success is
judged on the host wherever possible (does the file exist, did the process die), not on the
attacker's word.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.sandbox.conftest import (
    MALICIOUS_SERVER, Grants, alive, descendants, kill_all, wait_until_gone, wait_until_present,
)


def expect(profile: str, succeeded: bool, detail: object) -> None:
    if profile == "none":
        assert succeeded, f"without the sandbox the attack should work, so the test can fail: {detail}"
    else:
        assert not succeeded, f"attack escaped the sandbox: {detail}"


# --- reading what is not granted -------------------------------------------------------------------

async def test_cannot_read_etc_shadow(attacker, profile):
    outcome = await attacker.call("read_file", {"path": "/etc/shadow"})
    expect(profile, outcome["ok"] and "root:" in outcome["data"], outcome)


@pytest.mark.parametrize("directory", ["home", "/root"])
async def test_cannot_read_the_users_home(attacker, profile, token, directory):
    home = Path.home() if directory == "home" else Path("/root")
    secret_file = home / f".{token}"
    secret_file.write_text(token)
    try:
        read = await attacker.call("read_file", {"path": str(secret_file)})
        listing = await attacker.call("list_dir", {"path": str(home)})
    finally:
        secret_file.unlink()
    expect(profile, read["ok"] and read["data"] == token, read)
    expect(profile, listing["ok"] and secret_file.name in listing["entries"], listing)


async def test_cannot_read_host_environment_secrets(attacker, profile, host_secret):
    outcome = await attacker.call("environment")
    leaked = any(host_secret in value for value in outcome["environ"].values())
    expect(profile, leaked, sorted(outcome["environ"]))


# --- writing outside the grants ----------------------------------------------------------------------

def host_can_use_proc_1_root() -> bool:
    """Some hosts (this one's pid 1 is a VM init) refuse even root access to /proc/1/root."""
    try:
        os.listdir("/proc/1/root")
        return True
    except OSError:
        return False


def write_targets(grants: Grants, token: str, profile: str) -> list[tuple[str, Path]]:
    """(method, host path) pairs; the read-only grant is visible inside, so the write must be refused."""
    targets = [
        ("direct", grants.read_only / f"direct-{token}"),
        ("direct", Path("/etc") / token),
        ("direct", Path.home() / token),
        ("symlink", grants.read_only / f"symlink-{token}"),
        ("proc_self_root", grants.read_only / f"procself-{token}"),
        ("proc_1_root", grants.read_only / f"proc1-{token}"),
        ("proc_1_root", Path("/etc") / f"proc1-{token}"),
    ]
    if profile == "none" and not host_can_use_proc_1_root():
        # Without a sandbox this path cannot work here, so it cannot prove anything; the sandboxed run keeps it.
        targets = [target for target in targets if target[0] != "proc_1_root"]
    return targets


async def test_cannot_write_outside_grants(attacker, profile, grants, token):
    created = []
    try:
        for method, target in write_targets(grants, token, profile):
            outcome = await attacker.call(
                "write_file", {"path": str(target), "method": method, "via": str(grants.writable)})
            exists = target.exists()
            if exists:
                created.append(target)
            expect(profile, exists, (method, str(target), outcome))
    finally:
        for path in created:
            path.unlink()


async def test_cannot_write_through_a_hardlink(attacker, profile, grants):
    outcome = await attacker.call(
        "write_file", {"path": str(grants.existing), "method": "hardlink", "via": str(grants.writable),
                       "content": "changed"})
    expect(profile, grants.existing.read_text() == "changed", outcome)


async def test_can_write_to_writable_grant_and_private_tmp(attacker, profile, grants, token):
    """The positive control: grants work, so the refusals above are not the sandbox failing to start."""
    target = grants.writable / token
    outcome = await attacker.call("write_file", {"path": str(target), "method": "direct"})
    assert outcome["ok"] and target.read_text() == "escaped"
    scratch = await attacker.call("write_file", {"path": f"/tmp/{token}", "method": "direct"})
    assert scratch["ok"]
    host_tmp = Path("/tmp") / token
    if profile == "none":
        host_tmp.unlink()
    else:
        assert not host_tmp.exists(), "the sandbox's /tmp must be private"


# --- other processes ------------------------------------------------------------------------------------

@pytest.fixture
def host_sleeper(token: str):
    """A host process carrying ``token`` in its command line, running (it said so) before the attack starts."""
    process = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)", token],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "up\n"
    yield process
    process.kill()
    process.wait()


async def test_cannot_see_host_processes(attacker, profile, host_sleeper, token):
    outcome = await attacker.call("list_processes")
    expect(profile, any(token in command for command in outcome["commands"]), len(outcome["commands"]))


async def test_cannot_signal_host_processes(attacker, profile, host_sleeper):
    outcome = await attacker.call("send_signal", {"pid": host_sleeper.pid, "signum": int(signal.SIGKILL)})
    try:
        host_sleeper.wait(timeout=2)
    except subprocess.TimeoutExpired:
        pass
    expect(profile, host_sleeper.returncode == -signal.SIGKILL, outcome)


async def test_cannot_ptrace(attacker, profile):
    outcome = await attacker.call("ptrace_child")
    expect(profile, outcome["ok"], outcome)


# --- kernel interfaces -------------------------------------------------------------------------------

async def test_cannot_mount(attacker, profile):
    outcome = await attacker.call("mount_tmpfs")
    expect(profile, outcome["ok"], outcome)


async def test_cannot_use_the_new_mount_api(attacker, profile):
    outcome = await attacker.call("fsopen_tmpfs")
    expect(profile, outcome["ok"], outcome)


async def test_cannot_create_a_user_namespace(attacker, profile):
    outcome = await attacker.call("new_user_namespace")
    expect(profile, outcome["ok"], outcome)


async def test_cannot_inject_keystrokes(attacker, profile):
    outcome = await attacker.call("inject_keystrokes")
    expect(profile, outcome["ok"], outcome)


# --- network ---------------------------------------------------------------------------------------------

@pytest.fixture
async def host_tcp_service():
    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello-from-host\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


async def test_cannot_reach_a_loopback_service_on_the_host(attacker, profile, host_tcp_service):
    outcome = await attacker.call("tcp_connect", {"host": "127.0.0.1", "port": host_tcp_service})
    expect(profile, outcome["ok"] and outcome["banner"].startswith("hello-from-host"), outcome)
    if profile == "default":
        assert "Address family not supported" in outcome["error"], "the socket itself must be refused"
    if profile == "gvisor":  # the same filter, but runsc answers every denied call with EPERM
        assert "Operation not permitted" in outcome["error"], "the socket itself must be refused"


# --- resources ---------------------------------------------------------------------------------------------

async def stopped_for_memory(attacker, tool: str, arguments: dict) -> dict:
    """Under gVisor the whole sandbox (its kernel included) is one group on the host: the OOM killer ends the
    Sentry, so the server stops, reported as over its limit, instead of losing only the process that allocated."""
    try:
        return await attacker.call(tool, arguments)
    except ConnectionError:
        await asyncio.wait_for(attacker.process.exited(), 30)  # its stdout can end before runsc has exited
        reason = attacker.process.termination_reason() or ""
        assert reason.startswith("killed: memory limit 512 MiB exceeded"), reason
        return {"ok": False, "stopped": reason}


async def test_cannot_exceed_the_memory_limit(attacker, profile):
    outcome = await stopped_for_memory(attacker, "allocate", {"mib": 768})  # default profile: 512 MiB
    expect(profile, outcome["ok"], outcome)
    if profile == "default":
        assert outcome["returncode"] == -signal.SIGKILL, "the kernel's OOM killer should have ended it"


async def test_cannot_exceed_the_process_limit(attacker, profile):
    # Under gVisor 128 forked Pythons can outgrow 512 MiB before the 128th (each copies the pages it touches):
    # either limit stopping it keeps it under both. tests/sandbox/test_gvisor.py checks the pids limit alone.
    outcome = await stopped_for_memory(attacker, "fork_many", {"count": 300})  # default profile: 128
    expect(profile, outcome["ok"], outcome)
    if profile != "none" and "stopped" not in outcome:
        assert outcome["started"] < 128


def host_cpu_seconds(pid: int) -> float:
    """CPU time the host gave ``pid`` and everything under it (the reaped included): under gVisor the server's own
    getrusage is its kernel's account, not the host's, so the quota is judged from outside."""
    ticks = 0
    for process in [pid, *descendants(pid)]:
        try:
            fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


async def test_cannot_exceed_the_cpu_limit(attacker, profile):
    before = host_cpu_seconds(attacker.process.pid) if profile == "gvisor" else 0.0
    outcome = await attacker.call("burn_cpu", {"seconds": 2.0, "workers": 2})
    if profile == "gvisor":
        outcome["cpu_seconds"] = host_cpu_seconds(attacker.process.pid) - before
    # What a 0.1-core quota can grant over the run, plus one period of slack per worker and start-up.
    allowed = 0.1 * outcome["wall_seconds"] + 0.3
    expect(profile, outcome["cpu_seconds"] > allowed, outcome)


# --- nothing left behind ---------------------------------------------------------------------------------

async def test_leaves_no_processes_after_terminate(attacker, profile, token):
    await attacker.call("daemonize", {"token": token})
    if profile == "gvisor":
        await _gvisor_leaves_nothing(attacker, token)
        return
    assert await wait_until_present(token), "the detached process should be running before shutdown"
    await attacker.process.terminate(grace=0.5)
    left = await wait_until_gone(token, seconds=3)
    kill_all(left)
    expect(profile, bool(left), left)


async def _gvisor_leaves_nothing(attacker, token: str) -> None:
    """Inside gVisor the detached process is the Sentry's, not the host's: it is seen from inside before the
    shutdown, and afterwards no host process of the sandbox (runsc, its Gofer and Sentry) is left."""
    listing = await attacker.call("list_processes")
    assert any(token in command for command in listing["commands"]), "the detached process should be running"
    runsc = descendants(attacker.process.pid) + [attacker.process.pid]
    assert len(runsc) >= 3, f"runsc, its Gofer and its Sentry should run: {runsc}"
    await attacker.process.terminate(grace=0.5)
    left = await _wait_until_dead(runsc)
    kill_all(left)
    assert not left, f"gVisor processes left after shutdown: {left}"
    assert not own_gvisor_directories(), "the container's directory (runsc's state) should be removed"


def own_gvisor_directories() -> list[str]:
    from bastion.sandbox.gvisor import workdir_prefix

    return [entry for entry in os.listdir(tempfile.gettempdir()) if entry.startswith(workdir_prefix())]


async def _wait_until_dead(pids: list[int], seconds: float = 5.0) -> list[int]:
    deadline = asyncio.get_running_loop().time() + seconds
    while (left := alive(pids)) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    return left


GATEWAY = textwrap.dedent("""
    import asyncio, sys
    from bastion.sandbox import SandboxConfig, spawn
    from tests.sandbox.rpc import RpcClient

    async def main(profile, server, token):
        config = SandboxConfig(runtime="gvisor") if profile == "gvisor" else SandboxConfig(profile=profile)
        process = await spawn("malicious", sys.executable, [server], {}, None, config)
        client = RpcClient(process)
        await client.initialize()
        await client.call("daemonize", {"token": token})
        print(process.pid, flush=True)
        await asyncio.sleep(60)

    asyncio.run(main(*sys.argv[1:]))
""")


async def test_leaves_no_processes_when_the_gateway_is_killed(profile, token):
    gateway = await asyncio.create_subprocess_exec(
        sys.executable, "-c", GATEWAY, profile, MALICIOUS_SERVER, token,
        stdout=asyncio.subprocess.PIPE, cwd=str(Path(__file__).parents[2]))
    assert gateway.stdout is not None
    server_pid = int(await asyncio.wait_for(gateway.stdout.readline(), 30))
    if profile == "gvisor":
        runsc = descendants(server_pid) + [server_pid]
        assert len(runsc) >= 3, f"runsc, its Gofer and its Sentry should run: {runsc}"
        gateway.kill()
        await gateway.wait()
        left = await _wait_until_dead(runsc)
        kill_all(left)
        assert not left, f"gVisor processes outlived the gateway: {left}"
        return
    # The gateway's own arguments carry the token too; only the detached process counts.
    assert [pid for pid in await wait_until_present(token) if pid != gateway.pid]
    gateway.kill()  # SIGKILL: no cleanup code runs in the gateway
    await gateway.wait()
    left = await wait_until_gone(token, seconds=3)
    kill_all(left)
    expect(profile, bool(left), left)
    deadline = asyncio.get_running_loop().time() + 5
    while not _is_gone(server_pid) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert _is_gone(server_pid), "the server itself must die"


def _is_gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
