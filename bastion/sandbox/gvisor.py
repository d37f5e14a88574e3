"""The gVisor tier: the bubblewrap tier's view, grants and limits, with runsc's user-space kernel in between.

The server's system calls are served by gVisor's Sentry, not the host kernel, so a kernel bug reachable from
the server is no longer a way out. What it sees is decided by the same plan as under bubblewrap
(``plan_sandbox``: the mounts, the command, its working directory and environment), written as an OCI bundle in
a private directory and run with ``runsc run`` (docs/sandbox.md, "The gVisor tier").
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import resource
import secrets
import shutil
import signal
import subprocess
import tempfile
from typing import Any

from bastion.sandbox import seccomp
from bastion.sandbox.cgroups import ResourceLimits, detect_host
from bastion.sandbox.config import ProfileLimits, SandboxConfig, format_bytes
from bastion.sandbox.egress import EgressProxy
from bastion.sandbox.engine import Engine, SandboxUnavailable
from bastion.sandbox.process import (
    SHELL, STREAM_LIMIT, RuntimeHooks, SandboxError, ServerProcess, _pid_namespace, _quietly, _start, bound_to_gateway,
    plan_sandbox,
)
from bastion.sandbox.view import Mount

log = logging.getLogger("bastion.sandbox")

INSTALL_HINT = ("install gVisor's runsc: apt-get install runsc (Debian 12 and later), or the release binary from "
                "https://gvisor.dev/docs/user_guide/install/")
WORKDIR_PREFIX = "bastion-gvisor-"
# runsc's own processes (the run command, the Gofer, the Sentry and its ptrace stubs) are host processes and
# threads in the server's cgroup: a host pids limit of the server's size would stop gVisor itself (the Go
# runtime aborts when it cannot start a thread). So the server's limit is RLIMIT_NPROC inside the Sentry, which
# counts its processes and threads as the pids controller does, and the host group gets a backstop above it:
# under the ptrace platform each process of the server is a stub process on the host, and each running thread
# holds a Sentry thread, with the Go runtime's own threads on top.
HOST_PIDS = lambda pids: 4 * pids + 256  # noqa: E731
# The shell runsc is started by waits for one line on its stdin before it executes runsc: by then its pid is in
# the server's cgroup, so every process of the sandbox starts inside it. A shell's `read` takes a pipe byte by
# byte, so nothing after that line is consumed: the server reads its stdin from the first byte Bastion writes.
GATE = 'read -r _ || exit 125; exec "$@"'
GATE_LINE = b"\n"
CONTAINER_PREFIX = "bastion-"


def _version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    first = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    return first.removeprefix("runsc version").strip() or "unknown"


@functools.lru_cache(maxsize=1)
def find_runsc() -> Engine:
    """The distribution's runsc on PATH, resolved once per process."""
    found = shutil.which("runsc")
    if found is None:
        raise SandboxUnavailable(f"gVisor (runsc) is not on PATH; {INSTALL_HINT}")
    return Engine(found, _version(found), name="runsc")


def runsc_flags(state: str, *, egress: bool) -> list[str]:
    """Global flags: Bastion's private state directory, no network device, the OCI seccomp filter loaded inside,
    cgroups left to Bastion (the same code as bubblewrap's), and host UNIX sockets only for the egress proxy's."""
    flags = [f"--root={state}", "--network=none", "--oci-seccomp", "--ignore-cgroups"]
    if egress:
        # Connecting to a host socket bound into the view; only the proxy's socket is bound on purpose.
        flags.append("--host-uds=open")
    if os.geteuid() != 0:
        flags.append("--rootless")
    return flags


def sandbox_identity() -> tuple[int, int]:
    """Who the server is inside: Bastion's own uid and gid, without a single capability.

    gVisor checks file permissions against the owners the host reports, unmapped, so this is what makes a
    writable grant writable, as the user namespace does under bubblewrap, where uid 65534 inside maps to Bastion's
    user outside. An empty bounding set means even uid 0 regains no capability when it executes a program.
    """
    return os.geteuid(), os.getegid()


