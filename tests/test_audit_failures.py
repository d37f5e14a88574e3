"""The audit trail when it cannot be written, and after a gateway that was killed: real processes, real files.

A full disk is a tmpfs of a few hundred KiB mounted for the test (this needs root; the tests skip, saying so,
where mounting is not allowed), filled by a file of its own and freed by deleting it. Through ``bastion run``,
with the disk full before the trail's first byte (so no record fits anywhere until it is freed):

- ``policy.audit.on_failure = "continue"``: calls go on while the disk is full; once it is freed the trail
  resumes by itself, its first record a ``gap`` record counting exactly the records that are missing, and the
  calls after it are recorded; ``bastion audit verify`` says "intact" and lists the gap;
- ``"refuse"``: while the trail cannot be written, calls are refused with an error naming the setting and none
  reaches the server (its log of calls says so); once the disk is freed, calls run and are recorded again;
- a gateway killed with SIGKILL: the next start records the discontinuity, and ``audit verify`` names it.

And through the audit writer: a disk that fills mid-trail (the record that found it full written in part, then
cut off), and a file that cannot grow past its writer's size limit until the limit is lifted.

Nothing waits a fixed time: each step waits for what settles it (a line in Bastion's stderr, a record on disk, a
lock let go).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from bastion.policy.audit import AuditWriter, verify_paths
from bastion.policy.audit_chains import chain_in_use
from tests.support import BASTION, READY_TIMEOUT, RawClient, raw_server, wait_for

PERMIT_ALL = '@id("everything") permit (principal, action, resource);\n'
FAILING = "the audit trail cannot be written (No space left on device)"
RESUMED = "the audit trail is written again"
SETTLE_SECONDS = 10.0
PAGE = 4096


@pytest.fixture(autouse=True)
def _state_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 256 KiB, unmounted at the end."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root; run these tests as root (or in a container that is)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode}): a full disk cannot "
                    f"be made without it")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def fill(disk: Path) -> Path:
    """Write a file until the disk has no byte left; deleting it frees the space."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as out:
        for size in (65536, 4096, 256, 1):
            block = b"\0" * size
            try:
                while out.write(block):
                    pass
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
    return filler


def records(path: Path) -> list[dict[str, Any]]:
    """The whole records of a trail file (a line cut short by a full disk is not one)."""
    found = []
    for line in path.read_bytes().splitlines() if path.exists() else []:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def configure(tmp_path: Path, audit: Path, **settings: Any) -> Path:
    entry = raw_server(tmp_path / "marks")
    entry["env"]["RAW_SERVER_MARK_CALLS"] = "1"
    (tmp_path / "all.cedar").write_text(PERMIT_ALL)
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"raw": entry}, "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"},
        "policy": {"policy_files": ["all.cedar"], "audit": {"path": str(audit), "arguments": "values", **settings}},
    }))
    return config


def calls_reached(tmp_path: Path) -> list[str]:
    """The texts of the echo calls the server got, in order."""
    marks = tmp_path / "marks"
    lines = marks.read_text().splitlines() if marks.exists() else []
    return [json.loads(line[5:])["params"]["arguments"]["text"] for line in lines if line.startswith("call ")]


def recorded_calls(audit: Path) -> list[dict[str, Any]]:
    """The decision and call records of tools/call requests on disk."""
    return [record for record in records(audit)
            if record["kind"] in ("decision", "call") and record.get("what", {}).get("method") == "tools/call"]


