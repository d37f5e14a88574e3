"""Resource limits on this host's real cgroups, and the clean-up after a gateway that was SIGKILLed."""

from __future__ import annotations

import os
import tempfile

import pytest

from bastion.sandbox import SandboxConfig, spawn
from bastion.sandbox.cgroups import ResourceLimits, detect_host
from bastion.sandbox.config import ProfileLimits
from bastion.sandbox.process import workdir_prefix

HOST = detect_host()
needs_cgroups = pytest.mark.skipif(HOST.mode == "rlimits", reason=f"no writable cgroups: {HOST.note}")
DEAD_PID = 4_194_304 + 1  # above the largest pid_max Linux allows: never a live process


def read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name)) as handle:
        return handle.read().strip()


@needs_cgroups
async def test_limits_are_written_to_the_groups():
    limits = ResourceLimits(HOST, "limits test", ProfileLimits(memory=96 * 1024 * 1024, cpu=0.5, pids=40))
    try:
        files = {}
        for directory in limits.dirs:
            for name in ("memory.limit_in_bytes", "memory.max", "pids.max", "cpu.cfs_quota_us", "cpu.max"):
                if os.path.exists(os.path.join(directory, name)):
                    files[name] = read(directory, name)
        if HOST.mode == "cgroup v1":
            assert files == {"memory.limit_in_bytes": str(96 * 1024 * 1024), "pids.max": "40",
                             "cpu.cfs_quota_us": "50000"}
        else:
            assert files["memory.max"] == str(96 * 1024 * 1024) and files["cpu.max"] == "50000 100000"
        assert all("limits_test" in d for d in limits.dirs), "names are sanitised for the filesystem"
    finally:
        await limits.release()
    assert limits.dirs == []


@needs_cgroups
async def test_a_running_sandbox_is_in_its_group_and_the_group_goes_away():
    process = await spawn("grouped", "/bin/cat", [], {}, None, SandboxConfig())
    limits = process._limits
    process.stdin.write(b"ping\n")
    assert await process.stdout.readline() == b"ping\n"  # the server is up, not just the sandbox's init
    # The sandbox's init and the server itself; bwrap's monitor (process.pid) stays outside.
    assert limits is not None and len(limits.pids()) >= 2 and process.pid not in limits.pids()
    directories = list(limits.dirs)
    await process.terminate(grace=0.5)
    assert not any(os.path.exists(d) for d in directories)


@needs_cgroups
async def test_groups_left_by_a_killed_gateway_are_swept():
    parent = next(iter(HOST.dirs.values()))
    stale = os.path.join(parent, f"bastion-ghost-{DEAD_PID}-abcdef")
    os.mkdir(stale)
    limits = ResourceLimits(HOST, "sweeper", ProfileLimits(memory=64 * 1024 * 1024, cpu=1, pids=16))
    try:
        assert not os.path.exists(stale)
    finally:
        await limits.release()
        if os.path.exists(stale):
            os.rmdir(stale)


async def test_workdirs_left_by_a_killed_gateway_are_swept():
    stale = tempfile.mkdtemp(prefix=workdir_prefix(DEAD_PID))
    live = tempfile.mkdtemp(prefix=workdir_prefix(os.getpid()))
    process = await spawn("sweeper", "/bin/true", [], {}, None, SandboxConfig())
    await process.terminate()
    assert not os.path.exists(stale) and os.path.exists(live)
    os.rmdir(live)