def _oci_mount(mount: Mount) -> dict[str, Any] | None:
    if mount.kind in ("ro", "rw"):
        return {"destination": mount.dest, "type": "bind", "source": mount.source,
                "options": ["rbind", "ro" if mount.kind == "ro" else "rw"]}
    if mount.kind == "tmpfs":
        uid, gid = sandbox_identity()
        options = ["mode=1777"] if mount.dest == "/tmp" else ["mode=0700", f"uid={uid}", f"gid={gid}"]
        return {"destination": mount.dest, "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", *options]}
    return None  # symlinks and empty directories are made in the root file system itself


def build_rootfs(rootfs: str, mounts: list[Mount]) -> None:
    """An empty, read-only root holding only the symlinks, directories and mount points the view names."""
    for mount in mounts:
        target = rootfs + mount.dest
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.lexists(target):
            continue
        if mount.kind == "symlink":
            os.symlink(mount.source, target)
        elif mount.kind in ("ro", "rw") and not os.path.isdir(mount.source):
            open(target, "w").close()
        else:
            os.makedirs(target, exist_ok=True)


def oci_spec(command: list[str], env: dict[str, str], cwd: str, mounts: list[Mount], limits: ProfileLimits,
             network: bool) -> dict[str, Any]:
    """config.json of the bundle: the process (no capabilities, no_new_privs, RLIMIT_NPROC as the pids limit),
    the view's mounts in order, the namespaces, and the same seccomp deny list as bubblewrap's."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    oci_mounts = [{"destination": "/proc", "type": "proc", "source": "proc"},
                  {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]}]
    oci_mounts += [entry for entry in (_oci_mount(mount) for mount in mounts) if entry is not None]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "user": dict(zip(("uid", "gid"), sandbox_identity())),
            "args": command,
            "env": [f"{key}={value}" for key, value in env.items()],
            "cwd": cwd,
            "noNewPrivileges": True,
            "capabilities": {"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []},
            "rlimits": [{"type": "RLIMIT_NPROC", "hard": limits.pids, "soft": limits.pids},
                        {"type": "RLIMIT_NOFILE", "hard": nofile[1], "soft": nofile[0]},
                        {"type": "RLIMIT_CORE", "hard": 0, "soft": 0}],
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "mcp-sandbox",
        "mounts": oci_mounts,
        "linux": {
            "namespaces": [{"type": kind} for kind in ("pid", "network", "ipc", "uts", "mount")],
            "seccomp": seccomp.oci_filter(network),
        },
    }


def _containers(runsc: str, state: str) -> list[str]:
    try:
        listed = subprocess.run([runsc, f"--root={state}", "list", "--quiet"], capture_output=True, text=True,
                                timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()]


def delete_containers(runsc: str, state: str) -> None:
    """``runsc delete --force`` every container in ``state``: kills what is left of it and forgets it."""
    for container in _containers(runsc, state):
        subprocess.run([runsc, f"--root={state}", "delete", "--force", container], capture_output=True,
                       timeout=30, check=False)


def workdir_prefix() -> str:
    return f"{WORKDIR_PREFIX}{_pid_namespace()}-{os.getpid()}-"


def sweep_stale(runsc: str) -> list[str]:
    """Containers and directories of gateways (in this pid namespace) that were SIGKILLed and are gone."""
    base = tempfile.gettempdir()
    own_namespace = f"{WORKDIR_PREFIX}{_pid_namespace()}-"
    swept = []
    try:
        entries = os.listdir(base)
    except OSError:
        return swept
    for entry in entries:
        if entry.startswith(own_namespace):
            pid = entry[len(own_namespace):].split("-", 1)[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                directory = os.path.join(base, entry)
                delete_containers(runsc, os.path.join(directory, "state"))
                shutil.rmtree(directory, ignore_errors=True)
                swept.append(directory)
    return swept


class _Container:
    """One runsc container's name and state: how Bastion asks it to stop and removes it."""

    def __init__(self, runsc: str, state: str) -> None:
        self.runsc = runsc
        self.state = state
        self.id = f"{CONTAINER_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"

    async def terminate(self) -> None:
        """SIGTERM to the server inside: a signal to runsc itself is not passed on."""
        await asyncio.to_thread(subprocess.run, [self.runsc, f"--root={self.state}", "kill", self.id, "TERM"],
                                capture_output=True, timeout=30, check=False)

    async def release(self) -> None:
        await asyncio.to_thread(delete_containers, self.runsc, self.state)


