"""Spawning and stopping every local MCP server, sandboxed or not, in one place."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Awaitable, Callable

from bastion.argument_paths import granting
from bastion.sandbox import seccomp
from bastion.sandbox.cgroups import ResourceLimits, detect_host
from bastion.sandbox.config import SandboxConfig, format_bytes
from bastion.sandbox.egress import EgressProxy
from bastion.sandbox.engine import Engine, SandboxUnavailable, find_engine
from bastion.sandbox.view import (
    DEFAULT_PATH, RUN_DIR, SANDBOX_UID, Mount, arg_paths, identity_files, order_mounts, protected_dirs,
    resolve_command, resolve_shim, runtime_paths, system_mounts,
)

log = logging.getLogger("bastion.sandbox")

STREAM_LIMIT = 64 * 1024 * 1024  # the gateway reads JSON-RPC lines of tens of MB
LOCALE = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
PROXY_PORT = 3128
FORWARDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forwarder.py")
# A sandboxed server's stdin and stdout are handed over so that it alone holds them: bwrap's two processes (the
# monitor outside and pid 1 inside) keep their own 0, 1 and 2 open while the sandbox lives, and close every other
# descriptor they are given. So bwrap gets the pipes at these numbers, with /dev/null as its own stdin and stdout
# (OUTER_SHIM, a shell that then executes bwrap), and a shell inside (INNER_SHIM, which bwrap executes) moves them
# to the server's 0 and 1 and closes them before it executes the server. A POSIX shell redirects one-digit
# descriptors only.
HANDOVER_STDIN, HANDOVER_STDOUT = 3, 4
SHELL = "/bin/sh"
# The outer shell stays bwrap's parent, holding none of the pipes once bwrap has them, so that the gateway's death
# (SIGTERM through PR_SET_PDEATHSIG, see bound_to_gateway) kills the process group: bwrap's monitor and, in the
# moments after bwrap clones it and before it calls setsid, the sandbox's first process too, which bwrap's own
# --die-with-parent does not yet cover then (it is left blocked for ever, with parent pid 1).
OUTER_SHIM = (f'trap "kill -KILL 0" TERM; exec {HANDOVER_STDIN}<&0 {HANDOVER_STDOUT}>&1 </dev/null >/dev/null; '
              f'"$@" & exec {HANDOVER_STDIN}<&- {HANDOVER_STDOUT}>&-; wait $!')
# The first line on the server's stdin is the gateway's go-ahead, written once the sandbox is in its groups. bwrap
# executes the inner shell once its block fd is readable, and a dead gateway's end of that pipe reads as end of file
# too; a sandbox whose bwrap died before bwrap's --die-with-parent took hold of it would then run the server with
# no one to stop it. Without the go-ahead (end of file: the gateway is gone) the inner shell exits instead.
GO_AHEAD = b"go\n"
INNER_SHIM = (f'read -r go <&{HANDOVER_STDIN} && [ "$go" = go ] || exit 125; '
              f'exec "$@" <&{HANDOVER_STDIN} >&{HANDOVER_STDOUT} {HANDOVER_STDIN}<&- {HANDOVER_STDOUT}>&-')
SHIM_NAME = "bastion-sandbox"  # the shell's $0: how the inner shell names itself when the server cannot run


class SandboxError(RuntimeError):
    """The server could not be started as configured; the message names the setting to change."""


def _quietly(kill, pid: int, signum: int) -> None:
    """Send a signal to a process that may already be gone."""
    try:
        kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class _StdoutPipe(asyncio.Protocol):
    """A server's stdout: every chunk to the listener once one is set, into ``reader`` until then."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.listener: Callable[[bytes], None] | None = None
        # What arrived before the listener was set (a server that fails at once can write and exit by then).
        self._early = bytearray()
        self._ended = False

    def listen(self, listener: Callable[[bytes], None]) -> None:
        self.listener = listener
        if self._early:
            listener(bytes(self._early))
            self._early.clear()
        if self._ended:
            listener(b"")

    def data_received(self, data: bytes) -> None:
        listener = self.listener
        if listener is not None:
            listener(data)
        else:
            self._early += data
            self.reader.feed_data(data)

    def eof_received(self) -> bool:
        return False  # close: connection_lost says it ended

    def connection_lost(self, exc: Exception | None) -> None:
        if self.listener is not None:
            self.listener(b"")
        else:
            self._ended = True
            self.reader.feed_eof()


