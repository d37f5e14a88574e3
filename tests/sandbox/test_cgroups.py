"""Resource limits on this host's real cgroups, and the clean-up after a gateway that was SIGKILLed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from bastion.sandbox import SandboxConfig, spawn
from bastion.sandbox.cgroups import (
    Mount,
    ResourceLimits,
    detect_hierarchy,
    detect_host,
    leaf_suffix,
    own_v2_groups,
    sweep_stale,
)
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
    # The sandbox's init and the server itself; the outer shell (process.pid) and bwrap's monitor stay outside.
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


@needs_cgroups
async def test_what_still_runs_in_a_killed_gateways_group_is_killed_and_the_group_removed():
    parent = next(iter(HOST.dirs.values()))
    gateway = subprocess.Popen(["cat"], stdin=subprocess.PIPE)  # stands for a gateway, killed below
    ours = os.path.join(parent, f"bastion-ghost-{gateway.pid}-{leaf_suffix()}")
    foreign = os.path.join(parent, f"bastion-ghost-{DEAD_PID}-1x{uuid.uuid4().hex[:6]}")  # another pid namespace's
    leaf = os.path.join(parent, f"bastion-gateway-{gateway.pid}-{leaf_suffix()}")
    members = []
    try:
        for directory in (ours, foreign):
            os.mkdir(directory)
            member = subprocess.Popen(["cat"], stdin=subprocess.PIPE)
            members.append(member)
            with open(os.path.join(directory, "cgroup.procs"), "w") as handle:
                handle.write(str(member.pid))
        # A dead gateway's own leaf (v2) may hold processes that merely shared its group: they are left alone.
        os.mkdir(leaf)
        bystander = subprocess.Popen(["cat"], stdin=subprocess.PIPE)
        members.append(bystander)
        with open(os.path.join(leaf, "cgroup.procs"), "w") as handle:
            handle.write(str(bystander.pid))
        gateway.kill()
        gateway.wait()
        sweep_stale(parent)  # any gateway's sweep in this pid namespace may be the one that does it
        assert members[0].wait(timeout=10) == -signal.SIGKILL
        sweep_stale(parent)  # the killed process reaped, the group goes
        assert not os.path.exists(ours)
        assert members[1].poll() is None and os.path.exists(foreign)
        assert bystander.poll() is None and os.path.exists(leaf)
        bystander.kill()
        bystander.wait()
        sweep_stale(parent)
        assert not os.path.exists(leaf)
    finally:
        for child in [gateway, *members]:
            child.kill()
            child.wait()
        for directory in (ours, foreign, leaf):
            if os.path.exists(directory):
                os.rmdir(directory)


async def test_workdirs_left_by_a_killed_gateway_are_swept():
    stale = tempfile.mkdtemp(prefix=workdir_prefix(DEAD_PID))
    live = tempfile.mkdtemp(prefix=workdir_prefix(os.getpid()))
    process = await spawn("sweeper", "/bin/true", [], {}, None, SandboxConfig())
    await process.terminate()
    assert not os.path.exists(stale) and os.path.exists(live)
    os.rmdir(live)


# cgroup v2 on the real kernel, in a private mount namespace: a scratch cgroup2 mount (the host's one v2 hierarchy,
# mounted once more) where the probe sits in a group of its own, as a gateway does in a delegated group.
HIERARCHY = detect_hierarchy()
PROBE = Path(__file__).with_name("cgroup2_probe.py")
SCRATCH_MOUNT = r'''
set -e
root=$1 group=$2 inner=$3 python=$4 probe=$5
mount -t cgroup2 none "$root"
for controller in $(cat "$root/cgroup.controllers"); do
    echo "+$controller" > "$root/cgroup.subtree_control" 2>/dev/null || true
done
mkdir "$root/$group"
echo $$ > "$root/$group/cgroup.procs"
if [ -n "$inner" ]; then
    # A cgroup namespace rooted at the group (its /proc/self/cgroup says 0::/), with its own nsdelegate mount.
    exec unshare --cgroup --mount --propagation private sh -c \
        'mount -t cgroup2 -o nsdelegate none "$1" && exec "$2" "$3" "$1"' sh "$inner" "$python" "$probe"
fi
exec "$python" "$probe" "$root"
'''


def _unshare_refusal() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    done = subprocess.run(["unshare", "--mount", "--cgroup", "true"], capture_output=True, text=True, timeout=10)
    return None if done.returncode == 0 else f"unshare --mount --cgroup: {done.stderr.strip()}"


_REFUSAL = _unshare_refusal() or (None if HIERARCHY.v2_mount else f"no cgroup2 mounted ({HIERARCHY.describe()})")
needs_scratch_cgroup2 = pytest.mark.skipif(_REFUSAL is not None, reason=str(_REFUSAL))


def _remove_tree(directory: str) -> None:
    for entry in os.scandir(directory):
        if entry.is_dir():
            _remove_tree(entry.path)
    os.rmdir(directory)


@pytest.fixture
def v2_probe(tmp_path):
    """Run the probe in a scratch cgroup2 mount; the group is removed afterwards through the host's own mount."""
    assert HIERARCHY.v2_mount is not None
    enabled_before = set(read(HIERARCHY.v2_mount, "cgroup.subtree_control").split())
    groups = []

    def run(namespace: bool) -> dict:
        group = f"bastion-probe-{uuid.uuid4().hex[:8]}"
        groups.append(os.path.join(HIERARCHY.v2_mount, group))
        (tmp_path / "root").mkdir(exist_ok=True)
        (tmp_path / "inner").mkdir(exist_ok=True)
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", SCRATCH_MOUNT, "sh", str(tmp_path / "root"),
             group, str(tmp_path / "inner") if namespace else "", sys.executable, str(PROBE)],
            capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    yield run
    for group in groups:
        if os.path.exists(group):
            _remove_tree(group)
    for controller in set(read(HIERARCHY.v2_mount, "cgroup.subtree_control").split()) - enabled_before:
        try:
            with open(os.path.join(HIERARCHY.v2_mount, "cgroup.subtree_control"), "w") as handle:
                handle.write(f"-{controller}")
        except OSError:  # another test's group still uses it
            pass


