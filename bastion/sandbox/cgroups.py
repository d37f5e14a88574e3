"""Memory, CPU and process limits: cgroup v2 where delegated, v1 where the host has it, rlimits last.

The sandbox is placed in its group from outside, without running code in the child before exec:
bwrap reports the sandbox's pid on ``--info-fd`` and waits on ``--block-fd`` until the pids are in
``cgroup.procs``. Everything it forks afterwards inherits the group.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import resource
import secrets
import signal
from dataclasses import dataclass, field

from bastion.sandbox.config import ProfileLimits, format_bytes

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
LEAF_PREFIX = "bastion-"
# Where the gateway moves the processes of its own v2 group, so that group may have child groups with controllers.
GATEWAY_LEAF = f"{LEAF_PREFIX}gateway-"


@dataclass(frozen=True)
class Mount:
    """One cgroup filesystem as /proc/self/mountinfo shows it."""

    point: str
    fstype: str  # "cgroup" (v1) or "cgroup2"
    root: str  # the group mounted at ``point``, as our cgroup namespace sees it
    options: frozenset[str]

    def directory_of(self, own: str) -> str | None:
        """Where the group ``own`` (a path from /proc/self/cgroup) is under this mount, if it is visible there."""
        if own == self.root:
            return self.point
        prefix = self.root.rstrip("/") + "/"
        if not own.startswith(prefix):
            return None
        return os.path.normpath(os.path.join(self.point, own[len(prefix):]))


@dataclass(frozen=True)
class Hierarchy:
    """Which cgroup hierarchies the host mounts: 'v1', 'v2' (unified), 'hybrid' (both) or 'none'."""

    kind: str
    v1_controllers: tuple[str, ...] = ()
    v2_mount: str | None = None
    v2_controllers: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = []
        if self.v1_controllers:
            parts.append(f"v1 controllers {', '.join(self.v1_controllers)}")
        if self.v2_mount is not None:
            parts.append(f"cgroup2 at {self.v2_mount} with controllers {', '.join(self.v2_controllers) or 'none'}")
        return f"{self.kind}: {'; '.join(parts) or 'no cgroup filesystem mounted'}"


@dataclass(frozen=True)
class CgroupHost:
    """What the limits use: one of 'cgroup v2', 'cgroup v1', 'rlimits', and where."""

    mode: str
    # controller -> directory of *our own* cgroup for it (v1: one per controller; v2: the same one)
    dirs: dict[str, str] = field(default_factory=dict)
    note: str = ""
    hierarchy: Hierarchy = Hierarchy("none")
    # v2: the delegated group the sandboxes' groups are made in (it holds no process of ours once they exist)
    parent: str | None = None


def _own_cgroups() -> dict[str, str]:
    """controller name (or '' for the v2 line, ``0::/path``) -> our path inside that hierarchy."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _mounts() -> list[Mount]:
    """Every cgroup filesystem mounted in our mount namespace."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            before, after = line.rstrip("\n").split(" - ", 1)
            fstype, _, options = after.split(" ", 2)
            if fstype in ("cgroup", "cgroup2"):
                fields = before.split(" ")
                found.append(Mount(fields[4], fstype, fields[3], frozenset(options.split(" ")[-1].split(","))))
    return found


def _read_words(path: str) -> list[str]:
    with open(path) as handle:
        return handle.read().split()


def _kernel_controllers() -> set[str]:
    """The controllers this kernel has (the first column of /proc/cgroups)."""
    try:
        with open("/proc/cgroups") as handle:
            return {line.split()[0] for line in handle if line.strip() and not line.startswith("#")}
    except OSError:
        return set()


def detect_hierarchy(mounts: list[Mount] | None = None) -> Hierarchy:
    """v1 controller mounts alone: 'v1'; a cgroup2 mount alone: 'v2'; both (systemd's hybrid layout): 'hybrid'."""
    mounts = _mounts() if mounts is None else mounts
    v1 = sorted({option for m in mounts if m.fstype == "cgroup" for option in m.options} & _kernel_controllers())
    v2 = next((m for m in mounts if m.fstype == "cgroup2"), None)
    v2_controllers: list[str] = []
    if v2 is not None:
        try:
            v2_controllers = _read_words(os.path.join(v2.point, "cgroup.controllers"))
        except OSError:
            pass
    kind = {(True, True): "hybrid", (True, False): "v1", (False, True): "v2"}.get((bool(v1), v2 is not None), "none")
    return Hierarchy(kind, tuple(v1), v2.point if v2 else None, tuple(v2_controllers))


def _writable(directory: str) -> bool:
    return os.access(os.path.join(directory, "cgroup.procs"), os.W_OK)


def v2_host_at(directory: str, hierarchy: Hierarchy = Hierarchy("v2")) -> CgroupHost:
    """A v2 host delegating ``directory``: the limits use those of memory, pids and cpu its parent grants it.

    Our own group may be a gateway leaf we moved ourselves into (see ``enable_controllers``): its parent is the
    delegated group then.
    """
    if os.path.basename(directory).startswith(GATEWAY_LEAF):
        directory = os.path.dirname(directory)
    available = set(_read_words(os.path.join(directory, "cgroup.controllers")))
    return CgroupHost("cgroup v2", {c: directory for c in CONTROLLERS if c in available},
                      hierarchy=hierarchy, parent=directory)


def own_v2_groups(own: dict[str, str] | None = None, mounts: list[Mount] | None = None) -> list[str]:
    """The directories of our own v2 group (``0::/path`` in /proc/self/cgroup), one per cgroup2 mount showing it.

    Under a cgroup namespace the path is relative to the namespace's root, as are the roots of the mounts made
    inside it; a mount made outside shows a root above ours (``/..``) and is skipped.
    """
    own = _own_cgroups() if own is None else own
    mounts = _mounts() if mounts is None else mounts
    if "" not in own:
        return []
    found = (m.directory_of(own[""]) for m in mounts if m.fstype == "cgroup2")
    return [directory for directory in found if directory is not None]


def _v2_host(own: dict[str, str], mounts: list[Mount], hierarchy: Hierarchy) -> CgroupHost | None:
    for directory in own_v2_groups(own, mounts):
        try:
            host = v2_host_at(directory, hierarchy)
        except OSError:
            continue
        writable = _writable(host.parent) and os.access(os.path.join(host.parent, "cgroup.subtree_control"), os.W_OK)
        if set(host.dirs) == set(CONTROLLERS) and writable:
            return host
    return None


def _v1_host(own: dict[str, str], mounts: list[Mount], hierarchy: Hierarchy) -> CgroupHost | None:
    dirs: dict[str, str] = {}
    for mount in mounts:
        if mount.fstype != "cgroup":
            continue
        for controller in CONTROLLERS:
            if controller in mount.options and controller in own and controller not in dirs:
                directory = mount.directory_of(own[controller])
                if directory is not None and _writable(directory):
                    dirs[controller] = directory
    if set(dirs) == set(CONTROLLERS):
        return CgroupHost("cgroup v1", dirs, hierarchy=hierarchy)
    return None


def detect_host() -> CgroupHost:
    """Prefer a delegated v2 group with memory, pids and cpu, then v1 with all three writable, then rlimits."""
    try:
        own = _own_cgroups()
        mounts = _mounts()
    except OSError as error:
        return CgroupHost("rlimits", note=f"cgroups unreadable: {error}")
    hierarchy = detect_hierarchy(mounts)
    host = _v2_host(own, mounts, hierarchy) or _v1_host(own, mounts, hierarchy)
    if host is not None:
        return host
    return CgroupHost("rlimits", note=f"no writable cgroup hierarchy with memory, pids and cpu controllers "
                                      f"({hierarchy.describe()})", hierarchy=hierarchy)


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def enable_controllers(parent: str, controllers: list[str]) -> None:
    """Let ``parent``'s child groups use ``controllers`` (v2 ``cgroup.subtree_control``).

    The kernel refuses (EBUSY) while ``parent`` itself holds processes and is not the root: a group with
    controllers enabled for its children may have no processes of its own. The processes of ``parent`` (the
    gateway, and any server it started without a sandbox) then move to a leaf of their own,
    ``bastion-gateway-PID-HEX``, and the write is retried; a later gateway sweeps that leaf once it is empty.
    """
    if not controllers:
        return
    request = " ".join(f"+{c}" for c in controllers)
    try:
        _write(os.path.join(parent, "cgroup.subtree_control"), request)
        return
    except OSError as error:
        if error.errno != errno.EBUSY:
            raise
    leaf = os.path.join(parent, f"{GATEWAY_LEAF}{os.getpid()}-{leaf_suffix()}")
    os.mkdir(leaf)
    for pid in _read_words(os.path.join(parent, "cgroup.procs")):
        try:
            _write(os.path.join(leaf, "cgroup.procs"), pid)
        except ProcessLookupError:  # gone meanwhile
            pass
    _write(os.path.join(parent, "cgroup.subtree_control"), request)


def _pid_alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _pid_namespace() -> str:
    return os.readlink("/proc/self/ns/pid").strip("pid:[]")


def leaf_suffix() -> str:
    """``PIDNSxHEX``: the pid in a group's name means something only in the gateway's own pid namespace."""
    return f"{_pid_namespace()}x{secrets.token_hex(3)}"


def sweep_stale(parent: str) -> list[str]:
    """Remove the groups left by a gateway that was SIGKILLed (``bastion-NAME-PID-PIDNSxHEX``, PID gone from
    this pid namespace), killing what still runs in them first. A group named without a namespace (an older
    gateway's) is only removed once empty."""
    removed = []
    try:
        entries = os.listdir(parent)
    except OSError:
        return removed
    own_namespace = f"{_pid_namespace()}x"
    for entry in entries:
        if not entry.startswith(LEAF_PREFIX):
            continue
        parts = entry.rsplit("-", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        ours = parts[2].startswith(own_namespace)
        if "x" in parts[2] and not ours or _pid_alive(int(parts[1])):
            continue  # another pid namespace's gateway, or a live one
        directory = os.path.join(parent, entry)
        if ours and not entry.startswith(GATEWAY_LEAF):
            # A sandbox whose gateway died: nobody may talk to it any more. A gateway leaf may also hold processes
            # that only shared the gateway's group (another gateway, a shell): it goes once they are gone.
            _kill_members(directory)
        try:
            os.rmdir(directory)  # fails until the kernel has reaped what was killed: the next sweep removes it
            removed.append(entry)
        except OSError:
            pass
    return removed


def _kill_members(directory: str) -> None:
    try:
        members = _read_words(os.path.join(directory, "cgroup.procs"))
    except OSError:
        return
    for pid in members:
        if pid == "0":  # a process of a pid namespace we cannot see: never ours (and kill(0) is our own group)
            continue
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


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
        leaf = f"{LEAF_PREFIX}{safe_name}-{os.getpid()}-{leaf_suffix()}"
        parents = {host.parent} if host.parent is not None else set(host.dirs.values())
        for parent in parents:
            sweep_stale(parent)
        try:
            if host.mode == "cgroup v2":
                assert host.parent is not None
                self._create_v2(host.parent, leaf)
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
        """One group under ``parent`` with the limits its controllers offer: all three wherever the host is
        chosen for limits (``detect_host`` requires them); fewer only where a caller builds the host itself."""
        controllers = [c for c in CONTROLLERS if c in self.host.dirs]
        enabled = set(_read_words(os.path.join(parent, "cgroup.subtree_control")))
        enable_controllers(parent, [c for c in controllers if c not in enabled])
        directory = os.path.join(parent, leaf)
        os.mkdir(directory)
        self.dirs.append(directory)
        if "memory" in controllers:
            _write(os.path.join(directory, "memory.max"), str(self.limits.memory))
            try:  # no swap, where the kernel accounts it
                _write(os.path.join(directory, "memory.swap.max"), "0")
            except OSError:
                pass
            self._oom_file = os.path.join(directory, "memory.events")
        if "pids" in controllers:
            _write(os.path.join(directory, "pids.max"), str(self.limits.pids))
        if "cpu" in controllers:
            _write(os.path.join(directory, "cpu.max"), f"{int(self.limits.cpu * CPU_PERIOD_US)} {CPU_PERIOD_US}")

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
        if self.host.mode == "cgroup v2" and self.dirs:
            try:  # the kernel kills the whole group, forks racing the kill included (Linux 5.14+)
                _write(os.path.join(self.dirs[0], "cgroup.kill"), "1")
                return
            except OSError:
                pass
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
