"""The gateway SIGKILLed between a sandbox's spawn and its release: nothing of the sandbox survives it.

Each round starts ``bastion run`` with one sandboxed server that outlives its stdin (it never exits on its own) and
kills the gateway at a moment the test sees happen: the first process of the sandbox appearing (bwrap just
spawned: its pid not yet read, the sandbox not yet in its groups), the server blocked in its handshake, and a
restart's new sandbox appearing after the server crashed. Then no process carrying the server's tag may be left
(a bwrap reparented to init included), and a group left behind is removed when the next gateway starts a sandbox.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from bastion.sandbox.cgroups import detect_host
from tests.support import SANDBOX_TIERS, RawClient, pids_with_tag, raw_server, wait_for, write_config

ROUNDS = 7  # per moment: 21 kills in all
pytestmark = [pytest.mark.slow, SANDBOX_TIERS[0].marks[0]]


def _parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def _describe(pids: list[int]) -> list[str]:
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ")[:80].decode(errors="replace")
        except OSError:
            continue
        found.append(f"{pid} (parent {_parent_pid(pid)}): {command}")
    return found


def _marked(marks: Path, text: str) -> bool:
    return marks.exists() and text in marks.read_text()


def _kill_at(moment: str, tmp_path: Path, round_: int) -> tuple[str, int]:
    """One gateway killed at ``moment``; returns the server's tag and the gateway's pid."""
    tag = f"killed-{moment}-{uuid.uuid4().hex[:8]}"
    marks = tmp_path / f"marks-{round_}"
    gate = tmp_path / "never"  # the handshake gate nobody opens
    server = raw_server(marks, tag=tag, linger=True)
    if moment == "handshake":
        server["env"]["RAW_SERVER_HANDSHAKE_GATE"] = str(gate)
    client = RawClient(write_config(tmp_path / f"c{round_}.json", {"raw": server}))
    try:
        if moment == "spawned":
            assert wait_for(lambda: pids_with_tag(tag), timeout=60, interval=0.001)
        elif moment == "handshake":
            assert wait_for(lambda: _marked(marks, "initialize received"), timeout=60, interval=0.005)
        else:
            client.initialize()
            first = set(pids_with_tag(tag))
            client.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "raw__crash"}})
            assert wait_for(lambda: set(pids_with_tag(tag)) - first, timeout=60, interval=0.001)
    finally:
        client.proc.kill()
        client.proc.wait()
    return tag, client.proc.pid


@pytest.mark.parametrize("moment", ["spawned", "handshake", "restart"])
def test_nothing_of_a_sandbox_survives_its_gateway_killed(tmp_path, moment):
    gateways = []
    for round_ in range(ROUNDS):
        tag, gateway = _kill_at(moment, tmp_path, round_)
        gateways.append(gateway)
        assert wait_for(lambda: not pids_with_tag(tag), timeout=15), \
            f"round {round_}: left behind: {_describe(pids_with_tag(tag))}"
    # A killed gateway cannot remove its groups; the next one to start a sandbox does, once they are empty.
    host = detect_host()
    parents = {host.parent} if host.parent else set(host.dirs.values())
    def left() -> list[str]:
        return [os.path.join(parent, entry) for parent in parents for entry in os.listdir(parent)
                if any(entry.startswith("bastion-") and f"-{pid}-" in entry for pid in gateways)]
    if left():
        client = RawClient(write_config(tmp_path / "next.json", {"raw": raw_server(tag=f"next-{moment}")}))
        try:
            client.initialize()
        finally:
            client.close()
        assert left() == []