class _Child:
    """A started process: its pid, its stderr, and its exit status (negative: the signal that killed it).

    Its exit is watched through a pidfd on the event loop (by a thread where the kernel has no pidfds), since the
    loop's own child watcher knows only the processes the loop started.
    """

    def __init__(self, popen: subprocess.Popen[bytes], stderr: asyncio.StreamReader) -> None:
        self._popen = popen
        self.pid: int = popen.pid
        self.stderr = stderr
        self.returncode: int | None = None
        loop = asyncio.get_running_loop()
        self._exit: asyncio.Future[int] = loop.create_future()
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # an older kernel, or none at all
            threading.Thread(target=self._wait_in_thread, args=(loop,), daemon=True,
                             name=f"wait-{self.pid}").start()
        else:
            loop.add_reader(pidfd, self._poll, loop, pidfd)

    def _poll(self, loop: asyncio.AbstractEventLoop, pidfd: int) -> None:
        status = self._popen.poll()
        if status is not None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._exited(status)

    def _wait_in_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        status = self._popen.wait()
        try:
            loop.call_soon_threadsafe(self._exited, status)
        except RuntimeError:  # the loop is closed: nobody is waiting
            pass

    def _exited(self, status: int) -> None:
        self.returncode = status
        if not self._exit.done():
            self._exit.set_result(status)

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)


@dataclass
class _Started:
    process: _Child  # stderr only: stdin and stdout are below
    stdin: asyncio.StreamWriter
    stdout: _StdoutPipe


async def _start(argv: list[str], *, limit: int, env: dict[str, str], cwd: str | None = None,
                 pass_fds: tuple[int, ...] = ()) -> _Started:
    """Start a process with plain pipes for stdin, stdout and stderr, and no other copy of them anywhere.

    Bastion keeps only its own ends (close-on-exec) and the child gets the others as 0, 1 and 2 and nothing else
    but ``pass_fds``: ``subprocess.Popen`` closes every other descriptor in the child. The event loop does not
    start it: uvloop would make unix socket pairs of the pipes (a socket costs the kernel about twice what a pipe
    does per write and read: a few microseconds on every frame, in Bastion and in the server alike), and hands
    its child a second, inheritable copy of every descriptor it is given, at a number above 2. A server holding
    a spare copy of its stdout never lets Bastion see that stdout end, when it closes fd 1 or passes it on.
    """
    loop = asyncio.get_running_loop()
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    stderr_read, stderr_write = os.pipe()
    parent_ends = [stdin_write, stdout_read, stderr_read]
    try:
        popen = subprocess.Popen(argv, stdin=stdin_read, stdout=stdout_write, stderr=stderr_write, env=env, cwd=cwd,
                                 pass_fds=pass_fds, start_new_session=True)
    except BaseException:
        for fd in parent_ends:
            os.close(fd)
        raise
    finally:
        for fd in (stdin_read, stdout_write, stderr_write):
            os.close(fd)
    stderr = asyncio.StreamReader(limit=limit, loop=loop)
    stdout = _StdoutPipe(asyncio.StreamReader(limit=limit, loop=loop))
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stderr, loop=loop),
                                     os.fdopen(stderr_read, "rb", buffering=0))
        parent_ends.remove(stderr_read)
        await loop.connect_read_pipe(lambda: stdout, os.fdopen(stdout_read, "rb", buffering=0))
        parent_ends.remove(stdout_read)
        pipe, flow = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                   os.fdopen(stdin_write, "wb", buffering=0))
        parent_ends.remove(stdin_write)
    except BaseException:
        for fd in parent_ends:
            os.close(fd)
        _quietly(os.killpg, popen.pid, signal.SIGKILL)  # its own session: a sandbox's shell and bwrap too
        await asyncio.to_thread(popen.wait)
        raise
    return _Started(_Child(popen, stderr), asyncio.StreamWriter(pipe, flow, None, loop), stdout)


@dataclass(frozen=True)
class RuntimeHooks:
    """What a runtime other than bwrap does at shutdown: ask the server to stop (its SIGTERM, which a signal to
    the process Bastion started would not reach), and remove what it keeps outside the server's processes."""

    terminate: Callable[[], Awaitable[None]]
    release: Callable[[], Awaitable[None]]