def decisions_and_calls(trail: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [record for record in trail if record["kind"] in ("decision", "call")]


def recorded(audit: Path, text: str) -> bool:
    return any(record["kind"] == "call" and record["what"]["arguments"] == {"text": text}
               for record in recorded_calls(audit))


def logged(log: Path, text: str) -> bool:
    return text in log.read_text(errors="replace")


def echo(client: RawClient, request_id: int, text: str) -> dict[str, Any]:
    return client.request(request_id, "tools/call", {"name": "raw__echo", "arguments": {"text": text}}, timeout=30)


def verify_json(audit: Path) -> dict[str, Any]:
    """What ``bastion audit verify --json`` prints (the command itself is run by ``verify_text``)."""
    return json.loads(json.dumps(verify_paths([audit]).to_json()))


def verify_text(audit: Path) -> str:
    done = subprocess.run([BASTION, "audit", "verify", str(audit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_full_disk_leaves_a_counted_gap_and_the_trail_resumes_when_space_returns(
        tmp_path: Path, small_disk: Path) -> None:
    audit = small_disk / "trail" / "audit.jsonl"
    log = tmp_path / "bastion.stderr"
    config = configure(tmp_path, audit)
    filled_at = time.time()
    filler = fill(small_disk)  # the trail's file is made empty: not a byte of it fits
    client = RawClient(config, log=log)
    try:
        client.initialize()
        for n in range(3):  # "continue", the default: they run, unrecorded for now
            assert echo(client, 10 + n, f"unrecorded-{n}")["result"]["content"][0]["text"] == f"unrecorded-{n}"
        assert wait_for(lambda: logged(log, FAILING), SETTLE_SECONDS), log.read_text()
        assert records(audit) == []
        freed_at = time.time()
        filler.unlink()
        assert wait_for(lambda: logged(log, RESUMED), SETTLE_SECONDS), log.read_text()
        for n in range(2):
            assert echo(client, 20 + n, f"after-{n}")["result"]["content"][0]["text"] == f"after-{n}"
        assert wait_for(lambda: recorded(audit, "after-1"), SETTLE_SECONDS)
    finally:
        code, stderr = client.close()
    assert code == 0, stderr
    assert calls_reached(tmp_path) == ["unrecorded-0", "unrecorded-1", "unrecorded-2", "after-0", "after-1"]

    trail = records(audit)
    gap = trail[0]
    # The first record says what is missing, exactly: of the handshake's record and the two records (decision,
    # call) of each call, those the sealer was given before the disk was freed (the last may come just after).
    assert gap["kind"] == "gap" and gap["seq"] == 0 and gap["lost"] >= 1
    assert gap["lost"] + len(decisions_and_calls(trail)) == 1 + 2 * 3 + 2 * 2
    assert gap["cause"] == "write_failed" and gap["error"] == "No space left on device"
    assert filled_at <= gap["from"] <= freed_at <= gap["to"]
    after = [r["what"]["arguments"]["text"] for r in trail if r["kind"] == "call" and "arguments" in r["what"]]
    assert after[-2:] == ["after-0", "after-1"]
    assert trail[-1]["kind"] == "shutdown" and [r["kind"] for r in trail].count("gap") == 1

    report = verify_json(audit)
    assert report["status"] == "intact" and report["discontinuities"] == 1
    (chain,) = report["chains"]
    assert chain["discontinuities"][0]["seq"] == 0 and chain["discontinuities"][0]["lost"] == gap["lost"]
    from bastion.policy.audit_sealer import when

    said = verify_text(audit)
    assert f"note: gap at seq 0 ({when(gap['to'])}): {gap['lost']} audit record(s) could not be written between" in said
    assert "No space left on device" in said and "1 discontinuity" in said and said.rstrip().endswith(": intact")


def test_with_on_failure_refuse_calls_are_refused_while_the_trail_cannot_be_written(
        tmp_path: Path, small_disk: Path) -> None:
    audit = small_disk / "trail" / "audit.jsonl"
    log = tmp_path / "bastion.stderr"
    config = configure(tmp_path, audit, on_failure="refuse")
    filler = fill(small_disk)
    client = RawClient(config, log=log)
    try:
        client.initialize()  # the handshake is answered: its record is the first that cannot be written
        assert wait_for(lambda: logged(log, FAILING), SETTLE_SECONDS), log.read_text()
        tools = client.request(1, "tools/list", {}, timeout=30)  # and so are lists: a client still learns its tools
        assert "raw__echo" in [tool["name"] for tool in tools["result"]["tools"]], tools
        for n in range(3):
            refused = echo(client, 10 + n, f"refused-{n}")
            error = refused["error"]
            assert error["code"] == -32001 and error["data"]["rule"] == "policy.audit.on_failure", refused
            assert 'policy.audit.on_failure = "refuse"' in error["message"]
            assert "No space left on device" in error["message"]
        assert calls_reached(tmp_path) == []  # none of them reached the server
        filler.unlink()
        assert wait_for(lambda: logged(log, RESUMED), SETTLE_SECONDS), log.read_text()
        assert echo(client, 20, "after")["result"]["content"][0]["text"] == "after"
        assert wait_for(lambda: recorded(audit, "after"), SETTLE_SECONDS)
    finally:
        code, stderr = client.close()
    assert code == 0, stderr
    assert calls_reached(tmp_path) == ["after"]
    trail = records(audit)
    # Missing: the handshake's record, and of the list's and the refusals' (a decision and a call record each),
    # those the sealer was given before the disk was freed.
    assert trail[0]["kind"] == "gap" and trail[0]["lost"] >= 1
    assert trail[0]["lost"] + len(decisions_and_calls(trail)) == 1 + 1 + 2 * 3 + 2
    refusals = [r for r in trail if r["kind"] == "decision" and r["decision"] == "deny"]
    assert all(r["rule"] == "policy.audit.on_failure" for r in refusals)
    report = verify_json(audit)
    assert report["status"] == "intact" and report["discontinuities"] == 1


def test_a_disk_that_fills_mid_trail_has_its_cut_line_removed_and_the_gap_counted(small_disk: Path) -> None:
    """The file's last page still had room: the record that found the disk full was written in part."""
    audit = small_disk / "audit.jsonl"
    writer = AuditWriter(audit)
    try:
        for i in range(5):
            writer.write({"kind": "call", "i": i})
        assert wait_for(lambda: len(records(audit)) == 5, SETTLE_SECONDS)
        filler = fill(small_disk)
        writer.write({"kind": "call", "i": "big", "padding": "x" * 3 * PAGE})  # more than any page has left
        # Told the trail fails; a gap record small enough for what is left of the page may follow at once.
        assert wait_for(lambda: writer.failure is not None or any(r["kind"] == "gap" for r in records(audit)),
                        SETTLE_SECONDS)
        filler.unlink()
        assert wait_for(lambda: writer.failure is None, SETTLE_SECONDS)
        for i in range(5, 8):
            writer.write({"kind": "call", "i": i})
    finally:
        writer.close()
    trail = records(audit)
    assert [r["kind"] for r in trail] == ["call"] * 5 + ["gap"] + ["call"] * 3 + ["shutdown"]
    assert trail[5]["lost"] == 1 and [r["i"] for r in trail if r["kind"] == "call"] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert audit.read_bytes().endswith(b"\n") and len(audit.read_bytes().splitlines()) == len(trail)
    assert verify_paths([audit]).ok


def test_a_trail_past_a_file_size_limit_resumes_once_the_limit_is_lifted(tmp_path: Path) -> None:
    """A file that cannot grow (its writer's RLIMIT_FSIZE) is written again once it can: no full disk needed."""
    audit = tmp_path / "audit.jsonl"
    writer = AuditWriter(audit)
    try:
        writer.write({"kind": "call", "i": 0})
        assert wait_for(lambda: len(records(audit)) == 1, SETTLE_SECONDS)
        sealer = writer._process.pid
        resource.prlimit(sealer, resource.RLIMIT_FSIZE, (audit.stat().st_size, resource.RLIM_INFINITY))
        for i in range(1, 4):
            writer.write({"kind": "call", "i": i})
        assert wait_for(lambda: writer.failure is not None, SETTLE_SECONDS)
        assert "File too large" in writer.failure
        resource.prlimit(sealer, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        assert wait_for(lambda: writer.failure is None, SETTLE_SECONDS)
        writer.write({"kind": "call", "i": 4})
    finally:
        writer.close()
    assert writer._process.pid == sealer  # the same sealer throughout: a failed write does not end it
    trail = records(audit)
    assert [r["kind"] for r in trail] == ["call", "gap", "call", "shutdown"]
    assert trail[1]["lost"] == 3 and trail[1]["error"] == "File too large"
    assert verify_paths([audit]).ok


def test_a_killed_gateway_leaves_a_discontinuity_the_next_start_records(tmp_path: Path) -> None:
    audit = tmp_path / "trail" / "audit.jsonl"
    config = configure(tmp_path, audit)
    first = RawClient(config)
    try:
        first.initialize()
        echo(first, 1, "first run")
        assert wait_for(lambda: recorded(audit, "first run"), SETTLE_SECONDS)
    finally:
        first.proc.kill()  # SIGKILL: no shutdown record
        first.proc.wait()
        for stream in (first.proc.stdin, first.proc.stdout, first.proc.stderr):
            stream.close()
    # Its sealer writes what it had and lets the main chain go, so that the next start continues it.
    assert wait_for(lambda: chain_in_use(audit) is False, SETTLE_SECONDS)
    last_of_first = records(audit)[-1]
    assert any("the tail was cut, or the process writing it was killed" in note
               for note in verify_json(audit)["chains"][0]["notes"])

    second = RawClient(config)
    try:
        second.initialize()
        echo(second, 1, "second run")
    finally:
        code, stderr = second.close()
    assert code == 0, stderr
    assert not audit.with_name("audit.chain-1.jsonl").exists()  # the second run continued the main chain

    trail = records(audit)
    (found,) = [record for record in trail if record["kind"] == "discontinuity"]
    assert found["seq"] == last_of_first["seq"] + 1 and found["after_seq"] == last_of_first["seq"]
    assert found["lost"] is None and found["from"] == last_of_first["ts"] and trail[-1]["kind"] == "shutdown"
    said = verify_text(audit)
    assert f"note: discontinuity at seq {found['seq']}" in said
    assert "did not close this chain with a shutdown record" in said and said.rstrip().endswith(": intact")
    assert "the tail was cut" not in said
    report = verify_json(audit)
    assert report["status"] == "intact" and report["discontinuities"] == 1
    assert report["chains"][0]["discontinuities"][0]["kind"] == "discontinuity"


def test_on_failure_is_checked_with_the_key_and_the_fix(tmp_path: Path) -> None:
    config = configure(tmp_path, tmp_path / "audit.jsonl", on_failure="deny")
    done = subprocess.run([BASTION, "check", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "policy.audit.on_failure" in done.stderr and '"continue"' in done.stderr and '"refuse"' in done.stderr
