"""Shared helpers for tests that run Bastion as a real subprocess."""

from __future__ import annotations

import itertools
import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
BASTION = str(VENV_BIN / "bastion")
FIXTURES = ROOT / "tests" / "fixtures"
NODE_BIN = ROOT / "node_modules" / ".bin"


# A client's first request waits this long for servers still starting: far beyond any server here, so a test
# gets the whole catalog from its first answer (tests/test_startup.py tests the short wait itself).
READY_TIMEOUT = 120


def write_config(path: Path, servers: dict, *, policy: object = "off", guardrails: object = None,
                 exposure: str = "all") -> Path:
    """A Bastion configuration of ``servers``; policy off unless given, for tests of the data plane itself; the
    guardrails as they come unless given; every tool listed unless ``exposure`` says otherwise (the default,
    "auto", would show search mode past 10 tools)."""
    settings = {"servers": servers, "policy": policy, "ready_timeout": READY_TIMEOUT, "tools": {"exposure": exposure}}
    if guardrails is not None:
        settings["guardrails"] = guardrails
    path.write_text(json.dumps(settings))
    return path


def raw_server(marks: Path | None = None, *, tag: str = "raw-server", linger: bool = False, **extra) -> dict:
    """A config entry for the fault-test server; ``tag`` appears in its command line so tests can find it."""
    entry = {"command": sys.executable, "args": [str(FIXTURES / "raw_server.py"), tag], **extra}
    env = {}
    if marks is not None:
        env["RAW_SERVER_MARKS"] = str(marks)
        if "sandbox" not in entry:
            entry["sandbox"] = {"writable": [str(marks.parent)]}
    if linger:
        env["RAW_SERVER_LINGER"] = "1"
    if env:
        entry["env"] = env
    return entry


def _no_sandbox_here() -> str | None:
    """Why servers cannot be sandboxed on this machine (no bubblewrap), or None."""
    from bastion.sandbox.engine import SandboxUnavailable, find_engine

    try:
        find_engine()
    except SandboxUnavailable as exc:
        return str(exc)
    return None


_NO_SANDBOX = _no_sandbox_here()
# Both sandbox tiers, for a test that runs under each: bubblewrap ("default", skipped where it is missing) and none.
SANDBOX_TIERS = [
    pytest.param("default", marks=pytest.mark.skipif(_NO_SANDBOX is not None, reason=f"no sandbox: {_NO_SANDBOX}")),
    "none",
]


def pipe_holders(pipe: str, *, writing: bool) -> set[tuple[int, int]]:
    """(pid, fd) of every live process holding the pipe ``pipe`` (``pipe:[N]``, as /proc/PID/fd shows it) open for
    writing, or for reading."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") != pipe:
                    continue
                with open(f"/proc/{entry}/fdinfo/{fd}") as f:
                    flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
            except (OSError, StopIteration):
                continue
            if (flags & os.O_ACCMODE != os.O_RDONLY) == writing:
                found.add((int(entry), int(fd)))
    return found


def pids_with_tag(tag: str) -> list[int]:
    """Host pids of live processes whose command line contains ``tag``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().split(") ", 1)[1][0]
        except OSError:
            continue
        if tag.encode() in cmdline and state != "Z" and int(entry) != os.getpid():
            found.append(int(entry))
    return found


class RawClient:
    """A minimal line-oriented JSON-RPC client around ``bastion run`` (no SDK in the way)."""

    def __init__(self, config: Path, *extra_args: str, log: Path | None = None) -> None:
        """``log``, when given, receives Bastion's stderr as it is written (for a test that watches it live)."""
        self._log = log
        stderr = subprocess.PIPE if log is None else log.open("wb")
        self.proc = subprocess.Popen(
            [BASTION, "run", str(config), *extra_args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
        )
        if log is not None:
            stderr.close()  # the child has its own copy
        self._buffer = bytearray()
        self.skipped: list[dict] = []  # messages recv_response passed over (notifications, server requests)

    def send_bytes(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, obj: dict) -> None:
        self.send_bytes(json.dumps(obj).encode() + b"\n")

    def recv(self, timeout: float = 30.0) -> dict:
        return json.loads(self.recv_line(timeout))

    def recv_line(self, timeout: float = 30.0) -> bytes:
        """The next frame as the bytes Bastion wrote, without its newline."""
        deadline = time.monotonic() + timeout
        scanned = 0  # a frame of many MB arrives in many reads: each is searched once, and added without a copy
        while (end := self._buffer.find(b"\n", scanned)) < 0:
            scanned = len(self._buffer)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no message from bastion")
            ready, _, _ = select.select([self.proc.stdout], [], [], remaining)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    raise EOFError("bastion closed its stdout")
                self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[:end + 1]
        return line

    def recv_response(self, request_id, timeout: float = 30.0) -> dict:
        """The response to ``request_id``, skipping notifications in between."""
        while True:
            message = self.recv(timeout)
            if message.get("id") == request_id and "method" not in message:
                return message
            self.skipped.append(message)

    def request(self, request_id, method: str, params: dict | None = None, timeout: float = 30.0) -> dict:
        message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return self.recv_response(request_id, timeout)

    def initialize(self, version: str = "2025-11-25", capabilities: dict | None = None) -> dict:
        answer = self.request(0, "initialize", {"protocolVersion": version, "capabilities": capabilities or {},
                                                "clientInfo": {"name": "raw-test", "version": "0"}}, timeout=60)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    def close(self) -> tuple[int, str]:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._log is not None:
            return self.proc.returncode, self._log.read_text(errors="replace")
        return self.proc.returncode, self.proc.stderr.read().decode(errors="replace")


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# Ports handed out by free_port: below the kernel's ephemeral range, a block of 1,000 per pytest-xdist worker.
_PORT_BASE = 10_000
_PORT_BLOCK = 1_000
_next_port = itertools.count()


def free_port() -> int:
    """A port on 127.0.0.1, free now, for a server whose URL must be known before it starts (a resource URI names
    it). A port bind(0) just returned could be handed to another socket before the server binds it (the kernel
    draws every bind(0) and outgoing connection from its ephemeral range); these come from below that range and
    from a block of this worker's own, so no other test of the run is given the same one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    first = _PORT_BASE + index * _PORT_BLOCK
    assert first + _PORT_BLOCK <= ephemeral_low, f"no port block for worker {worker} below {ephemeral_low}"
    for _ in range(_PORT_BLOCK):
        port = first + next(_next_port) % _PORT_BLOCK
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue  # another program (a run beside this one) has it
            return port
    raise RuntimeError(f"every port of {first}-{first + _PORT_BLOCK - 1} is taken")


def pinned_servers(pins_file: Path) -> dict:
    """The servers of the one configuration file a test's pins file holds (pins are kept per configuration file
    and server name: bastion/guardrails/pin_book.py)."""
    import json

    (servers,) = json.loads(pins_file.read_text())["configurations"].values()
    return servers
