"""What this host supports for sandboxing, and what Bastion will use: each check is a small probe."""

from __future__ import annotations

import ctypes
import os
import subprocess
from dataclasses import asdict, dataclass, field

from bastion.sandbox import seccomp
from bastion.sandbox.cgroups import detect_host
from bastion.sandbox.engine import SandboxUnavailable, find_engine
from bastion.sandbox.view import system_mounts

SYS_LANDLOCK_CREATE_RULESET = 444
LANDLOCK_CREATE_RULESET_VERSION = 1


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    will_use: dict[str, str] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        required = {"bubblewrap", "proc", "user namespaces", "seccomp"}
        return all(check.ok for check in self.checks if check.name in required)

    def as_dict(self) -> dict:
        return {"usable": self.usable, "checks": [asdict(c) for c in self.checks], "will_use": self.will_use}


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def check_engine() -> Check:
    try:
        return Check("bubblewrap", True, find_engine().describe())
    except SandboxUnavailable as error:
        return Check("bubblewrap", False, str(error))


def check_proc() -> Check:
    """bwrap looks its sandbox's first process up in /proc by the pid its clone returned: a /proc of another pid
    namespace (a container given the host's) holds another process under that number, or none, and bwrap then
    fails after its clone, at random."""
    try:
        seen_as = os.readlink("/proc/self")
    except OSError as error:
        return Check("proc", False, f"/proc is not mounted ({error.strerror}): mount one of this pid namespace")
    if seen_as != str(os.getpid()):
        return Check("proc", False, f"/proc belongs to another pid namespace (/proc/self is {seen_as}, this process is "
                                    f"{os.getpid()}): sandboxes would fail to start at random; mount a /proc of this "
                                    "pid namespace (Kubernetes: procMount Unmasked, never a hostPath of /proc)")
    return Check("proc", True, "/proc is this pid namespace's")


def check_user_namespaces() -> Check:
    """A real start of bwrap with the flags Bastion uses: sysctls alone do not tell (AppArmor, seccomp)."""
    settings = []
    for path in ("/proc/sys/user/max_user_namespaces", "/proc/sys/kernel/unprivileged_userns_clone",
                 "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"):
        value = _read(path)
        if value is not None:
            settings.append(f"{os.path.basename(path)}={value}")
    try:
        engine = find_engine()
    except SandboxUnavailable:
        return Check("user namespaces", False, "not tested: no bwrap; " + ", ".join(settings))
    probe = [engine.path, "--unshare-user", "--unshare-pid", "--unshare-net", "--uid", "65534", "--gid", "65534",
             "--cap-drop", "ALL", "--disable-userns", "--proc", "/proc"]
    for mount in system_mounts():
        probe += mount.bwrap_args()
    probe += ["--", "/usr/bin/id", "-u"]
    try:
        result = subprocess.run(probe, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return Check("user namespaces", False, f"bwrap probe failed: {error}")
    ok = result.returncode == 0 and result.stdout.strip() == "65534"
    detail = "a sandbox started as uid 65534" if ok else f"bwrap probe failed: {result.stderr.strip()}"
    return Check("user namespaces", ok, "; ".join([detail, *settings]))


def check_seccomp() -> Check:
    ok, detail = seccomp.available()
    actions = _read("/proc/sys/kernel/seccomp/actions_avail")
    return Check("seccomp", ok, f"{detail}; kernel actions: {actions}" if actions else detail)


def check_cgroups() -> Check:
    """Which hierarchy the host mounts (v1, v2, hybrid) and which controllers the limits can use, and where."""
    host = detect_host()
    hierarchy = f"hierarchy {host.hierarchy.describe()}"
    if host.mode == "rlimits":
        return Check("cgroups", False, f"{hierarchy}; limits use rlimits (memory only): {host.note}")
    where = ", ".join(f"{controller} at {path}" for controller, path in sorted(host.dirs.items()))
    return Check("cgroups", True, f"{hierarchy}; limits use {host.mode} ({', '.join(sorted(host.dirs))}): {where}")


def _limits_summary() -> str:
    host = detect_host()
    used = f" ({', '.join(sorted(host.dirs))})" if host.dirs else " (memory only)"
    return f"{host.mode}{used}; cgroup hierarchy {host.hierarchy.kind}"


def check_gvisor() -> Check:
    """Optional: only servers with ``sandbox.runtime = "gvisor"`` need it; a real container start, not a version."""
    from bastion.sandbox.gvisor import find_runsc, probe

    try:
        runsc = find_runsc()
    except SandboxUnavailable as error:
        return Check("gvisor", False, f"{error}; needed only by servers with sandbox.runtime = \"gvisor\"")
    ok, detail = probe(runsc)
    if ok:
        return Check("gvisor", True, f"{runsc.describe()}: {detail}; platform ptrace, network none")
    return Check("gvisor", False, f"{runsc.describe()}: {detail}; servers with sandbox.runtime = \"gvisor\" "
                                  "will not start")


def check_landlock() -> Check:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                       ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 0:
        return Check("landlock", False, f"not available ({os.strerror(ctypes.get_errno())}); not required")
    return Check("landlock", True, f"ABI {abi} available; not used (mount namespaces already limit the view)")


def diagnose() -> Report:
    report = Report(checks=[check_engine(), check_proc(), check_user_namespaces(), check_seccomp(), check_cgroups(),
                            check_gvisor(), check_landlock()])
    by_name = {check.name: check for check in report.checks}
    report.will_use = {
        "engine": by_name["bubblewrap"].detail if by_name["bubblewrap"].ok else "none: servers cannot be sandboxed",
        "isolation": "user, mount, pid, ipc, uts, network and cgroup namespaces; uid 65534; no capabilities",
        "syscall filter": "seccomp deny list" if by_name["seccomp"].ok else "none",
        "resource limits": _limits_summary(),
        "cgroup hierarchy": detect_host().hierarchy.kind,
        "network": "off unless allowlisted; allowlisted hosts through a per-server proxy on a UNIX socket",
        "gvisor": ("for servers with sandbox.runtime = \"gvisor\"" if by_name["gvisor"].ok
                   else "not available: such servers are refused, never started unconfined"),
    }
    return report
