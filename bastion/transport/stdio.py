"""Newline-delimited frames over byte streams, and Bastion's own stdio as a protected protocol channel."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import sys
from typing import Callable, Iterable, TypeVar

from bastion.protocol.framing import LineFramer, Oversize

logger = logging.getLogger("bastion.transport")

_DRAIN_ABOVE = 1024 * 1024
_Frame = TypeVar("_Frame")


class WriteBatch:
    """Frames written while one chunk of input is handled leave in as few writes as possible.

    Nearly every frame Bastion writes is caused by a chunk it read: a client's requests, a server's answers. A
    receiver hands each chunk's frames to ``deliver``. Meanwhile each writer sends its first frame at
    once (a lone frame is never held back) and holds the rest, and when the chunk is done each writer's held
    frames leave in one write. Under load many frames come out of one chunk, and one syscall for all of them instead of one each
    is most of what a hop costs at high concurrency. Flushing when the chunk is done, rather than from a callback
    scheduled on the loop, also spares an idle turn of the loop (a poll of its own) after every burst.

    A frame written outside any chunk (from a timer or a task) leaves at once, and those written after it in the
    same turn of the loop (by the other Tasks it woke) leave together when the turn is done.
    """

    __slots__ = ("is_open", "_held", "_held_for_turn")

    def __init__(self) -> None:
        self.is_open = False
        self._held: list[CoalescingWriter] = []
        self._held_for_turn: list[CoalescingWriter] = []

    def deliver(self, frames: Iterable[_Frame], on_frame: Callable[[_Frame], None]) -> None:
        """Hand one chunk's frames to ``on_frame``, then send what its writers held, even if handling failed. A
        chunk delivered inside another (nothing nests on the loop, but a caller may) leaves that to the outer one."""
        outermost = not self.is_open
        self.is_open = True
        try:
            for frame in frames:
                on_frame(frame)
        finally:
            if outermost:
                self.is_open = False
                held = self._held
                if held:
                    self._held = []
                    for writer in held:
                        writer.flush()

    def hold(self, writer: CoalescingWriter) -> None:
        self._held.append(writer)

    def hold_for_turn(self, writer: CoalescingWriter) -> None:
        """A frame written outside any chunk, from a request's Task: the frames the other Tasks woken in this turn
        of the loop write after it leave together, once the turn is done."""
        if not self._held_for_turn:
            asyncio.get_running_loop().call_soon(self._flush_turn)
        self._held_for_turn.append(writer)

    def _flush_turn(self) -> None:
        held, self._held_for_turn = self._held_for_turn, []
        for writer in held:
            writer.flush()


class CoalescingWriter:
    """A transport's writer that sends, during a ``WriteBatch`` chunk, the first frame at once and the rest in
    one write when the chunk is done."""

    def __init__(self, writer: asyncio.StreamWriter, batch: WriteBatch) -> None:
        self._writer = writer
        self._transport = writer.transport  # written to directly: the stream's write only forwards to it
        self._batch = batch
        self._burst: list[bytes] | None = None
        self.held = 0  # bytes of the frames held in the burst: a backlog of its own until they leave
        self._held_by_chunk = False  # a chunk being handled sends the held frames when it is done

    def write(self, frame: bytes, _message: object = None) -> None:
        """Send ``frame``; a session hands over the message it is too, which a byte stream has no use for."""
        burst = self._burst
        batch = self._batch
        if burst is not None:
            burst.append(frame)
            self.held += len(frame)
            if batch.is_open and not self._held_by_chunk:  # held for the turn: the chunk sends them sooner
                self._held_by_chunk = True
                batch.hold(self)
            return
        self._burst = []
        if batch.is_open:
            self._held_by_chunk = True
            batch.hold(self)
        else:
            batch.hold_for_turn(self)
        if not self._transport.is_closing():
            self._transport.write(frame)

    def flush(self) -> None:
        self._held_by_chunk = False
        self.held = 0
        burst, self._burst = self._burst, None
        if burst and not self._transport.is_closing():
            self._transport.write(b"".join(burst))

    async def drain(self) -> None:
        # Only a peer that stopped reading makes us wait; the common case costs no await at all.
        if self._transport.get_write_buffer_size() > _DRAIN_ABOVE:
            await self._writer.drain()


class FrameReceiver(asyncio.Protocol):
    """Delivers each complete frame to ``on_frame`` as the bytes arrive, with no reader task in between."""

    def __init__(self, framer: LineFramer, on_frame: Callable[[bytes | Oversize], None], on_eof: Callable[[], None],
                 batch: WriteBatch) -> None:
        self._framer = framer
        self._on_frame = on_frame
        self._on_eof = on_eof
        self._batch = batch

    def data_received(self, data: bytes) -> None:
        self._batch.deliver(self._framer.feed(data), self._on_frame)

    def eof_received(self) -> bool:
        for frame in self._framer.eof():
            self._on_frame(frame)
        self._on_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_eof()


def loop_can_watch(fd: int) -> bool:
    """Whether an event loop can wait on ``fd``: pipes, sockets and terminals, yes; regular files and most other
    devices, /dev/null among them, no.

    epoll refuses those with EPERM. The stock loop raises (or never sees the end of input); uvloop's libuv treats
    the refusal as impossible and aborts the process on its next turn. A client's launcher may well hand Bastion
    such a descriptor (output captured to a file, input from /dev/null), so it must be read and written without
    the loop.
    """
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write ``data`` whole to a blocking ``fd`` (``os.write`` may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class FileWriteTransport(asyncio.WriteTransport):
    """The protocol channel when it is a file or a device the loop cannot watch (see ``loop_can_watch``).

    A write to one never waits for a reader to make room, so each frame is written whole at once and nothing is
    ever buffered: there is no readiness to wait for, and a drain never waits.
    """

    def __init__(self, fd: int, protocol: asyncio.BaseProtocol, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._fd = fd
        self._protocol = protocol
        self._loop = loop
        self._closing = False
        protocol.connection_made(self)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        try:
            write_all(self._fd, data)
        except OSError as exc:  # a full disk, say: the channel is lost as a pipe's is when its reader goes
            self._close(exc)

    def is_closing(self) -> bool:
        return self._closing

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self._close(None)

    def abort(self) -> None:
        self._close(None)

    def _close(self, exc: Exception | None) -> None:
        if self._closing:
            return
        self._closing = True
        os.close(self._fd)
        # As from the loop's own transports: never from inside the write or close that ended the channel.
        self._loop.call_soon(self._protocol.connection_lost, exc)


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
    transport: asyncio.WriteTransport
    if loop_can_watch(protocol_fd):
        out = os.fdopen(protocol_fd, "wb", buffering=0)
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, out)
    else:
        protocol = asyncio.streams.FlowControlMixin(loop)
        transport = FileWriteTransport(protocol_fd, protocol, loop)
    return asyncio.StreamWriter(transport, protocol, None, loop)


async def read_stdin(
    on_frame: Callable[[bytes | Oversize], None], on_eof: Callable[[], None], max_bytes: int, batch: WriteBatch,
    stdin_fd: int = 0,
) -> None:
    """Deliver stdin's frames to ``on_frame`` from now on, each chunk in ``batch``, and call ``on_eof`` when it
    ends."""
    loop = asyncio.get_running_loop()
    receiver = FrameReceiver(LineFramer(max_bytes), on_frame, on_eof, batch)
    stdin = os.fdopen(stdin_fd, "rb", buffering=0, closefd=False)
    if not loop_can_watch(stdin_fd):
        # A blocking read on a thread needs no readiness from epoll. The pending read's future holds the task
        # while it waits, and the task lets no exception escape, so nothing needs to keep it.
        loop.create_task(_pump_file(stdin, receiver))
    else:
        await loop.connect_read_pipe(lambda: receiver, stdin)


async def _pump_file(source, receiver: FrameReceiver) -> None:
    try:
        while chunk := await asyncio.to_thread(source.read, 1 << 20):
            receiver.data_received(chunk)
    except OSError as exc:  # a directory, a failing disk: the input ends here, as a broken pipe's would
        logger.warning("reading the client's input failed (%s); treating it as closed", exc)
        receiver.connection_lost(exc)
        return
    receiver.eof_received()
