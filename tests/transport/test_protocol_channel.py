"""Bastion's own stdout as the protocol channel when it is not a pipe: a regular file or a device such as /dev/null."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from bastion.transport.stdio import CoalescingWriter, WriteBatch, loop_can_watch, open_protocol_writer


def test_only_pipes_sockets_and_terminals_are_left_to_the_loop(tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    left, right = socket.socketpair()
    file_fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    null_fd = os.open(os.devnull, os.O_RDWR)
    try:
        assert loop_can_watch(read_fd) and loop_can_watch(write_fd) and loop_can_watch(left.fileno())
        assert not loop_can_watch(file_fd) and not loop_can_watch(null_fd)
    finally:
        for fd in (read_fd, write_fd, file_fd, null_fd):
            os.close(fd)
        left.close()
        right.close()


async def test_frames_to_a_regular_file_arrive_whole_and_in_order(tmp_path: Path) -> None:
    path = tmp_path / "out"
    writer = await open_protocol_writer(os.open(path, os.O_WRONLY | os.O_CREAT))
    batch = WriteBatch()
    frames = CoalescingWriter(writer, batch)
    frames.write(b'{"n": 1}\n')
    batch.deliver([b'{"n": 2}\n', b'{"n": 3}\n'], frames.write)
    await frames.drain()
    await writer.drain()
    writer.close()
    assert path.read_bytes() == b'{"n": 1}\n{"n": 2}\n{"n": 3}\n'


async def test_a_write_the_device_refuses_loses_the_channel_rather_than_raising() -> None:
    writer = await open_protocol_writer(os.open("/dev/full", os.O_WRONLY))
    writer.transport.write(b'{"n": 1}\n')  # ENOSPC, as a pipe's write fails once its reader is gone
    assert writer.transport.is_closing()
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(writer.drain(), timeout=5)
    writer.close()