def _check_sandbox_group(seen: dict) -> None:
    """A group made, its limit files those the kernel offers, a process moved in, killed and the group gone."""
    offered = set(seen["controllers"])
    expected = {}
    if "memory" in offered:
        expected["memory.max"] = str(64 * 1024 * 1024)
    if "pids" in offered:
        expected["pids.max"] = "32"
    if "cpu" in offered:
        expected["cpu.max"] = "50000 100000"
    assert {k: v for k, v in seen["limits"].items() if k != "memory.swap.max"} == expected
    assert seen["group"].startswith(seen["parent"] + "/bastion-probe_")
    assert seen["child group"].endswith("/" + os.path.basename(seen["group"]))
    assert seen["pids"] == [seen["child"]]
    assert seen["child status"] == -signal.SIGKILL and not seen["group left"]


@needs_scratch_cgroup2
@pytest.mark.parametrize("namespace", [False, True], ids=["own-group", "cgroup-namespace"])
def test_v2_groups_on_the_real_kernel(v2_probe, namespace):
    report = v2_probe(namespace)
    assert report["own group"] == "/" if namespace else report["own group"].startswith("/bastion-probe-")
    _check_sandbox_group(report["plain"])
    if not report["offered"]:
        pytest.skip(f"the kernel offers no controller to cgroup2 here ({HIERARCHY.describe()}): every one is "
                    f"bound to a v1 hierarchy; groups, process moves, cgroup.kill and removal were tested")
    # Enabling a controller for the children moved the probe out of its group, into a gateway leaf.
    assert report["offered"][0] in report["enabled"]
    assert os.path.basename(report["own group after"]).startswith("bastion-gateway-")
    assert report["delegated"]["parent"] == report["plain"]["parent"]
    _check_sandbox_group(report["delegated"])


def test_the_hierarchy_is_named_from_the_mounts():
    v1 = Mount("/sys/fs/cgroup/memory", "cgroup", "/", frozenset({"rw", "memory"}))
    named = Mount("/sys/fs/cgroup/systemd", "cgroup", "/", frozenset({"rw", "name=systemd"}))
    v2 = Mount("/nonexistent/unified", "cgroup2", "/", frozenset({"rw", "nsdelegate"}))
    assert detect_hierarchy([v1, named, v2]).kind == "hybrid"
    assert detect_hierarchy([v1, named]).kind == "v1" and detect_hierarchy([v1]).v1_controllers == ("memory",)
    assert detect_hierarchy([v2]).kind == "v2" and detect_hierarchy([named]).kind == "none"
    assert detect_hierarchy([]).describe() == "none: no cgroup filesystem mounted"


def test_our_group_is_found_below_a_mount_of_part_of_the_hierarchy():
    # A container's /sys/fs/cgroup, or a mount made inside a cgroup namespace, shows a group, not the root.
    container = Mount("/sys/fs/cgroup", "cgroup2", "/system.slice/box.scope", frozenset({"rw"}))
    assert container.directory_of("/system.slice/box.scope") == "/sys/fs/cgroup"
    assert container.directory_of("/system.slice/box.scope/app") == "/sys/fs/cgroup/app"
    assert container.directory_of("/system.slice/box.scopeX") is None
    outside = Mount("/sys/fs/cgroup/unified", "cgroup2", "/..", frozenset({"rw"}))  # made outside our namespace
    assert outside.directory_of("/") is None
    assert own_v2_groups({"": "/app"}, [container, outside]) == []
    assert own_v2_groups({"": "/system.slice/box.scope/app"}, [container]) == ["/sys/fs/cgroup/app"]
