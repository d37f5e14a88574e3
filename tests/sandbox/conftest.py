from __future__ import annotations

import asyncio
import functools
import os
import secrets
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from bastion.sandbox import SandboxConfig, spawn
from tests.sandbox.rpc import RpcClient

MALICIOUS_SERVER = str(Path(__file__).with_name("malicious_server.py"))
SECRET_ENV = "BASTION_ESCAPE_TEST_SECRET"


@dataclass
class Grants:
    read_only: Path
    writable: Path
    existing: Path  # a file inside the read-only grant


@pytest.fixture
def token() -> str:
    return f"bastion-escape-{secrets.token_hex(6)}"


@pytest.fixture
def grants(tmp_path: Path) -> Grants:
    read_only, writable = tmp_path / "ro", tmp_path / "rw"
    read_only.mkdir()
    writable.mkdir()
    existing = read_only / "existing.txt"
    existing.write_text("original")
    return Grants(read_only, writable, existing)


@pytest.fixture
def host_secret(monkeypatch: pytest.MonkeyPatch, token: str) -> str:
    """A secret in the gateway's environment that no configuration passes to the server."""
    monkeypatch.setenv(SECRET_ENV, token)
    return token


def processes_with(token: str) -> list[int]:
    """Host pids whose command line carries ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if token.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


async def wait_until_gone(token: str, seconds: float = 5.0) -> list[int]:
    deadline = asyncio.get_running_loop().time() + seconds
    while (left := processes_with(token)) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    return left


async def wait_until_present(token: str, seconds: float = 5.0) -> list[int]:
    deadline = asyncio.get_running_loop().time() + seconds
    while not (found := processes_with(token)) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@functools.lru_cache(maxsize=1)
def gvisor_unavailable() -> str | None:
    """Why runsc cannot run a container on this host (its own words), or None when it can."""
    from bastion.sandbox.engine import SandboxUnavailable
    from bastion.sandbox.gvisor import find_runsc, probe

    try:
        ok, detail = probe(find_runsc())
    except SandboxUnavailable as error:
        return str(error)
    return None if ok else detail


def require_gvisor() -> None:
    reason = gvisor_unavailable()
    if reason is not None:
        pytest.skip(f"gVisor cannot run here: {reason}")


@pytest.fixture(params=["default", "gvisor", "none"])
def profile(request: pytest.FixtureRequest) -> str:
    """Every attack runs under bubblewrap and gVisor, where it must fail, and unconfined, where it must succeed."""
    if request.param == "gvisor":
        require_gvisor()
    return request.param


def attack_config(profile: str, grants: Grants) -> SandboxConfig:
    if profile == "none":
        return SandboxConfig(profile="none")
    # Default profile; a low CPU quota keeps the CPU test meaningful on a busy two-core machine.
    return SandboxConfig(read_only=(str(grants.read_only),), writable=(str(grants.writable),), cpu=0.1,
                         runtime="gvisor" if profile == "gvisor" else "bubblewrap")


def descendants(pid: int) -> list[int]:
    """``pid``'s child processes and theirs, from /proc: runsc's Gofer and Sentry under the process Bastion started."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has ended: only its exit status is left to collect)."""
    running = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] != "Z":
                    running.append(pid)
        except OSError:
            pass
    return running


@pytest.fixture
async def attacker(profile: str, grants: Grants, host_secret: str):
    process = await spawn("malicious", sys.executable, [MALICIOUS_SERVER], {}, None, attack_config(profile, grants))
    client = RpcClient(process)
    await client.initialize()
    yield client
    await process.terminate(grace=0.5)