class ServerProcess:
    """A running server: its pipes, and a shutdown that leaves nothing behind."""

    def __init__(
        self,
        started: _Started,
        *,
        limits: ResourceLimits | None = None,
        proxy: EgressProxy | None = None,
        workdir: str | None = None,
        process_group: bool = False,
        runtime: RuntimeHooks | None = None,
    ) -> None:
        process = started.process
        assert process.stderr
        self._process = process
        self.stdin: asyncio.StreamWriter = started.stdin
        self._stdout_pipe = started.stdout
        self.stdout: asyncio.StreamReader = started.stdout.reader
        self.stderr: asyncio.StreamReader = process.stderr
        self.pid: int = process.pid
        self._limits = limits
        self._proxy = proxy
        self._workdir = workdir
        self._process_group = process_group
        self._runtime = runtime
        self._reason: str | None = None
        self._released = False
        self._release_lock = asyncio.Lock()
        self._exited = asyncio.ensure_future(self._watch_exit())

    def listen_stdout(self, listener: Callable[[bytes], None]) -> None:
        """Hand every chunk of stdout to ``listener`` as it arrives (``b""`` at the end), instead of ``stdout``.

        It saves a reader task waking for every chunk on the hot path; call it before anything is read.
        """
        self._stdout_pipe.listen(listener)

    async def _watch_exit(self) -> int:
        status = await self._process.wait()
        self.termination_reason()
        await self._release()
        return status

    def _explain(self, status: int) -> str:
        if self._limits is not None and self._limits.oom_kills() > 0:
            return f"killed: memory limit {format_bytes(self._limits.limits.memory)} exceeded"
        if status < 0:
            return f"killed by signal {-status}"
        if self._limits is not None and status > 128:
            # bwrap reports a server killed by signal N as exit status 128 + N.
            return f"killed by signal {status - 128}"
        return f"exited with status {status}"

    async def wait(self) -> int:
        """The exit status, once the server has exited and what it held is freed."""
        return await asyncio.shield(self._exited)

    async def exited(self) -> int:
        """The exit status, as soon as the server has exited."""
        return await self._process.wait()

    def termination_reason(self) -> str | None:
        """How the server ended (None while it runs)."""
        if self._reason is None and self._process.returncode is not None:
            self._reason = self._explain(self._process.returncode)
        return self._reason

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def terminate(self, grace: float = 2.0) -> None:
        """Close stdin, wait ``grace``; SIGTERM, wait ``grace``; SIGKILL; then free every resource."""
        if self._process.returncode is None:
            try:
                self.stdin.close()
            except (BrokenPipeError, ConnectionResetError, RuntimeError):
                pass
            if not await self._exits_within(grace):
                if self._runtime is not None:
                    await self._runtime.terminate()
                else:
                    self._signal_server(signal.SIGTERM)
                if not await self._exits_within(grace):
                    self._signal_server(signal.SIGKILL)
        await asyncio.shield(self._exited)
        await self._release()

    async def _exits_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(asyncio.shield(self._exited), timeout=seconds)
            return True
        except TimeoutError:
            return False

    def _signal_server(self, signum: int) -> None:
        """Signal the server itself: inside a sandbox, every process in its group (bwrap dies with them).

        Signals go through os.kill, never Popen.send_signal: that polls with waitpid and can reap the
        child behind asyncio's watcher, which then reports a made-up exit status.
        """
        if self._process.returncode is not None:
            return
        if self._limits is not None and signum == signal.SIGKILL:
            self._limits.kill_all()
        targets = [pid for pid in (self._limits.pids() if self._limits is not None else []) if pid != self.pid]
        if self._process_group or signum == signal.SIGKILL:
            # Every server starts in a session of its own; a sandbox's process group is its outer shell and bwrap.
            _quietly(os.killpg, self.pid, signum)
        for pid in targets:
            _quietly(os.kill, pid, signum)
        if signum == signal.SIGKILL or not targets:
            _quietly(os.kill, self.pid, signum)

    async def _release(self) -> None:
        async with self._release_lock:
            if self._released:
                return
            self._released = True
            try:  # children that stayed in the group die with the server (a sandbox's: its shell and bwrap)
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if self._runtime is not None:
                await self._runtime.release()
            if self._limits is not None:
                await self._limits.release()
            if self._proxy is not None:
                await self._proxy.close()
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)


@dataclass(frozen=True)
class LaunchPlan:
    """Everything decided before the sandbox starts; kept separate so it can be inspected and tested."""

    argv: list[str]
    env: dict[str, str]
    mounts: list[Mount]
    command: list[str]  # what runs inside, as the server sees it (the egress forwarder first, if any)
    cwd: str  # the working directory inside


