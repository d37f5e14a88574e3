"""Audit trail: hash chain, tamper detection (edit, delete, reorder, across rotation), flush and rotation."""

from __future__ import annotations

import asyncio
import signal
import json
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from bastion.policy import audit_sealer
from bastion.policy.audit import AuditStartError, AuditWriter, expand_trail, record_hash, shape_of, trail_files, verify

BASTION = [sys.executable, "-m", "bastion"]


def fill(path: Path, count: int, rotate_bytes: int = 1 << 30, key: bytes | None = None) -> None:
    writer = AuditWriter(path, rotate_bytes, key)
    for i in range(count):
        writer.write({"kind": "call", "who": {"name": "alice"}, "i": i})
    writer.close()


def read_lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def write_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_intact_trail_verifies(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    fill(path, 50)
    report = verify([path])
    assert report.ok and report.records == 51 and report.first_seq == 0 and report.last_seq == 50
    assert report.warnings == []  # ends with the shutdown record


def test_edit_is_found(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    fill(path, 10)
    lines = read_lines(path)
    lines[3] = lines[3].replace(b'"i":3', b'"i":333')
    write_lines(path, lines)
    report = verify([path])
    assert not report.ok and any("seq 3" in p and "altered" in p for p in report.problems)


def test_edit_with_recomputed_hashes_is_found_when_keyed(tmp_path: Path) -> None:
    key = b"k" * 32
    path = tmp_path / "audit.jsonl"
    fill(path, 10, key=key)
    assert verify([path], key).ok
    # An editor without the key rewrites record 3 and recomputes the whole chain with plain SHA-256.
    records = [orjson.loads(line) for line in read_lines(path)]
    records[3]["who"]["name"] = "mallory"
    prev = "0" * 64
    for record in records:
        record["prev"] = prev
        record["hash"] = record_hash(record, None)
        prev = record["hash"]
    write_lines(path, [orjson.dumps(r) for r in records])
    assert verify([path]).ok  # an unkeyed chain cannot tell ...
    assert not verify([path], key).ok  # ... a keyed one can


def test_deletion_is_found(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    fill(path, 10)
    lines = read_lines(path)
    del lines[5]
    write_lines(path, lines)
    report = verify([path])
    assert not report.ok and any("missing" in p for p in report.problems)


def test_deleting_the_head_is_found(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    fill(path, 10)
    write_lines(path, read_lines(path)[3:])
    assert any("earlier records are missing" in p for p in verify([path]).problems)


def test_reorder_is_found(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    fill(path, 10)
    lines = read_lines(path)
    lines[2], lines[6] = lines[6], lines[2]
    write_lines(path, lines)
    report = verify([path])
    assert not report.ok and any("out of order" in p or "chain broken" in p for p in report.problems)


def test_garbage_line_is_found(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    fill(path, 3)
    with path.open("ab") as out:
        out.write(b"not json\n")
    assert any("not an audit record" in p for p in verify([path]).problems)


@pytest.fixture()
def rotated(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    fill(path, 300, rotate_bytes=4096)
    assert len(trail_files(path)) > 4
    return path


def test_rotation_keeps_one_verifiable_chain(rotated: Path) -> None:
    files = expand_trail([rotated])
    report = verify(files)
    assert report.ok and report.records == 301 and report.files[-1] == str(rotated)
    assert verify(list(reversed(files))).ok  # file order on the command line does not matter


def test_rotation_continues_across_restarts(rotated: Path) -> None:
    fill(rotated, 5, rotate_bytes=4096)
    report = verify(expand_trail([rotated]))
    assert report.ok and report.records == 307


def test_deleted_rotated_file_is_found(rotated: Path) -> None:
    files = trail_files(rotated)
    files[2].unlink()
    report = verify(expand_trail([rotated]))
    assert not report.ok and any("missing" in p for p in report.problems)


def test_edit_in_a_rotated_file_is_found(rotated: Path) -> None:
    victim = trail_files(rotated)[1]
    lines = read_lines(victim)
    lines[0] = lines[0].replace(b'"alice"', b'"bob"')
    write_lines(victim, lines)
    assert not verify(expand_trail([rotated])).ok


def test_swapped_rotated_file_contents_are_found(rotated: Path) -> None:
    one, two = trail_files(rotated)[1:3]
    a, b = one.read_bytes(), two.read_bytes()
    one.write_bytes(b)
    two.write_bytes(a[: len(a) // 2].rsplit(b"\n", 1)[0] + b"\n")  # also truncated
    assert not verify(expand_trail([rotated])).ok


def test_tail_cut_is_reported_as_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    fill(path, 10)
    write_lines(path, read_lines(path)[:-3])
    report = verify([path])
    assert report.ok and report.warnings


async def test_writes_from_the_event_loop_are_flushed_on_close(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path)

    async def client(n: int) -> None:
        for i in range(100):
            writer.write({"kind": "call", "client": n, "i": i})
            await asyncio.sleep(0)

    await asyncio.gather(*(client(n) for n in range(5)))
    await writer.aclose()
    records = [json.loads(line) for line in read_lines(path)]
    assert len(records) == 501 and records[-1]["kind"] == "shutdown"
    assert [r["seq"] for r in records] == list(range(501))
    writer.write({"kind": "late"})  # after close: dropped, never raises


def test_shape_hides_values() -> None:
    shape = shape_of({"path": "/secret/file", "n": 3, "flags": ["a", "b"], "opts": {"deep": True}, "x": None})
    assert shape == {"path": {"string": 12}, "n": "number", "flags": {"array": 2}, "opts": {"deep": "boolean"}, "x": "null"}
    assert "secret" not in json.dumps(shape)


def test_cli_verify_exit_status(rotated: Path) -> None:
    ok = subprocess.run([*BASTION, "audit", "verify", str(rotated)], capture_output=True, text=True)
    assert ok.returncode == 0 and "intact" in ok.stderr and ok.stdout == ""
    victim = trail_files(rotated)[0]
    lines = read_lines(victim)
    del lines[1]
    write_lines(victim, lines)
    bad = subprocess.run([*BASTION, "audit", "verify", str(rotated)], capture_output=True, text=True)
    assert bad.returncode == 1 and "TAMPERED" in bad.stderr


def test_a_trail_that_cannot_be_continued_stops_the_writer_at_start(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"kind": "call", "no": "seq or hash"}\n')  # the chain head cannot be read
    with pytest.raises(RuntimeError, match="did not start"):
        AuditWriter(path)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(AuditStartError, match="a-file/audit.jsonl: cannot open the audit trail"):
        AuditWriter(tmp_path / "a-file" / "audit.jsonl")  # no directory can hold it


def _written(path: Path, count: int) -> None:
    """Wait until ``count`` records are on disk (the writer drains its queue every few milliseconds)."""
    for _ in range(400):
        if path.exists() and len(read_lines(path)) >= count:
            return
        time.sleep(0.025)
    raise AssertionError(f"{path} never reached {count} records")


def _kill_sealer(writer: AuditWriter) -> None:
    writer._process.send_signal(signal.SIGKILL)
    writer._process.wait()


def test_a_sealer_that_dies_is_replaced_and_the_trail_records_the_gap(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path)
    for i in range(10):
        writer.write({"kind": "call", "i": i})
    _written(path, 10)
    first = writer._process.pid
    _kill_sealer(writer)
    for i in range(10, 20):
        writer.write({"kind": "call", "i": i})
    writer.close()
    assert writer._process.pid != first
    records = [orjson.loads(line) for line in read_lines(path)]
    assert [r["kind"] for r in records] == ["call"] * 10 + ["gap"] + ["call"] * 10 + ["shutdown"]
    assert "exited with status -9" in records[10]["reason"]
    assert [r["i"] for r in records if r["kind"] == "call"] == list(range(20))
    report = verify([path])
    assert report.ok and report.records == 22


def test_a_replacement_sealer_that_dies_at_once_is_replaced_again_never_given_up(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path)
    writer.write({"kind": "call", "i": 0})
    _written(path, 1)
    _kill_sealer(writer)
    writer.write({"kind": "call", "i": 1})
    _written(path, 3)  # the gap record and the call after it, written by the replacement
    _kill_sealer(writer)  # at once: it is replaced all the same
    writer.write({"kind": "call", "i": 2})
    _written(path, 5)
    assert not writer._closed and writer.failure is None
    writer.close()
    records = [orjson.loads(line) for line in read_lines(path)]
    assert [r["kind"] for r in records] == ["call", "gap", "call", "gap", "call", "shutdown"]
    assert all(r["cause"] == "sealer_exited" and "exited with status -9" in r["reason"] for r in records if r["kind"] == "gap")
    report = verify([path])
    assert report.ok and [found["seq"] for found in report.discontinuities] == [1, 3]


def test_a_sealer_that_cannot_be_started_is_tried_again_and_the_gap_counts_what_came_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path)
    writer.write({"kind": "call", "i": 0})
    _written(path, 1)
    sealer_file = audit_sealer.__file__
    try:
        audit_sealer.__file__ = str(tmp_path / "no-such-sealer.py")  # every start fails, as on a broken install
        _kill_sealer(writer)
        for i in range(1, 4):
            writer.write({"kind": "call", "i": i})
        for _ in range(400):
            if writer._outage is not None and writer._outage.attempts >= 1 and writer._outage.dropped == 3:
                break
            time.sleep(0.025)
        assert writer.failure is not None and "could not be started" in writer.failure
    finally:
        audit_sealer.__file__ = sealer_file
    for _ in range(400):  # started again once the pause is over, without a record to deliver
        if writer._outage is None:
            break
        time.sleep(0.025)
    writer.write({"kind": "call", "i": 4})
    writer.close()
    records = [orjson.loads(line) for line in read_lines(path)]
    assert [r["kind"] for r in records] == ["call", "gap", "call", "shutdown"]
    assert records[1]["dropped"] == 3 and "3 record(s) handed over while no sealer ran" in records[1]["reason"]
    assert verify([path]).ok


def test_a_sealer_that_falls_behind_bounds_the_queue_and_counts_what_it_drops(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path, max_pending=50)
    writer._process.send_signal(signal.SIGSTOP)  # a sealer stuck on a stalled disk
    try:
        for i in range(3000):
            writer.write({"kind": "call", "i": i, "padding": "x" * 200})
        assert len(writer._pending) <= 50 + 3000 // 50  # the lines, and at most one gap marker between them
    finally:
        writer._process.send_signal(signal.SIGCONT)
    writer.close()
    records = [orjson.loads(line) for line in read_lines(path)]
    gaps = [r for r in records if r["kind"] == "gap"]
    kept = [r["i"] for r in records if r["kind"] == "call"]
    dropped = sum(int(g["reason"].split()[0]) for g in gaps)
    assert gaps and "the audit sealer fell behind" in gaps[0]["reason"]
    assert len(kept) + dropped == 3000 and kept == sorted(kept)
    assert records[-1]["kind"] == "shutdown"
    assert verify([path]).ok
