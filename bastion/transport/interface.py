"""The upstream transport interface, which the stdio and HTTP transports implement and the ``Upstream`` above
them uses: start, send a frame, frames to a receiver, why it ended, stderr, close (see transport/upstream.py)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Awaitable, Callable, Iterable, Protocol

from bastion.protocol.framing import Oversize

if TYPE_CHECKING:
    from bastion.config import ServerConfig

DIAGNOSTICS_KEPT = 20  # a server's last stderr lines, kept to say why it failed


class StartRefused(Exception):
    """A start that would fail the same way every time (a missing executable): reported once, never retried."""


class TransportClosed(ConnectionError):
    """A frame sent to a transport that is not running (not started yet, ended, or closed)."""


class UpstreamReceiver(Protocol):
    """Who a transport hands the server's frames to."""

    def frames_received(self, frames: Iterable[bytes | Oversize]) -> None:
        """One chunk of frames as it arrived (an ``Oversize`` stands for a frame over the limit, dropped). Frames
        written while handling a chunk may be held and sent together when it is done (see ``WriteBatch``)."""


class UpstreamTransport(Protocol):
    async def start(self, receiver: UpstreamReceiver) -> None:
        """Open the connection or start the process; frames go to ``receiver`` from now on. Raises
        ``StartRefused`` for a failure a retry cannot mend, any other exception for one it may."""

    def send(self, frame: bytes) -> None:
        """Send one frame (a JSON-RPC message, without framing), never blocking. Raises ``TransportClosed``."""

    def backlog(self) -> int:
        """Bytes sent but not yet taken by the server: what a local server that stopped reading its stdin leaves
        in Bastion's memory (0 for a transport that holds nothing for its server)."""

    async def ended(self) -> str:
        """Wait until the transport has ended (the server exited, the connection dropped for good) and say why.
        Every frame that arrived has been handed to the receiver by then."""

    def refusal(self) -> str | None:
        """After the end: why restarting cannot help (say, the executable is missing), or None."""

    def diagnostics(self) -> list[str]:
        """The last lines the server wrote on stderr in this attempt, oldest first (or a remote transport's own
        notes about what went wrong)."""

    async def close(self) -> None:
        """Stop the process or drop the connection and free what it holds; calling it again does nothing."""


# How a local server's process is started: given by the gateway (``bastion.gateway.launch.launch_server``, through
# the sandbox), so the transport runs no installs and spawns nothing of its own.
Launcher = Callable[[str, "ServerConfig"], Awaitable["ServerProcess"]]


class ServerProcess(Protocol):
    """What the stdio transport needs of a started process (``bastion.sandbox.ServerProcess`` is one)."""

    stdin: asyncio.StreamWriter
    stderr: asyncio.StreamReader
    pid: int

    async def wait(self) -> int: ...
    async def exited(self) -> int: ...
    def termination_reason(self) -> str | None: ...
    async def terminate(self, grace: float = 2.0) -> None: ...
    def listen_stdout(self, listener: Callable[[bytes], None]) -> None: ...