def sandbox_home() -> str:
    home = os.environ.get("HOME") or os.path.expanduser("~")
    return home if home not in ("", "/") else "/home/sandbox"


def sandbox_env(config: SandboxConfig, env: dict[str, str], path_dirs: list[str], home: str,
                egress: bool) -> dict[str, str]:
    """Cleared, then PATH, a locale, HOME/TMPDIR, passthrough names, and the server's own settings."""
    extra_dirs = [d for d in path_dirs if d not in DEFAULT_PATH.split(":")]
    result = {"PATH": ":".join([*extra_dirs, DEFAULT_PATH]), **LOCALE, "HOME": home, "TMPDIR": "/tmp"}
    for name in config.env:
        if name in os.environ:
            result[name] = os.environ[name]
    result.update(env)
    if egress:
        proxy = f"http://127.0.0.1:{PROXY_PORT}"
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            result[name] = proxy
        result["NODE_USE_ENV_PROXY"] = "1"  # Node 24+ honours the variables only when told to
        result.pop("NO_PROXY", None)
        result.pop("no_proxy", None)
    return result


def plan_sandbox(
    engine: Engine, command: str, args: list[str], env: dict[str, str], cwd: str | None,
    config: SandboxConfig, workdir: str, egress_socket: str | None,
) -> LaunchPlan:
    home = sandbox_home()
    search_path = env.get("PATH") or os.environ.get("PATH", DEFAULT_PATH)
    try:
        executable = resolve_shim(resolve_command(command, search_path, cwd), {**os.environ, **env}, cwd)
    except FileNotFoundError as error:
        raise SandboxError(str(error)) from error
    binds, path_dirs = runtime_paths(executable, search_path)
    binds += [path for path in runtime_paths(SHELL, DEFAULT_PATH)[0] if path not in binds]
    mounts = system_mounts() + identity_files(workdir, home)
    mounts += [Mount("tmpfs", "/tmp"), Mount("tmpfs", home)]
    mounts += [Mount("ro", path, path) for path in binds + arg_paths(args, cwd, home, config.writable,
                                                                      config.read_only)]
    for path in config.read_only:
        if os.path.exists(path):
            mounts.append(Mount("ro", path, path))
        else:
            log.warning("sandbox.read_only path %s does not exist; skipped", path)
    for path in config.writable:
        if not os.path.exists(path):
            raise SandboxError(f"sandbox.writable path {path} does not exist; create it or remove it from the list")
        mounts.append(Mount("rw", path, path))
    workdir_inside = "/"
    if cwd:
        workdir_inside = os.path.abspath(cwd)
        if not os.path.isdir(workdir_inside):
            raise SandboxError(f"working directory {workdir_inside} does not exist; fix the server's cwd")
        protected = workdir_inside in protected_dirs(home) or workdir_inside == home
        if protected:
            mounts.append(Mount("dir", workdir_inside))
        elif granting(workdir_inside, [*config.writable, *config.read_only]) is None:
            # Inside a grant it is as the grant shows it: bound read-only on top, a writable folder's would not be.
            mounts.append(Mount("ro", workdir_inside, workdir_inside))
    argv_inside = [executable, *args]
    if egress_socket is not None:
        forwarder_runtime, _ = runtime_paths(sys.executable, search_path)
        mounts += [Mount("ro", path, path) for path in forwarder_runtime]
        mounts += [Mount("ro", f"{RUN_DIR}/egress.sock", egress_socket),
                   Mount("ro", f"{RUN_DIR}/forwarder.py", FORWARDER)]
        argv_inside = [sys.executable, "-I", "-S", f"{RUN_DIR}/forwarder.py", f"127.0.0.1:{PROXY_PORT}",
                       f"{RUN_DIR}/egress.sock", "--", *argv_inside]
    command_inside = argv_inside
    argv_inside = [SHELL, "-c", INNER_SHIM, SHIM_NAME, *argv_inside]
    ordered = order_mounts(mounts)
    argv = [
        engine.path,
        "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "mcp-sandbox",
        "--cap-drop", "ALL", "--disable-userns", "--die-with-parent", "--new-session",
        "--proc", "/proc", "--dev", "/dev",
    ]
    for mount in ordered:
        argv += mount.bwrap_args()
    argv += ["--remount-ro", "/", "--chdir", workdir_inside]
    return LaunchPlan(argv=argv + ["--", *argv_inside],
                      env=sandbox_env(config, env, path_dirs, home, egress_socket is not None), mounts=ordered,
                      command=command_inside, cwd=workdir_inside)


