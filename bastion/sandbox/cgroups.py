"""Memory, CPU and process limits: cgroup v2 where delegated, v1 where the host has it, rlimits last.

The sandbox is placed in its group from outside, without running code in the child before exec:
bwrap reports the sandbox's pid on ``--info-fd`` and waits on ``--block-fd`` until the pids are in
``cgroup.procs``. Everything it forks afterwards inherits the group.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import secrets
import signal
from dataclasses import dataclass, field

from bastion.sandbox.config import ProfileLimits, format_bytes

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class CgroupHost:
    """What the host offers: one of 'cgroup v2', 'cgroup v1', 'rlimits', and where."""

    mode: str
    # controller -> directory of *our own* cgroup for it (v1: one per controller; v2: the same one)
    dirs: dict[str, str] = field(default_factory=dict)
    note: str = ""


def _own_cgroups() -> dict[str, str]:
    """controller name (or '' for the v2 line) -> our path inside that hierarchy."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of every cgroup filesystem."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            before, after = line.rstrip("\n").split(" - ", 1)
            fstype, _, options = after.split(" ", 2)
            if fstype in ("cgroup", "cgroup2"):
                found.append((before.split(" ")[4], fstype, set(options.split(","))))
    return found


def _writable(directory: str) -> bool:
    return os.access(os.path.join(directory, "cgroup.procs"), os.W_OK)


def _v2_host(own: dict[str, str]) -> CgroupHost | None:
    for mount, fstype, _ in _mounts():
        if fstype != "cgroup2" or "" not in own:
            continue
        directory = os.path.normpath(mount + own[""])
        try:
            with open(os.path.join(directory, "cgroup.controllers")) as handle:
                available = set(handle.read().split())
        except OSError:
            continue
        if set(CONTROLLERS) <= available and _writable(directory):
            return CgroupHost("cgroup v2", {c: directory for c in CONTROLLERS})
    return None


def _v1_host(own: dict[str, str]) -> CgroupHost | None:
    dirs: dict[str, str] = {}
    for mount, fstype, options in _mounts():
        if fstype != "cgroup":
            continue
        for controller in CONTROLLERS:
            if controller in options and controller in own and controller not in dirs:
                directory = os.path.normpath(mount + own[controller])
                if _writable(directory):
                    dirs[controller] = directory
    if set(dirs) == set(CONTROLLERS):
        return CgroupHost("cgroup v1", dirs)
    return None


def detect_host() -> CgroupHost:
    """Prefer a delegated v2 hierarchy, then v1 with memory, pids and cpu all writable, then rlimits."""
    try:
        own = _own_cgroups()
        host = _v2_host(own) or _v1_host(own)
    except OSError as error:
        return CgroupHost("rlimits", note=f"cgroups unreadable: {error}")
    if host is not None:
        return host
    return CgroupHost("rlimits", note="no writable cgroup hierarchy with memory, pids and cpu controllers")


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


LEAF_PREFIX = "bastion-"


def _pid_alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def sweep_stale(parent: str) -> list[str]:
    """Remove empty groups left by a gateway that was SIGKILLed (``bastion-NAME-PID-HEX``, PID gone)."""
    removed = []
    try:
        entries = os.listdir(parent)
    except OSError:
        return removed
    for entry in entries:
        if not entry.startswith(LEAF_PREFIX):
            continue
        parts = entry.rsplit("-", 2)
        if len(parts) != 3 or not parts[1].isdigit() or _pid_alive(int(parts[1])):
            continue
        try:
            os.rmdir(os.path.join(parent, entry))  # fails while anything still runs in it
            removed.append(entry)
        except OSError:
            pass
    return removed


