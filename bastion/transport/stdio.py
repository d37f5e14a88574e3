"""Newline-delimited frames over byte streams, and Bastion's own stdio as a protected protocol channel."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from typing import Callable

from bastion.protocol.framing import LineFramer, Oversize

_DRAIN_ABOVE = 1024 * 1024


class CoalescingWriter:
    """The first frame of an event-loop iteration leaves at once; the rest of that iteration's frames leave
    together in one write when it ends.

    Under load many responses become ready in the same iteration, and one syscall for all of them instead of
    one each is most of what a hop costs at high concurrency; a lone frame is never held back.
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._transport = writer.transport  # written to directly: the stream's write only forwards to it
        self._burst: list[bytes] | None = None
        self._loop = asyncio.get_running_loop()

    def write(self, frame: bytes) -> None:
        if self._burst is None:
            self._burst = []
            self._loop.call_soon(self._flush)
            if not self._transport.is_closing():
                self._transport.write(frame)
        else:
            self._burst.append(frame)

    def _flush(self) -> None:
        burst, self._burst = self._burst, None
        if burst and not self._transport.is_closing():
            self._transport.write(b"".join(burst))

    async def drain(self) -> None:
        # Only a peer that stopped reading makes us wait; the common case costs no await at all.
        if self._transport.get_write_buffer_size() > _DRAIN_ABOVE:
            await self._writer.drain()


class FrameReceiver(asyncio.Protocol):
    """Delivers each complete frame to ``on_frame`` as the bytes arrive, with no reader task in between."""

    def __init__(self, framer: LineFramer, on_frame: Callable[[bytes | Oversize], None], on_eof: Callable[[], None]) -> None:
        self._framer = framer
        self._on_frame = on_frame
        self._on_eof = on_eof

    def data_received(self, data: bytes) -> None:
        for frame in self._framer.feed(data):
            self._on_frame(frame)

    def eof_received(self) -> bool:
        for frame in self._framer.eof():
            self._on_frame(frame)
        self._on_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_eof()


def protect_stdout() -> int:
    """Keep a private duplicate of fd 1 for protocol frames and point fd 1 at stderr.

    After this, a stray ``print`` or a library writing to stdout lands on stderr instead of corrupting the
    protocol stream.
    """
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol_fd


async def open_protocol_writer(protocol_fd: int) -> asyncio.StreamWriter:
    """The writer for the protocol channel (the private duplicate of stdout)."""
    loop = asyncio.get_running_loop()
    out = os.fdopen(protocol_fd, "wb", buffering=0)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, out)
    return asyncio.StreamWriter(transport, protocol, None, loop)


async def read_stdin(
    on_frame: Callable[[bytes | Oversize], None], on_eof: Callable[[], None], max_bytes: int, stdin_fd: int = 0
) -> None:
    """Deliver stdin's frames to ``on_frame`` from now on, and call ``on_eof`` when it ends."""
    loop = asyncio.get_running_loop()
    receiver = FrameReceiver(LineFramer(max_bytes), on_frame, on_eof)
    stdin = os.fdopen(stdin_fd, "rb", buffering=0, closefd=False)
    if stat.S_ISREG(os.fstat(stdin_fd).st_mode):
        # epoll cannot watch regular files; read them on a thread instead.
        loop.create_task(_pump_file(stdin, receiver))
    else:
        await loop.connect_read_pipe(lambda: receiver, stdin)


async def _pump_file(source, receiver: FrameReceiver) -> None:
    while chunk := await asyncio.to_thread(source.read, 1 << 20):
        receiver.data_received(chunk)
    receiver.eof_received()