WORKDIR_PREFIX = "bastion-sandbox-"


def _pid_namespace() -> str:
    return os.readlink("/proc/self/ns/pid").strip("pid:[]")


def workdir_prefix(pid: int | None = None) -> str:
    """``bastion-sandbox-PIDNS-PID-``: a pid only means something inside its own pid namespace."""
    return f"{WORKDIR_PREFIX}{_pid_namespace()}-{pid or os.getpid()}-"


def sweep_stale_workdirs() -> None:
    """Temporary directories of gateways (in this pid namespace) that were SIGKILLed and are gone."""
    base = tempfile.gettempdir()
    own_namespace = f"{WORKDIR_PREFIX}{_pid_namespace()}-"
    try:
        entries = os.listdir(base)
    except OSError:
        return
    for entry in entries:
        if entry.startswith(own_namespace):
            pid = entry[len(own_namespace):].split("-", 1)[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                shutil.rmtree(os.path.join(base, entry), ignore_errors=True)


async def _read_info(fd: int) -> bytes:
    """bwrap's ``--info-fd`` JSON: complete once it parses, since the outer shell (which outlives bwrap's start and
    cannot close a descriptor above 9) keeps a copy of the pipe open; end of file when bwrap, then the shell, ended."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb"))
    info = b""
    try:
        while chunk := await reader.read(4096):
            info += chunk
            try:
                json.loads(info)
                break
            except ValueError:
                continue
        return info
    finally:
        transport.close()


def _above_handover(fd: int, owned: list[int]) -> int:
    """``fd``, or a copy of it (added to ``owned``) at a number the shell that starts bwrap does not write over
    (HANDOVER_STDIN, HANDOVER_STDOUT)."""
    if fd > max(HANDOVER_STDIN, HANDOVER_STDOUT):
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    owned.append(moved)
    return moved


def bound_to_gateway(argv: list[str], signal_name: str = "TERM") -> list[str]:
    """``argv`` (a shell: ``sh -c SCRIPT ...``) signalled by the kernel when the gateway dies, however it dies
    (SIGKILL included).

    bwrap's ``--die-with-parent`` binds the sandbox to bwrap, not bwrap to the gateway: a SIGKILLed gateway left
    bwrap, reparented to init, and the server it had already started (or, while bwrap waited on its block fd,
    the server it then started anyway). ``setpriv --pdeathsig`` sets PR_SET_PDEATHSIG, which survives the exec
    into the shell: bubblewrap's outer shell traps SIGTERM and kills its process group; gVisor's gate shell execs
    runsc, which SIGKILL ends with its Sentry and Gofer. The signal fires when the *thread* that forked dies:
    ``_start`` runs on the event loop's thread, which lives as long as the gateway. A gateway killed after the fork
    but before the prctl is caught by the shell: its parent is no longer the gateway then, and it exits instead
    of starting the sandbox.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return argv
    assert argv[:2] == [SHELL, "-c"]
    check = f'[ "$PPID" = {os.getpid()} ] || exit 1; '
    return [setpriv, "--pdeathsig", signal_name, "--", SHELL, "-c", check + argv[2], *argv[3:]]


async def _setup_failure(process: _Child) -> str:
    """What bwrap said when it gave up setting the sandbox up.

    A bwrap that fails after its clone (its monitor cannot read the child's namespaces, say) leaves the sandbox's
    first process blocked for ever, waiting for the monitor's go, holding stderr and still in the outer shell's
    process group: the group dies first, so that stderr ends and nothing is left behind.
    """
    try:
        await asyncio.wait_for(process.wait(), timeout=10)
    except TimeoutError:
        pass
    _quietly(os.killpg, process.pid, signal.SIGKILL)
    assert process.stderr is not None
    try:
        said = await asyncio.wait_for(process.stderr.read(), timeout=10)
    except TimeoutError:
        return ""
    return said.decode(errors="replace").strip()


async def spawn_sandboxed(name: str, command: str, args: list[str], env: dict[str, str], cwd: str | None,
                          config: SandboxConfig) -> ServerProcess:
    try:
        engine = find_engine()
    except SandboxUnavailable as error:
        raise SandboxError(str(error)) from error
    await asyncio.to_thread(sweep_stale_workdirs)
    workdir = tempfile.mkdtemp(prefix=workdir_prefix())
    proxy: EgressProxy | None = None
    limits: ResourceLimits | None = None
    started: _Started | None = None
    fds: list[int] = []
    try:
        if config.network:
            proxy = EgressProxy(name, config.allow_rules, os.path.join(workdir, "egress.sock"))
            await proxy.start()
        # Reads files and may ask a version manager where a shim points: kept off the event loop.
        plan = await asyncio.to_thread(plan_sandbox, engine, command, args, env, cwd, config, workdir,
                                       proxy.socket_path if proxy else None)
        limits = await ResourceLimits.create(detect_host(), name, config.limits)
        filter_fd = seccomp.bpf_fd(network=bool(config.network))
        fds.append(filter_fd)
        info_read, info_write = os.pipe()
        fds.append(info_write)
        block_read, block_write = os.pipe()
        fds += [block_read, block_write]
        filter_fd, info_write, block_read = [_above_handover(fd, fds) for fd in (filter_fd, info_write, block_read)]
        argv = bound_to_gateway([SHELL, "-c", OUTER_SHIM, SHIM_NAME, plan.argv[0], "--seccomp", str(filter_fd),
                                 "--info-fd", str(info_write), "--block-fd", str(block_read), *plan.argv[1:]])
        started = await _start(argv, env=plan.env, limit=STREAM_LIMIT, pass_fds=(filter_fd, info_write, block_read))
        process = started.process
        for fd in fds:
            if fd != block_write:
                os.close(fd)
        fds = [block_write]
        info = await asyncio.wait_for(_read_info(info_read), timeout=30)
        try:
            child_pid = int(json.loads(info)["child-pid"])
            await limits.place(child_pid)
            started.stdin.write(GO_AHEAD)
            os.write(block_write, b"1")  # the sandbox now executes the server
        except (ValueError, KeyError, ProcessLookupError, BrokenPipeError) as error:
            # bwrap gave up while setting up (a missing path, no user namespaces): its stderr says why.
            detail = await _setup_failure(process)
            raise SandboxError(f"sandbox for {name!r} failed to start: {detail or error}") from error
        os.close(block_write)
        fds.remove(block_write)
    except BaseException:
        for fd in fds:
            os.close(fd)
        if started is not None:
            started.stdin.close()  # stdout closes itself when the server is gone
            # The group may outlive the shell: a sandbox's first process, blocked, if bwrap died after its clone.
            _quietly(os.killpg, started.process.pid, signal.SIGKILL)
            await started.process.wait()
        if limits is not None:
            await limits.release()
        if proxy is not None:
            await proxy.close()
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    network = f"egress via proxy to {', '.join(config.network)}" if config.network else "network off"
    log.info("server %r sandboxed: %s, seccomp on, %s, %s", name, engine.describe(), limits.describe(), network)
    return ServerProcess(started, limits=limits, proxy=proxy, workdir=workdir)


async def spawn_unsandboxed(name: str, command: str, args: list[str], env: dict[str, str],
                            cwd: str | None) -> ServerProcess:
    log.warning("server %r runs WITHOUT a sandbox (profile 'none'): it can read your files and "
                "environment, reach the network and use all of the machine's resources", name)
    merged = {**os.environ, **env}
    try:
        executable = resolve_command(command, merged.get("PATH", DEFAULT_PATH), cwd)
    except FileNotFoundError as error:
        raise SandboxError(str(error)) from error
    argv = [executable, *args]
    setpriv = shutil.which("setpriv")
    if setpriv:  # dies with the gateway even if the gateway is SIGKILLed
        argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
    started = await _start(argv, env=merged, cwd=cwd, limit=STREAM_LIMIT)
    return ServerProcess(started, process_group=True)


async def spawn(name: str, command: str, args: list[str], env: dict[str, str], cwd: str | None,
                config: SandboxConfig) -> ServerProcess:
    """Start one stdio MCP server under ``config``; the gateway's only way to start a local server."""
    if not config.sandboxed:
        return await spawn_unsandboxed(name, command, args, env, cwd)
    if config.runtime == "gvisor":
        from bastion.sandbox.gvisor import spawn_gvisor  # it builds on this module's parts

        return await spawn_gvisor(name, command, args, env, cwd, config)
    return await spawn_sandboxed(name, command, args, env, cwd, config)
