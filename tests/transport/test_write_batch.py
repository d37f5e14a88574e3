"""Write coalescing over real pipes: what leaves at once, what waits for the end of the chunk being handled."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

from bastion.protocol.framing import LineFramer
from bastion.transport.stdio import CoalescingWriter, FrameReceiver, WriteBatch


class Pipe:
    """A real pipe: Bastion's writer on one end, a non-blocking reader on the other."""

    def __init__(self, writer: CoalescingWriter, read_fd: int) -> None:
        self.writer = writer
        self._read_fd = read_fd

    def arrived(self) -> bytes:
        try:
            return os.read(self._read_fd, 1 << 16)
        except BlockingIOError:
            return b""


@pytest.fixture
async def pipes() -> AsyncIterator[tuple[WriteBatch, Pipe, Pipe]]:
    batch = WriteBatch()
    loop = asyncio.get_running_loop()
    opened: list[tuple[asyncio.WriteTransport, int]] = []
    made: list[Pipe] = []
    for _ in range(2):
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(write_fd, "wb", 0))
        stream = asyncio.StreamWriter(transport, protocol, None, loop)
        made.append(Pipe(CoalescingWriter(stream, batch), read_fd))
        opened.append((transport, read_fd))
    yield batch, made[0], made[1]
    for transport, read_fd in opened:
        transport.close()
        os.close(read_fd)


async def test_outside_a_chunk_a_frame_leaves_at_once_and_those_after_it_when_the_turn_is_done(pipes) -> None:
    # Requests run in Tasks: the answers the Tasks woken in one turn of the loop write leave in one write.
    _, pipe, _ = pipes
    pipe.writer.write(b"1\n")
    assert pipe.arrived() == b"1\n"
    pipe.writer.write(b"2\n")
    pipe.writer.write(b"3\n")
    assert pipe.arrived() == b""
    await asyncio.sleep(0)
    assert pipe.arrived() == b"2\n3\n"
    await asyncio.sleep(0)
    pipe.writer.write(b"4\n")  # a new turn: a lone frame is never held back
    assert pipe.arrived() == b"4\n"


async def test_frames_held_for_the_turn_leave_with_a_chunk_that_comes_first(pipes) -> None:
    batch, pipe, _ = pipes
    pipe.writer.write(b"1\n")
    pipe.writer.write(b"2\n")
    batch.deliver([b"3\n"], pipe.writer.write)
    assert pipe.arrived() == b"1\n2\n3\n"
    await asyncio.sleep(0)
    assert pipe.arrived() == b""


async def test_in_a_chunk_the_first_frame_leaves_at_once_and_the_rest_when_the_chunk_is_done(pipes) -> None:
    batch, one, other = pipes

    def handle(step: str) -> None:
        if step == "first frames":
            one.writer.write(b"a1\n")
            other.writer.write(b"b1\n")
            assert one.arrived() == b"a1\n" and other.arrived() == b"b1\n"  # a lone frame is never held back
        else:
            one.writer.write(b"a2\n")
            one.writer.write(b"a3\n")
            other.writer.write(b"b2\n")
            assert one.arrived() == b"" and other.arrived() == b""

    batch.deliver(["first frames", "more frames"], handle)
    assert one.arrived() == b"a2\na3\n" and other.arrived() == b"b2\n"
    one.writer.write(b"a4\n")  # the chunk is over: at once again
    assert one.arrived() == b"a4\n"


async def test_a_chunk_delivered_inside_another_leaves_the_flush_to_the_outer_one(pipes) -> None:
    batch, pipe, _ = pipes

    def inner(frame: bytes) -> None:
        pipe.writer.write(frame)

    def outer(frame: bytes) -> None:
        pipe.writer.write(frame)
        batch.deliver([b"2\n"], inner)
        assert pipe.arrived() == b"1\n"  # the inner chunk's end sent nothing

    batch.deliver([b"1\n"], outer)
    assert pipe.arrived() == b"2\n"


async def test_a_receiver_handles_each_chunk_in_the_batch_even_when_handling_fails(pipes) -> None:
    batch, pipe, _ = pipes

    def answer(frame: object) -> None:
        pipe.writer.write(b"re:" + frame + b"\n")  # type: ignore[operator]
        if frame == b"boom":
            raise RuntimeError("handler failed")

    receiver = FrameReceiver(LineFramer(1000), answer, lambda: None, batch)
    receiver.data_received(b"x\ny\nz\n")
    assert pipe.arrived() == b"re:x\nre:y\nre:z\n" and not batch.is_open
    with pytest.raises(RuntimeError):
        receiver.data_received(b"p\nboom\n")
    assert not batch.is_open and pipe.arrived() == b"re:p\nre:boom\n"