def _prepare_bundle(workdir: str, command: str, args: list[str], env: dict[str, str], cwd: str | None,
                    config: SandboxConfig, engine: Engine, egress_socket: str | None) -> str:
    plan = plan_sandbox(engine, command, args, env, cwd, config, workdir, egress_socket)
    bundle = os.path.join(workdir, "bundle")
    build_rootfs(os.path.join(bundle, "rootfs"), plan.mounts)
    spec = oci_spec(plan.command, plan.env, plan.cwd, plan.mounts, config.limits, network=egress_socket is not None)
    # The server's environment (secrets it was given) is in this file: readable by Bastion's user only.
    descriptor = os.open(os.path.join(bundle, "config.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(spec, handle)
    return bundle


async def spawn_gvisor(name: str, command: str, args: list[str], env: dict[str, str], cwd: str | None,
                       config: SandboxConfig) -> ServerProcess:
    try:
        runsc = find_runsc()
    except SandboxUnavailable as error:
        raise SandboxError(str(error)) from error
    await asyncio.to_thread(sweep_stale, runsc.path)
    workdir = tempfile.mkdtemp(prefix=workdir_prefix())
    state = os.path.join(workdir, "state")
    container = _Container(runsc.path, state)
    proxy: EgressProxy | None = None
    limits: ResourceLimits | None = None
    started = None
    try:
        os.mkdir(state, 0o700)
        if config.network:
            proxy = EgressProxy(name, config.allow_rules, os.path.join(workdir, "egress.sock"))
            await proxy.start()
        bundle = await asyncio.to_thread(_prepare_bundle, workdir, command, args, env, cwd, config, runsc,
                                         proxy.socket_path if proxy else None)
        wanted = config.limits
        limits = await ResourceLimits.create(detect_host(), name, ProfileLimits(
            memory=wanted.memory, cpu=wanted.cpu, pids=HOST_PIDS(wanted.pids)))
        argv = bound_to_gateway([SHELL, "-c", GATE, "bastion-gvisor", runsc.path,
                                 *runsc_flags(state, egress=proxy is not None), "run", "--bundle", bundle, container.id],
                                "KILL")
        # runsc needs no secret: the server's environment is in the bundle.
        started = await _start(argv, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, limit=STREAM_LIMIT)
        await limits.place(started.process.pid)
        started.stdin.write(GATE_LINE)
        await started.stdin.drain()
    except BaseException:
        if started is not None:
            started.stdin.close()
            _quietly(os.kill, started.process.pid, signal.SIGKILL)
            await started.process.wait()
        await container.release()
        if limits is not None:
            await limits.release()
        if proxy is not None:
            await proxy.close()
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    network = f"egress via proxy to {', '.join(config.network)}" if config.network else "network off"
    log.info("server %r sandboxed: %s, gVisor, seccomp on, %s: memory %s, cpu %g, pids %d, %s", name,
             runsc.describe(), limits.mode, format_bytes(wanted.memory), wanted.cpu, wanted.pids, network)
    return ServerProcess(started, limits=limits, proxy=proxy, workdir=workdir,
                         runtime=RuntimeHooks(terminate=container.terminate, release=container.release))


def probe(runsc: Engine) -> tuple[bool, str]:
    """A tiny container started the way servers are (``runsc do``, the same flags): whether gVisor runs here, or
    runsc's own words for why not."""
    with tempfile.TemporaryDirectory(prefix="bastion-gvisor-probe-") as state:
        flags = [flag for flag in runsc_flags(state, egress=False) if flag != "--oci-seccomp"]
        try:
            result = subprocess.run([runsc.path, *flags, "do", "/bin/true"], capture_output=True, text=True,
                                    timeout=60, check=False, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as error:
            return False, f"runsc probe failed: {error}"
    if result.returncode == 0:
        return True, "a container ran /bin/true"
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    return False, f"runsc probe failed (exit {result.returncode}): {lines[-1] if lines else 'no message'}"
