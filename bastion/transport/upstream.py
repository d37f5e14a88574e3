"""How Bastion reaches one upstream server: the transport for its configuration, and the stdio one (the interface
they share is in transport/interface.py).

An ``UpstreamTransport`` carries JSON-RPC frames (one message each, as bytes) to and from one server and says
why it ended. It knows nothing of the protocol: the handshake, the era, ids and deadlines belong to the client
session and to the ``Upstream`` that supervises it. One transport object is one attempt: when it ends, the
supervisor opens a new one to restart the server.

    transport = open_transport(name, config, launch=..., max_message_bytes=...)   # launch: how a process starts
    await transport.start(receiver)     # raises StartRefused (never retried) or any other error (retried)
    transport.send(frame)               # never blocks; raises TransportClosed once it has ended
    transport.backlog()                 # bytes sent that the server has not taken yet (its stdin pipe is full)
    reason = await transport.ended()    # after the receiver has had the last frames
    transport.refusal()                 # after the end: why a restart cannot mend it, or None
    transport.diagnostics()             # the server's last stderr lines (or an HTTP transport's own notes)
    await transport.close()             # idempotent; stops the process or the connection
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from typing import TYPE_CHECKING

from bastion.protocol.framing import LineFramer
from bastion.transport.interface import (
    DIAGNOSTICS_KEPT,
    Launcher,
    ServerProcess,
    StartRefused,
    TransportClosed,
    UpstreamReceiver,
    UpstreamTransport,
)
from bastion.transport.stdio import CoalescingWriter, WriteBatch

if TYPE_CHECKING:
    from bastion.config import ServerConfig
    from bastion.transport.credentials import UpstreamCredentials

_STDERR_GRACE = 2.0  # after a stop, how long the last stderr lines may take to arrive
# After a server's stdout ends, how long its exit may take to be seen (it says why the server ended); past this, the
# server closed its stdout and runs on, and the calls it had are failed without waiting any longer.
_EXIT_AFTER_EOF = 0.5
STDOUT_CLOSED = "closed its stdout without exiting"  # why a server ended that did so
# The words of bubblewrap, or of the shell inside the sandbox that executes the server (bastion/sandbox/process.py,
# INNER_SHIM: dash's and bash's), when the server's executable cannot be run inside the sandbox: not there, not
# executable, or its interpreter (a script's #! line) not there to be mounted.
_SANDBOX_EXEC_FAILED = re.compile(r"^(?:bwrap: execvp |bastion-sandbox: (?:line )?\d+: (?:exec: )?)(.+): "
                                  r"(No such file or directory|not found|Permission denied|Not a directory|"
                                  r"Exec format error)$")
_SANDBOX_SOURCE_MISSING = re.compile(r"bwrap: Can't find source path (.+): No such file or directory")
# What a shell wrapper exits with when its command is missing (127) or not executable (126).
_SHELL_NOT_FOUND = {126: "is not executable", 127: "was not found"}


def open_transport(name: str, config: ServerConfig, *, launch: Launcher, max_message_bytes: int,
                   writes: WriteBatch, credentials: "UpstreamCredentials | None" = None) -> UpstreamTransport:
    """A new transport to the server ``config`` describes (one attempt); a remote server's requests carry
    ``credentials`` (bastion/credentials), asked anew for each request."""
    if config.url is not None:
        from bastion.transport.http_client import HttpTransport  # only a remote server loads the HTTP client

        return HttpTransport.for_server(name, config, max_message_bytes=max_message_bytes, credentials=credentials)
    return StdioTransport(name, config, launch=launch, max_message_bytes=max_message_bytes, writes=writes)


class StdioTransport:
    """A local server's process: frames are lines on its stdin and stdout; its stderr is kept and logged."""

    def __init__(self, name: str, config: ServerConfig, *, launch: Launcher, max_message_bytes: int,
                 writes: WriteBatch) -> None:
        self.name = name
        self._config = config
        self._launch = launch
        self._max_bytes = max_message_bytes
        self._writes = writes
        self._log = logging.getLogger(f"bastion.server.{name}")
        self._stderr: deque[str] = deque(maxlen=DIAGNOSTICS_KEPT)
        self._process: ServerProcess | None = None
        self._frames: CoalescingWriter | None = None
        self._pipe: asyncio.WriteTransport | None = None
        self._stdout_ended = asyncio.Event()
        self._stderr_task: asyncio.Task[None] | None = None
        self._closed = False
        # Until the server is ready its stderr lines are kept (and logged at DEBUG only): a start that fails quotes
        # them in the message saying so, once, rather than have a traceback on stderr twice at every start.
        self._live = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def start(self, receiver: UpstreamReceiver) -> None:
        try:
            process = await self._launch(self.name, self._config)
        except Exception as exc:  # noqa: BLE001 - any launch failure is reported, never raised into the gateway
            if _cannot_execute(exc):
                raise StartRefused(f"failed to start: {exc}") from exc
            raise
        self._process = process
        if self._closed:  # closed while it was starting
            await process.terminate()
            raise TransportClosed("closed while starting")
        self._frames = CoalescingWriter(process.stdin, self._writes)
        self._pipe = process.stdin.transport
        self._stderr_task = asyncio.create_task(self._pump_stderr(process))
        framer = LineFramer(self._max_bytes)
        ended = self._stdout_ended

        def on_data(data: bytes) -> None:
            try:
                receiver.frames_received(framer.feed(data) if data else framer.eof())
            finally:
                if not data:
                    ended.set()

        process.listen_stdout(on_data)

    def send(self, frame: bytes) -> None:
        frames = self._frames
        if frames is None:
            raise TransportClosed(f"server {self.name!r} is not running")
        try:
            frames.write(frame)
        except (ConnectionError, RuntimeError) as exc:
            raise TransportClosed(str(exc)) from None

    def backlog(self) -> int:
        pipe = self._pipe
        if pipe is None:
            return 0
        # The frames held to leave together at the end of this chunk or turn count too: requests that arrive
        # together (many POSTs in one turn of the loop) would otherwise all pass a bound none of them saw.
        return pipe.get_write_buffer_size() + self._frames.held  # type: ignore[union-attr]

    async def ended(self) -> str:
        """Its stdout has ended: the server exited (the reason says how), or closed its stdout and runs on."""
        process = self._process
        if process is None:
            return "not started"
        await self._stdout_ended.wait()
        # A server that exits closes its stdout as it goes: its exit follows the end of the stream closely.
        exited = asyncio.ensure_future(process.exited())
        try:
            done, _ = await asyncio.wait({exited}, timeout=_EXIT_AFTER_EOF)
        finally:
            if not exited.done():
                exited.cancel()
        if not done:
            return STDOUT_CLOSED
        return process.termination_reason() or f"exited with status {exited.result()}"

    def refusal(self) -> str | None:
        for line in reversed(self._stderr):
            found = _SANDBOX_EXEC_FAILED.match(line)
            if found is not None:
                return f"{found.group(1)} cannot be run inside the sandbox: {found.group(2)}"
            # bubblewrap may say so after the process has started, as well as before (when spawning raises it).
            missing = _SANDBOX_SOURCE_MISSING.search(line)
            if missing is not None:
                return f"{missing.group(1)} cannot be run inside the sandbox: it is not there to be mounted"
        status = getattr(self._process, "returncode", None)
        if status in _SHELL_NOT_FOUND:
            return f"exited with status {status}: its command {_SHELL_NOT_FOUND[status]}"
        return None

    def diagnostics(self) -> list[str]:
        return list(self._stderr)

    def live(self) -> None:
        """The server is ready: what it wrote on stderr while starting is logged now, and each line from now on as it
        comes."""
        self._live = True
        for text in self._stderr:
            self._log.info("%s", text)

    async def close(self) -> None:
        first = not self._closed
        self._closed = True
        self._frames = None
        self._pipe = None
        process = self._process
        if process is not None:
            await process.terminate()
        task = self._stderr_task
        if first and task is not None:
            # The last lines say why it failed; a process left holding stderr open must not hold the restart.
            await asyncio.wait({task}, timeout=_STDERR_GRACE)
            task.cancel()

    async def _pump_stderr(self, process: ServerProcess) -> None:
        while True:
            try:
                line = await process.stderr.readline()
            except ValueError:  # a line over the stream limit: skip what was buffered
                continue
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                self._stderr.append(text)
                self._log.log(logging.INFO if self._live else logging.DEBUG, "%s", text)


def _cannot_execute(error: BaseException) -> bool:
    """Whether a launch failed for want of the executable (not found, not executable), whatever wrapped it."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (FileNotFoundError, PermissionError, StartRefused)):
            return True
        if _SANDBOX_SOURCE_MISSING.search(str(seen)):
            return True
        if getattr(seen, "permanent", False):  # a launcher's own failure that a retry cannot mend
            return True
        seen = seen.__cause__
    return False
