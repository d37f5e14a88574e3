"""The pins file: shared by several processes at once, replaced atomically, never overwritten when it is not one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bastion.guardrails.pin_book import Observation, PinBook
from bastion.guardrails.pin_store import PinStore, PinStoreError
from tests.support import ROOT

WRITERS = 6
PINS_EACH = 15

# Each writer waits for the go file, then records pins of its own server one write at a time, and its own definition
# of the one key every writer pins; it prints the definition of that key the file ended with, as it saw it.
WRITER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from bastion.guardrails.pin_book import Observation
    from bastion.guardrails.pin_store import PinStore

    path, go, me, count = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    while not go.exists():
        time.sleep(0.005)
    store = PinStore(path)
    for i in range(count):
        store.record([Observation("pin", f"server-{me}", "tools", f"tool-{i}", {"name": f"tool-{i}", "by": me})])
    book, _ = store.record([Observation("pin", "shared", "tools", "one", {"name": "one", "by": me})])
    print(json.dumps(book.get("shared", "tools", "one").pinned))
""")


def test_several_processes_pinning_at_once_lose_nothing_and_agree_on_the_first(tmp_path: Path) -> None:
    path = tmp_path / "state" / "pins.json"
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(go), str(n), str(PINS_EACH)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
               for n in range(WRITERS)]
    time.sleep(0.5)
    go.write_text("go")
    outcomes = [writer.communicate(timeout=240) for writer in writers]
    assert all(writer.returncode == 0 for writer in writers), [err for _, err in outcomes]
    book, _ = PinStore(path).load()
    for n in range(WRITERS):
        assert set(book.of(f"server-{n}", "tools")) == {f"tool-{i}" for i in range(PINS_EACH)}
    winner = book.get("shared", "tools", "one").pinned
    assert {json.dumps(json.loads(out), sort_keys=True) for out, _ in outcomes} == {json.dumps(winner, sort_keys=True)}
    assert sorted(p.name for p in path.parent.iterdir()) == ["pins.json", "pins.json.lock"]  # no temporary left
    assert (path.stat().st_mode & 0o777) == 0o600


def test_a_file_that_is_not_a_pins_file_is_named_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    store = PinStore(path)
    for content, words in ((b"{not json", "not a pins file"), (b'{"servers": {"fs": []}}', "servers.fs")):
        path.write_bytes(content)
        with pytest.raises(PinStoreError) as raised:
            store.load()
        assert str(path) in str(raised.value) and words in str(raised.value)
        assert "move it away" in str(raised.value)
        with pytest.raises(PinStoreError):
            store.record([Observation("pin", "fs", "tools", "t", {"name": "t"})])
        assert path.read_bytes() == content


def test_a_place_that_cannot_be_written_is_named_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(PinStoreError, match="set guardrails.pins.path") as raised:
        PinStore(tmp_path / "a-file" / "pins.json").record([Observation("pin", "fs", "tools", "t", {"name": "t"})])
    assert "a-file" in str(raised.value)


def test_no_file_is_an_empty_book_and_a_write_that_changes_nothing_leaves_the_file_alone(tmp_path: Path) -> None:
    store = PinStore(tmp_path / "pins.json")
    assert store.load() == (PinBook(), None) and store.signature() is None
    book, signature = store.record([Observation("pin", "fs", "tools", "t", {"name": "t"})])
    assert signature == store.signature() and book.get("fs", "tools", "t").pinned == {"name": "t"}
    before = (tmp_path / "pins.json").stat().st_mtime_ns
    _, again = store.record([Observation("pin", "fs", "tools", "t", {"name": "t", "other": 1})])  # the pin stands
    assert again == signature and (tmp_path / "pins.json").stat().st_mtime_ns == before
