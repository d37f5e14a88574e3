"""One audit trail written by several writers at once: a chain each, named, found, registered and verified."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from bastion.policy.audit import AuditStartError, AuditWriter, verify_paths
from bastion.policy.audit_chains import (
    ChainFile,
    chain_in_use,
    chain_path,
    claim_chain,
    lock_path,
    parse_name,
    read_records,
    registry_path,
    trail_chains,
)

BASTION = [sys.executable, "-m", "bastion"]
KEY = b"k" * 32


# ---- Names ----


def test_chain_files_are_named_from_the_configured_path(tmp_path: Path) -> None:
    main = tmp_path / "audit.jsonl"
    assert chain_path(main, 0) == main
    assert chain_path(main, 3) == tmp_path / "audit.chain-3.jsonl"
    assert lock_path(chain_path(main, 3)) == tmp_path / "audit.chain-3.jsonl.lock"
    assert registry_path(main) == tmp_path / "audit.chains.jsonl"
    bare = tmp_path / "trail"  # no suffix: the siblings take .jsonl, as rotated files do
    assert chain_path(bare, 1) == tmp_path / "trail.chain-1.jsonl"


@pytest.mark.parametrize(
    ("name", "main", "chain", "rotated"),
    [
        ("audit.jsonl", "audit.jsonl", 0, False),
        ("audit.000000000120.jsonl", "audit.jsonl", 0, True),
        ("audit.chain-2.jsonl", "audit.jsonl", 2, False),
        ("audit.chain-12.000000004096.jsonl", "audit.jsonl", 12, True),
        ("team.audit.chain-1.jsonl", "team.audit.jsonl", 1, False),
        ("audit.chains.jsonl", "audit.chains.jsonl", 0, False),  # the registry is no chain of audit.jsonl
        ("audit.2026.jsonl", "audit.2026.jsonl", 0, False),  # four digits are part of a name, not a rotation
        ("audit.chain-0.jsonl", "audit.chain-0.jsonl", 0, False),  # chain 0 is the configured path itself
        ("audit.chain-1.x.jsonl", "audit.chain-1.x.jsonl", 0, False),
    ],
)
def test_a_file_name_says_which_trail_and_chain_it_belongs_to(
    tmp_path: Path, name: str, main: str, chain: int, rotated: bool
) -> None:
    assert parse_name(tmp_path / name) == ChainFile(tmp_path / main, chain, rotated)


def test_names_round_trip_through_parse(tmp_path: Path) -> None:
    main = tmp_path / "audit.jsonl"
    for index in (0, 1, 9, 10, 123):
        current = chain_path(main, index)
        assert parse_name(current) == ChainFile(main, index, False)
        rotated = current.with_name(f"{current.stem}.{4096:012d}.jsonl")
        assert parse_name(rotated) == ChainFile(main, index, True)


def test_discovery_groups_each_chains_files_and_leaves_other_trails_alone(tmp_path: Path) -> None:
    names = [
        "audit.000000000000.jsonl", "audit.jsonl",
        "audit.chain-1.000000000000.jsonl", "audit.chain-1.000000000040.jsonl", "audit.chain-1.jsonl",
        "audit.chain-10.jsonl",
        "audit.chain-2.000000000000.jsonl",  # its current file is gone: the rotated one still counts
        "audit.chains.jsonl", "audit.jsonl.lock", "audit.chain-1.jsonl.lock",
        "other.jsonl", "other.chain-1.jsonl", "audit-old.chain-1.jsonl",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    found = {index: [member.name for member in members] for index, members in trail_chains(tmp_path / "audit.jsonl").items()}
    assert found == {
        0: ["audit.000000000000.jsonl", "audit.jsonl"],
        1: ["audit.chain-1.000000000000.jsonl", "audit.chain-1.000000000040.jsonl", "audit.chain-1.jsonl"],
        2: ["audit.chain-2.000000000000.jsonl"],
        10: ["audit.chain-10.jsonl"],
    }
    assert trail_chains(tmp_path / "absent.jsonl") == {0: []}


# ---- Claiming chains ----


def fill(writer: AuditWriter, count: int, tag: str) -> None:
    for i in range(count):
        writer.write({"kind": "call", "who": {"name": tag}, "i": i})


def records_of(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_writers_at_once_take_a_chain_each_and_later_ones_continue_them(tmp_path: Path) -> None:
    main = tmp_path / "audit.jsonl"
    first, second = AuditWriter(main), AuditWriter(main)
    assert (first.chain_path, second.chain_path) == (main, tmp_path / "audit.chain-1.jsonl")
    fill(first, 5, "first")
    fill(second, 5, "second")
    second.close()
    third = AuditWriter(main)  # chain 0 is still busy; chain 1 is free again and is continued
    assert third.chain_path == second.chain_path
    fill(third, 3, "third")
    third.close()
    first.close()
    chain_one = records_of(second.chain_path)
    assert chain_one[0]["kind"] == "chain" and chain_one[0]["chain"] == 1  # opened once, by its first writer
    assert [r["kind"] for r in chain_one].count("chain") == 1
    assert [r["seq"] for r in chain_one] == list(range(len(chain_one)))
    assert [r["who"]["name"] for r in chain_one if r["kind"] == "call"] == ["second"] * 5 + ["third"] * 3
    assert [r["who"]["name"] for r in records_of(main) if r["kind"] == "call"] == ["first"] * 5
    registry = read_records(registry_path(main))
    assert [(r["kind"], r["chain"], r["file"]) for r in registry] == [("registered", 1, "audit.chain-1.jsonl")]
    trail = verify_paths([main])
    assert trail.ok and trail.records == 7 + 10, trail.to_json()


def test_the_sealer_keeps_the_chain_locked_while_it_lives(tmp_path: Path) -> None:
    main = tmp_path / "audit.jsonl"
    writer = AuditWriter(main)
    try:
        # As if the gateway had died: its own descriptor is gone, but the sealer, still draining, has the lock.
        writer._chain.release()
        assert chain_in_use(main) is True
        claimed = claim_chain(main, None)
        assert claimed.index == 1
        claimed.release()
    finally:
        writer.close()
    assert chain_in_use(main) is False
    assert claim_chain(main, None).index == 0


def test_a_dead_sealer_is_replaced_on_its_own_chain(tmp_path: Path) -> None:
    main = tmp_path / "audit.jsonl"
    holder = AuditWriter(main)
    writer = AuditWriter(main)
    fill(writer, 5, "before")
    for _ in range(400):
        if len(writer.chain_path.read_bytes().splitlines()) >= 6:
            break
        time.sleep(0.025)
    writer._process.send_signal(signal.SIGKILL)
    writer._process.wait()
    fill(writer, 5, "after")
    writer.close()
    holder.close()
    kinds = [r["kind"] for r in records_of(writer.chain_path)]
    assert kinds == ["chain"] + ["call"] * 5 + ["gap"] + ["call"] * 5 + ["shutdown"]
    assert [r["kind"] for r in records_of(main)] == ["shutdown"]
    assert verify_paths([main]).ok


def test_each_chain_rotates_on_its_own(tmp_path: Path) -> None:
    main = tmp_path / "audit.jsonl"
    writers = [AuditWriter(main, rotate_bytes=4096, key=KEY) for _ in range(3)]
    for i in range(150):
        for n, writer in enumerate(writers):
            writer.write({"kind": "call", "writer": n, "i": i})
    for writer in writers:
        writer.close()
    chains = trail_chains(main)
    assert sorted(chains) == [0, 1, 2] and all(len(members) > 3 for members in chains.values())
    trail = verify_paths([main], KEY)
    assert trail.ok, trail.to_json()
    assert [chain.report.records for chain in trail.chains if chain.chain is not None] == [151, 152, 152]
    assert not verify_paths([main]).ok  # sealed with the key: without it every hash differs


def test_more_writers_than_chains_allowed_are_refused_with_the_fix(tmp_path: Path) -> None:
    main = tmp_path / "audit.jsonl"
    held = [claim_chain(main, None, max_chains=1) for _ in range(2)]
    try:
        with pytest.raises(Exception, match="Bastion processes are writing this audit trail already"):
            claim_chain(main, None, max_chains=1)
    finally:
        for claimed in held:
            claimed.release()


def test_a_lock_that_cannot_be_made_stops_the_start(tmp_path: Path) -> None:
    main = tmp_path / "audit.jsonl"
    lock_path(main).mkdir()  # a directory where the lock file goes
    with pytest.raises(AuditStartError, match=r"audit\.jsonl\.lock: cannot open the audit trail's lock"):
        AuditWriter(main)


# ---- Verifying a trail of several chains ----


@pytest.fixture()
def trail(tmp_path: Path) -> Path:
    """A finished trail of three chains, the second rotated."""
    main = tmp_path / "audit.jsonl"
    writers = [AuditWriter(main), AuditWriter(main, rotate_bytes=4096), AuditWriter(main)]
    for i in range(60):
        for n, writer in enumerate(writers):
            writer.write({"kind": "call", "writer": n, "i": i})
    for writer in writers:
        writer.close()
    assert len(trail_chains(main)[1]) > 1
    return main


def test_an_intact_trail_of_several_chains_verifies(trail: Path) -> None:
    report = verify_paths([trail])
    assert report.ok and report.problems == []
    assert [(chain.role, chain.chain) for chain in report.chains] == [
        ("main", 0), ("process", 1), ("process", 2), ("registry", None)
    ]
    assert report.records == 61 + 62 + 62
    assert all(chain.report.warnings == [] for chain in report.chains)


def test_an_edit_in_any_chain_is_found_and_named(trail: Path) -> None:
    victim = trail_chains(trail)[1][0]
    lines = victim.read_bytes().splitlines()
    lines[3] = lines[3].replace(b'"i":2', b'"i":22')
    victim.write_bytes(b"\n".join(lines) + b"\n")
    report = verify_paths([trail])
    assert not report.ok
    broken = [chain for chain in report.chains if not chain.report.ok]
    assert [chain.chain for chain in broken] == [1]
    assert any("altered" in problem for problem in broken[0].report.problems)


def test_a_deleted_record_in_a_process_chain_is_found(trail: Path) -> None:
    victim = chain_path(trail, 2)
    lines = victim.read_bytes().splitlines()
    del lines[10]
    victim.write_bytes(b"\n".join(lines) + b"\n")
    report = verify_paths([trail])
    assert not report.ok and any("missing" in p for p in report.chains[2].report.problems)


def test_a_deleted_whole_chain_is_found_through_the_registry(trail: Path) -> None:
    for member in trail_chains(trail)[2]:
        member.unlink()
    report = verify_paths([trail])
    assert not report.ok
    assert any("chain 2 (audit.chain-2.jsonl) was made" in p and "deleted" in p for p in report.problems)


def test_a_chain_put_in_place_of_another_is_found(trail: Path) -> None:
    shutil.copy(chain_path(trail, 2), chain_path(trail, 1).with_name("copy"))
    for member in trail_chains(trail)[1]:
        member.unlink()
    shutil.copy(chain_path(trail, 2), chain_path(trail, 1))  # chain 2's records, as chain 1
    report = verify_paths([trail])
    assert not report.ok
    assert any("opens chain 2, not chain 1" in p for p in report.problems)
    shutil.copy(chain_path(trail, 2), trail)  # and as the main chain
    assert any("opens chain 2, not the main chain" in p for p in verify_paths([trail]).problems)


def test_a_chain_missing_from_the_registry_is_found(trail: Path) -> None:
    registry = registry_path(trail)
    lines = registry.read_bytes().splitlines()
    registry.write_bytes(lines[0] + b"\n")  # chain 2's entry cut off the end
    report = verify_paths([trail])
    assert any("chain 2 is not in the trail's registry" in p for p in report.problems)
    registry.unlink()
    report = verify_paths([trail])
    assert sum("is not in the trail's registry" in p and "is missing" in p for p in report.problems) == 2


def test_an_edited_registry_is_found(trail: Path) -> None:
    registry = registry_path(trail)
    registry.write_bytes(registry.read_bytes().replace(b'"pid":', b'"pid":1', 1))
    report = verify_paths([trail])
    assert not report.ok and any("altered" in p for p in report.chains[-1].report.problems)


def test_an_empty_unregistered_chain_is_a_note_not_tampering(trail: Path) -> None:
    chain_path(trail, 3).write_bytes(b"")  # made by a process that ended before it registered the chain
    report = verify_paths([trail])
    assert report.ok
    assert any("chain 3" in note and "empty and not registered" in note for note in report.chains[-1].report.warnings)


def test_a_chain_being_written_is_told_from_one_cut_short(tmp_path: Path) -> None:
    main = tmp_path / "audit.jsonl"
    holder, writer = AuditWriter(main), AuditWriter(main)
    fill(writer, 3, "w")
    for _ in range(400):
        if len(writer.chain_path.read_bytes().splitlines()) >= 4:
            break
        time.sleep(0.025)
    running = verify_paths([main]).chains[1]
    assert running.writing is True and any("still being written" in note for note in running.report.warnings)
    writer.close()
    holder.close()
    lines = writer.chain_path.read_bytes().splitlines()
    writer.chain_path.write_bytes(b"\n".join(lines[:-1]) + b"\n")  # the shutdown record cut off
    cut = verify_paths([main]).chains[1]
    assert cut.report.ok and cut.writing is False and any("tail was cut" in note for note in cut.report.warnings)


def test_a_single_file_given_is_checked_alone(trail: Path) -> None:
    rotated = trail_chains(trail)[1][1]  # the chain's second file: its first records are elsewhere
    report = verify_paths([rotated])
    assert [chain.report.files for chain in report.chains] == [[str(rotated)]]
    assert any("earlier records are missing" in p for p in report.chains[0].report.problems)
    current = verify_paths([chain_path(trail, 1)])  # a process chain's current file brings its rotated ones
    assert current.ok and len(current.chains) == 1 and len(current.chains[0].report.files) > 1


# ---- The command ----


def test_cli_reports_each_chain_and_the_total(trail: Path) -> None:
    ok = subprocess.run([*BASTION, "audit", "verify", str(trail)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout == "", ok.stderr
    lines = ok.stderr.splitlines()
    assert lines[0].startswith(f"main chain {trail}: 61 records in 1 file(s), seq 0..60: intact")
    assert any(line.startswith("chain 1 ") and line.endswith(": intact") for line in lines)
    assert lines[-1] == "all: 185 records in 3 chain(s): intact"


def test_cli_json_report(trail: Path) -> None:
    done = subprocess.run([*BASTION, "audit", "verify", "--json", str(trail)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "intact" and report["records"] == 185 and report["problems"] == []
    chains = report["chains"]
    assert [(c["role"], c["chain"], c["status"]) for c in chains] == [
        ("main", 0, "intact"), ("process", 1, "intact"), ("process", 2, "intact"), ("registry", None, "intact")
    ]
    assert chains[1]["first_seq"] == 0 and chains[1]["last_seq"] == 61 and len(chains[1]["files"]) > 1
    assert chains[0]["writing"] is False and chains[0]["notes"] == []

    for member in trail_chains(trail)[1]:
        member.unlink()
    tampered = subprocess.run([*BASTION, "audit", "verify", "--json", str(trail)], capture_output=True, text=True, timeout=60)
    assert tampered.returncode == 1
    report = json.loads(tampered.stdout)
    assert report["status"] == "tampered" and any("chain 1" in p for p in report["problems"])


def test_cli_refuses_a_key_file_that_is_not_there(trail: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such.key"
    done = subprocess.run([*BASTION, "audit", "verify", "--key-file", str(missing), str(trail)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no-such.key" in done.stderr
    assert not missing.exists()  # not made up: a new key would make every record look altered


def test_a_process_killed_mid_trail_leaves_chains_that_verify(tmp_path: Path) -> None:
    """A writer in a process that is killed: its sealer finishes the lines it had; the next writer continues."""
    main = tmp_path / "audit.jsonl"
    script = (
        "import sys, time\n"
        "from bastion.policy.audit import AuditWriter\n"
        "w = AuditWriter(sys.argv[1])\n"
        "for i in range(200): w.write({'kind': 'call', 'i': i})\n"
        "time.sleep(0.5)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    holder = AuditWriter(main)
    try:
        child = subprocess.Popen([sys.executable, "-c", script, str(main)], stdout=subprocess.PIPE,
                                 cwd=Path(__file__).resolve().parents[2])
        assert child.stdout.readline() == b"ready\n"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        for _ in range(400):  # its sealer, left alone, ends when its input does, and lets the chain go
            if chain_in_use(chain_path(main, 1)) is False:
                break
            time.sleep(0.025)
        successor = AuditWriter(main)
        assert successor.chain_path == chain_path(main, 1)
        successor.write({"kind": "call", "i": "next"})
        successor.close()
    finally:
        holder.close()
    report = verify_paths([main])
    assert report.ok, report.to_json()
    records = records_of(chain_path(main, 1))
    # Its successor says first that the chain was not closed: what the killed process still held is missing.
    assert [r["kind"] for r in records] == ["chain"] + ["call"] * 200 + ["discontinuity", "call", "shutdown"]
    assert records[201]["after_seq"] == 200 and records[201]["lost"] is None
    killed = report.chains[1].report
    assert [found["seq"] for found in killed.discontinuities] == [201]
    assert any(note.startswith("discontinuity at seq 201") for note in killed.warnings)
