"""The stdio upstream transport with real processes: frames both ways, stderr kept, why it ended, refusals."""

from __future__ import annotations

import asyncio
import sys

import pytest

from bastion.config import ServerConfig
from bastion.gateway.launch import launch_server
from bastion.protocol.framing import Oversize
from bastion.transport.stdio import WriteBatch
from bastion.transport.upstream import StartRefused, TransportClosed, open_transport

# Echoes each line back upper-cased, says so on stderr, and exits with the status a line "exit N" asks.
ECHO = r"""
import sys
print("echo ready", file=sys.stderr, flush=True)
for line in sys.stdin:
    if line.startswith("exit "):
        print("leaving", file=sys.stderr, flush=True)
        sys.exit(int(line.split()[1]))
    sys.stdout.write(line.upper()); sys.stdout.flush()
"""


class Inbox:
    def __init__(self) -> None:
        self.frames: list[bytes | Oversize] = []
        self.chunks = 0

    def frames_received(self, frames) -> None:
        self.chunks += 1
        self.frames.extend(frames)


def transport(script: str = ECHO, *, command: str = sys.executable, max_bytes: int = 1 << 20):
    config = ServerConfig(command=command, args=["-c", script], sandbox="none")
    return open_transport("t", config, launch=launch_server, max_message_bytes=max_bytes, writes=WriteBatch())


async def until(predicate, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_frames_go_both_ways_and_the_end_says_why_with_stderr_kept():
    link = transport()
    inbox = Inbox()
    await link.start(inbox)
    try:
        link.send(b'{"a":1}\n')
        link.send(b'{"b":2}\n')
        await until(lambda: len(inbox.frames) == 2)
        assert inbox.frames == [b'{"A":1}', b'{"B":2}']
        link.send(b"exit 3\n")
        reason = await asyncio.wait_for(link.ended(), 30)
        assert reason == "exited with status 3"
        await until(lambda: "leaving" in link.diagnostics())
        assert link.diagnostics()[0] == "echo ready"
        assert link.refusal() is None  # status 3 is the server's own failure: a restart may mend it
    finally:
        await link.close()
    with pytest.raises(TransportClosed):
        link.send(b"{}\n")
    await link.close()  # a second close does nothing


async def test_a_server_that_closes_its_stdout_and_runs_on_ends_the_transport_saying_so():
    link = transport("import os, time\nos.close(1)\ntime.sleep(300)\n")
    await link.start(Inbox())
    try:
        assert (await asyncio.wait_for(link.ended(), 60)) == "closed its stdout without exiting"
    finally:
        await link.close()


async def test_an_oversize_frame_is_dropped_whole_and_the_next_passes():
    link = transport(max_bytes=16)
    inbox = Inbox()
    await link.start(inbox)
    try:
        link.send(b'{"x":"' + b"y" * 64 + b'"}\n')
        link.send(b'{"ok":1}\n')
        await until(lambda: len(inbox.frames) == 2)
        assert isinstance(inbox.frames[0], Oversize) and inbox.frames[0].limit == 16
        assert inbox.frames[1] == b'{"OK":1}'
    finally:
        await link.close()


async def test_a_missing_executable_is_refused_at_start():
    link = transport(command="/nonexistent/bastion-test-server")
    with pytest.raises(StartRefused, match="failed to start"):
        await link.start(Inbox())
    await link.close()


async def test_a_shell_wrappers_command_not_found_is_a_refusal_after_the_end():
    link = transport("exec bastion-no-such-command", command="/bin/sh")
    await link.start(Inbox())
    try:
        assert (await asyncio.wait_for(link.ended(), 30)) == "exited with status 127"
    finally:
        await link.close()
    assert link.refusal() == "exited with status 127: its command was not found"


async def test_close_stops_a_running_server():
    link = transport()
    await link.start(Inbox())
    pid = link.pid
    assert pid is not None
    await link.close()
    reason = await asyncio.wait_for(link.ended(), 30)
    assert reason.startswith(("exited", "killed"))
