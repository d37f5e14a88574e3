"""Run by tests/sandbox/test_cgroups.py inside a private mount namespace holding a cgroup2 mount at argv[1].

The probe is already in its own group there (its own v2 group is the delegated one); it drives Bastion's v2 code on
the real kernel and prints what it saw as JSON on stdout: the limits, a process moved in and read back, the
controllers the kernel offered, the no-internal-processes rule met, and the groups gone after release.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from bastion.sandbox.cgroups import ResourceLimits, enable_controllers, own_v2_groups, v2_host_at
from bastion.sandbox.config import ProfileLimits

MOUNT = sys.argv[1]
LIMITS = ProfileLimits(memory=64 * 1024 * 1024, cpu=0.5, pids=32)
LIMIT_FILES = ("memory.max", "memory.swap.max", "cpu.max", "pids.max")


def read(path: str) -> str:
    with open(path) as handle:
        return handle.read().strip()


def group_of(pid: int) -> str:
    return next(line.split("::", 1)[1] for line in read(f"/proc/{pid}/cgroup").splitlines() if line.startswith("0::"))


async def one_sandbox_group(report: dict, key: str) -> None:
    """What ``spawn`` does with a group: create it, move a process in, release it."""
    own = [d for d in own_v2_groups() if os.path.realpath(d).startswith(os.path.realpath(MOUNT))]
    host = v2_host_at(own[0])
    limits = await ResourceLimits.create(host, f"probe {key}", LIMITS)
    child = subprocess.Popen(["cat"], stdin=subprocess.PIPE)
    try:
        await limits.place(child.pid)
        directory = limits.dirs[0]
        report[key] = {
            "own": own[0], "parent": host.parent, "group": directory, "controllers": sorted(host.dirs),
            "limits": {name: read(os.path.join(directory, name)) for name in LIMIT_FILES
                       if os.path.exists(os.path.join(directory, name))},
            "child group": group_of(child.pid), "pids": limits.pids(), "child": child.pid,
        }
        await limits.release()
        report[key]["child status"] = child.wait(timeout=10)  # cgroup.kill ended it
        report[key]["group left"] = os.path.exists(directory)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


async def main() -> None:
    report: dict = {"own group": group_of(os.getpid())}
    await one_sandbox_group(report, "plain")
    own = own_v2_groups()[0]
    offered = read(os.path.join(own, "cgroup.controllers")).split()
    report["offered"] = offered
    if offered:
        # The kernel's rule: a non-root group holding processes cannot enable controllers for its children.
        first = offered[0]
        enable_controllers(own, [first])
        report["enabled"] = read(os.path.join(own, "cgroup.subtree_control")).split()
        report["own group after"] = group_of(os.getpid())
        await one_sandbox_group(report, "delegated")
    print(json.dumps(report))


asyncio.run(main())
