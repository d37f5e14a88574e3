"""Newline-delimited frames over byte streams, and Bastion's own stdio as a protected protocol channel."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from dataclasses import dataclass

NEWLINE = b"\n"
_DRAIN_ABOVE = 1024 * 1024


class FrameTooLarge(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"a frame of at least {size} bytes exceeds the limit of {limit} bytes; it was discarded")
        self.size = size
        self.limit = limit


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes | None:
    """The next frame without its newline; None at end of stream.

    A frame longer than ``max_bytes`` is read to its end and discarded, then ``FrameTooLarge`` is raised, so the
    stream stays usable for the frames after it. The reader's own limit must exceed ``max_bytes``.
    """
    try:
        line = await reader.readuntil(NEWLINE)
    except asyncio.IncompleteReadError as exc:
        line = exc.partial  # the last frame may lack its newline
        if not line:
            return None
    except asyncio.LimitOverrunError as exc:
        await _discard_line(reader, exc.consumed)
        raise FrameTooLarge(exc.consumed, max_bytes) from None
    if line.endswith(b"\r\n"):
        line = line[:-2]
    elif line.endswith(NEWLINE):
        line = line[:-1]
    if len(line) > max_bytes:
        raise FrameTooLarge(len(line), max_bytes)
    return line


async def _discard_line(reader: asyncio.StreamReader, pending: int) -> int:
    discarded = 0
    while True:
        if pending:
            await reader.readexactly(pending)
            discarded += pending
        try:
            discarded += len(await reader.readuntil(NEWLINE))
            return discarded
        except asyncio.IncompleteReadError as exc:
            return discarded + len(exc.partial)
        except asyncio.LimitOverrunError as exc:
            pending = exc.consumed


class CoalescingWriter:
    """The first frame of an event-loop iteration leaves at once; the rest of that iteration's frames leave
    together in one write when it ends.

    Under load many responses become ready in the same iteration, and one syscall for all of them instead of
    one each is most of what a hop costs at high concurrency; a lone frame is never held back.
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._burst: list[bytes] | None = None
        self._loop = asyncio.get_running_loop()

    def write(self, frame: bytes) -> None:
        if self._burst is None:
            self._burst = []
            self._loop.call_soon(self._flush)
            if not self._writer.is_closing():
                self._writer.write(frame)
        else:
            self._burst.append(frame)

    def _flush(self) -> None:
        burst, self._burst = self._burst, None
        if burst and not self._writer.is_closing():
            self._writer.write(b"".join(burst))

    async def drain(self) -> None:
        # Only a peer that stopped reading makes us wait; the common case costs no await at all.
        if self._writer.transport.get_write_buffer_size() > _DRAIN_ABOVE:
            await self._writer.drain()


@dataclass(slots=True)
class StdioChannel:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


def protect_stdout() -> int:
    """Keep a private duplicate of fd 1 for protocol frames and point fd 1 at stderr.

    After this, a stray ``print`` or a library writing to stdout lands on stderr instead of corrupting the
    protocol stream.
    """
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol_fd


async def open_stdio(protocol_fd: int, stdin_fd: int = 0, limit: int = 64 * 1024 * 1024) -> StdioChannel:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    stdin = os.fdopen(stdin_fd, "rb", buffering=0, closefd=False)
    if stat.S_ISREG(os.fstat(stdin_fd).st_mode):
        # epoll cannot watch regular files; read them on a thread instead.
        loop.create_task(_pump_file(stdin, reader))
    else:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
    out = os.fdopen(protocol_fd, "wb", buffering=0)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, out)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return StdioChannel(reader, writer)


async def _pump_file(source, reader: asyncio.StreamReader) -> None:
    while chunk := await asyncio.to_thread(source.read, 1 << 20):
        reader.feed_data(chunk)
    reader.feed_eof()
