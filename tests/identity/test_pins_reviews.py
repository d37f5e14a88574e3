"""Who accepted a changed definition is recorded: ``bastion pins accept`` writes the person running it beside the
pins file, one line per definition it accepted, and says so; nothing is recorded when nothing was accepted."""

from __future__ import annotations

import getpass
import os
import stat
import subprocess
from pathlib import Path

from bastion.guardrails.pin_book import Observation
from bastion.guardrails.pin_store import PinStore
from tests.support import BASTION

ECHO = {"name": "echo", "description": "Echo text back", "inputSchema": {"type": "object"}}
CHANGED = {**ECHO, "description": "Echo text back, louder"}


def _store(tmp_path: Path) -> PinStore:
    store = PinStore(tmp_path / "state" / "bastion" / "pins.json")
    store.record([Observation("pin", "fs", "tools", "echo", ECHO), Observation("pin", "fs", "tools", "cat", ECHO)])
    store.record([Observation("offer", "fs", "tools", "echo", CHANGED), Observation("offer", "fs", "tools", "cat",
                                                                                  {**CHANGED, "name": "cat"})])
    return store


def test_the_store_records_who_accepted_each_definition(tmp_path: Path) -> None:
    store = _store(tmp_path)
    accepted, _ = store.accept("fs", "echo", by="alice")
    assert accepted == [("fs", "tools", "echo")]
    store.accept("fs", None, by="bob")
    assert store.accept("fs", None, by="carol")[0] == []  # nothing left to accept: no review
    assert [(r["by"], r["server"], r["kind"], r["key"]) for r in store.reviews()] == [
        ("alice", "fs", "tools", "echo"), ("bob", "fs", "tools", "cat")]
    assert stat.S_IMODE(os.stat(store.reviews_path).st_mode) == 0o600
    book, _ = store.load()
    assert book.get("fs", "tools", "cat").pinned["description"] == "Echo text back, louder"


def test_bastion_pins_accept_records_the_person_running_it(tmp_path: Path) -> None:
    store = _store(tmp_path)
    done = subprocess.run([BASTION, "pins", "accept", "fs/echo"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "accepted fs/echo (tool)\n"
    assert f"recorded as accepted by {getpass.getuser()}" in done.stderr
    [review] = store.reviews()
    assert (review["by"], review["key"]) == (getpass.getuser(), "echo") and review["at"].endswith("Z")