class ResourceLimits:
    """One sandbox's limits. ``place(pids)`` before the sandbox starts, ``release()`` after it ended."""

    def __init__(self, host: CgroupHost, name: str, limits: ProfileLimits) -> None:
        self.host = host
        self.limits = limits
        self.dirs: list[str] = []
        self._oom_file: str | None = None
        if host.mode == "rlimits":
            return
        safe_name = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40]
        leaf = f"{LEAF_PREFIX}{safe_name}-{os.getpid()}-{secrets.token_hex(3)}"
        for parent in set(host.dirs.values()):
            sweep_stale(parent)
        try:
            if host.mode == "cgroup v2":
                self._create_v2(host.dirs["memory"], leaf)
            else:
                self._create_v1(leaf)
        except OSError:
            self._remove_dirs()
            raise

    @property
    def mode(self) -> str:
        return self.host.mode

    def _create_v1(self, leaf: str) -> None:
        for controller in CONTROLLERS:
            directory = os.path.join(self.host.dirs[controller], leaf)
            os.mkdir(directory)
            self.dirs.append(directory)
            if controller == "memory":
                _write(os.path.join(directory, "memory.limit_in_bytes"), str(self.limits.memory))
                try:  # swap counted too, where swap accounting is on
                    _write(os.path.join(directory, "memory.memsw.limit_in_bytes"), str(self.limits.memory))
                except OSError:
                    pass
                self._oom_file = os.path.join(directory, "memory.oom_control")
            elif controller == "pids":
                _write(os.path.join(directory, "pids.max"), str(self.limits.pids))
            else:
                _write(os.path.join(directory, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
                _write(os.path.join(directory, "cpu.cfs_quota_us"), str(int(self.limits.cpu * CPU_PERIOD_US)))

    def _create_v2(self, parent: str, leaf: str) -> None:
        with open(os.path.join(parent, "cgroup.subtree_control")) as handle:
            enabled = set(handle.read().split())
        missing = [c for c in CONTROLLERS if c not in enabled]
        if missing:
            _write(os.path.join(parent, "cgroup.subtree_control"), " ".join(f"+{c}" for c in missing))
        directory = os.path.join(parent, leaf)
        os.mkdir(directory)
        self.dirs.append(directory)
        _write(os.path.join(directory, "memory.max"), str(self.limits.memory))
        try:
            _write(os.path.join(directory, "memory.swap.max"), "0")
        except OSError:
            pass
        _write(os.path.join(directory, "pids.max"), str(self.limits.pids))
        _write(os.path.join(directory, "cpu.max"), f"{int(self.limits.cpu * CPU_PERIOD_US)} {CPU_PERIOD_US}")
        self._oom_file = os.path.join(directory, "memory.events")

    async def place(self, pid: int) -> None:
        """Move the (still blocked) sandbox into its groups, or set rlimits on it as the last resort.

        Only the sandbox's own first process is moved: everything it starts inherits the groups, and
        bwrap's monitor outside runs no sandboxed code. Moving a task between v1 groups waits for an
        RCU grace period, so the controllers are written in parallel, off the event loop.
        """
        if self.host.mode == "rlimits":
            await asyncio.to_thread(self._set_rlimits, pid)
            return
        await asyncio.gather(*(asyncio.to_thread(_write, os.path.join(directory, "cgroup.procs"), str(pid))
                               for directory in self.dirs))

    def _set_rlimits(self, pid: int) -> None:
        # Address-space limits break runtimes that reserve large virtual ranges (V8): data is safer.
        resource.prlimit(pid, resource.RLIMIT_DATA, (self.limits.memory, self.limits.memory))
        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding this group's memory limit."""
        if self._oom_file is None:
            return 0
        try:
            with open(self._oom_file) as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            pass
        return 0

    def pids(self) -> list[int]:
        if not self.dirs:
            return []
        try:
            with open(os.path.join(self.dirs[0], "cgroup.procs")) as handle:
                return [int(line) for line in handle if line.strip()]
        except OSError:
            return []

    def kill_all(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def release(self, attempts: int = 50) -> None:
        """Kill whatever is left in the group and remove it; a group frees only once it is empty."""
        for _ in range(attempts):
            self.kill_all()
            await asyncio.to_thread(self._remove_dirs)
            if not self.dirs:
                return
            await asyncio.sleep(0.02)

    @classmethod
    async def create(cls, host: CgroupHost, name: str, limits: ProfileLimits) -> ResourceLimits:
        """mkdir and limit writes on cgroupfs, kept off the event loop."""
        return await asyncio.to_thread(cls, host, name, limits)

    def _remove_dirs(self) -> None:
        remaining = []
        for directory in self.dirs:
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                pass
            except OSError:
                remaining.append(directory)
        self.dirs = remaining

    def describe(self) -> str:
        limits = f"memory {format_bytes(self.limits.memory)}, cpu {self.limits.cpu:g}, pids {self.limits.pids}"
        if self.host.mode == "rlimits":
            return f"rlimits (memory only; {self.host.note}): {limits}"
        return f"{self.host.mode}: {limits}"
