"""A hash-chained audit trail, sealed and written by a process beside the gateway, and its verifier.

Each record carries ``seq``, ``prev`` (the hash of the record before it) and ``hash`` (SHA-256, or
HMAC-SHA-256 when a key is configured, over the canonical JSON of the record without ``hash``). Editing,
deleting or reordering records breaks the chain; with a key, an editor cannot recompute it either.
When the file exceeds ``rotate_bytes`` it is renamed ``NAME.<first seq>.jsonl`` and the chain continues in a
fresh file, so ``verify`` checks all files of a chain as one sequence. Several processes on one trail
write a chain each (``audit_chains``: named, locked, registered), and ``verify_paths`` checks every chain
of a trail and its registry. The sealing itself is in ``audit_sealer``; this module queues records for it
and verifies trails.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import orjson

from bastion.policy import audit_sealer
from bastion.policy.audit_chains import (
    CHAIN_KIND,
    TrailUnavailable,
    chain_in_use,
    chain_path,
    claim_chain,
    opening_record,
    parse_name,
    read_records,
    registered_chains,
    registry_path,
    trail_chains,
)
from bastion.policy.config import PolicyStartError
from bastion.policy.audit_sealer import (
    CONTINUE,
    DISCONTINUITY_KIND,
    FAILING,
    GAP_KIND,
    GENESIS,
    KEY_PREFIX,
    RESUMED,
    call_records,
    record_hash,
    records_in,
    rotated_name,
    sealed_line,
    shape_of,
    trail_files,
    when,
)

__all__ = [
    "GENESIS",
    "AuditReport",
    "AuditWriter",
    "ChainReport",
    "TrailReport",
    "call_records",
    "expand_trail",
    "record_hash",
    "rotated_name",
    "sealed_line",
    "shape_of",
    "trail_files",
    "verify",
    "verify_paths",
]

log = logging.getLogger(__name__)


class AuditStartError(PolicyStartError, RuntimeError):
    """The audit trail cannot be opened or continued: the gateway does not start without it."""

_CLOSE = object()
_ONE_LINE = orjson.OPT_APPEND_NEWLINE
_DRAIN_SECONDS = 0.05
_RESTART_FIRST_SECONDS = 0.1  # a sealer that cannot be started is tried again after this, then twice as long ...
_RESTART_MAX_SECONDS = 5.0  # ... up to this: never given up
_WAKE_AT = 4096
_READY_SECONDS = 30.0
MAX_PENDING = 100_000  # lines queued for the sealer; beyond this, records are counted and dropped


class _Gap:
    """Stands in the queue where records were dropped, counting them (the sealer writes a ``gap`` record)."""

    __slots__ = ("dropped", "closed")

    def __init__(self) -> None:
        self.dropped = 0
        self.closed = False


def _gap_record(reason: str, **facts: Any) -> bytes:
    return orjson.dumps({"kind": GAP_KIND, **facts, "ts": time.time(), "reason": reason}, option=_ONE_LINE)


class _Outage:
    """No sealer runs (the last one exited, and none could be started yet): since when, and what was dropped."""

    def __init__(self, status: int | None) -> None:
        self.status = status
        self.since = time.time()
        self.dropped = 0  # records handed over meanwhile, which no sealer took
        self.attempts = 0
        self.pause = _RESTART_FIRST_SECONDS
        self.retry_at = 0.0  # the first replacement is started at once

    def drop(self, data: bytes) -> None:
        self.dropped += sum(records_in(line)[0] for line in data.split(b"\n") if line)

    def again_later(self) -> None:
        self.attempts += 1
        self.retry_at = time.monotonic() + self.pause
        self.pause = min(self.pause * 2, _RESTART_MAX_SECONDS)

    def gap_line(self) -> bytes:
        reason = f"the audit sealer exited with status {self.status}; records it had not yet written are missing"
        if self.dropped:
            reason += f", and {self.dropped} record(s) handed over while no sealer ran"
        now = time.time()
        reason += f" (between {when(self.since)} and {when(now)})"
        return _gap_record(reason, cause="sealer_exited", lost=None, dropped=self.dropped, to=now,
                           **{"from": self.since})


class AuditWriter:
    """Queues records from any thread or coroutine for the sealer process, which chains and writes them.

    Queuing costs the caller one serialisation and a deque append; a thread of this process moves the
    queue into the sealer's pipe (a system call, during which it does not hold the GIL). The queue's
    order is the order of decisions, and the sealer chains in that order.

    A sealer that dies is started again, and its successor first seals a ``gap`` record: the lines the
    dead one had taken but not yet written are lost, and the trail says so rather than hiding it. One that
    cannot be started is tried again after a pause that doubles up to ``_RESTART_MAX_SECONDS``, never given
    up; the records handed over meanwhile are counted in that gap record. A sealer that cannot write the
    trail (a full disk) says so and keeps taking records (see ``audit_sealer``); ``failure`` says why the
    trail is not being written, or is None while it is. A sealer that falls behind (a stalled disk) makes
    the queue hold at most ``max_pending`` lines: the gateway's memory stays bounded, and the records
    dropped meanwhile are counted in a ``gap`` record where they would have been.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        rotate_bytes: int = 50 * 1024 * 1024,
        key: bytes | None = None,
        max_pending: int = MAX_PENDING,
    ):
        self.path = Path(path).expanduser()  # the trail's configured path
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as error:
            raise AuditStartError(
                f"{self.path}: cannot open the audit trail ({error.strerror}); fix its permissions or set audit.path"
            ) from None
        try:
            # Claimed here first, so a trail that cannot be written stops the gateway at start, not silently later.
            self._chain = claim_chain(self.path, key)
        except TrailUnavailable as error:
            raise AuditStartError(str(error)) from None
        self.chain_path = self._chain.path  # the file of the chain this process writes (the trail's own path, or a sibling)
        self._rotate_bytes = rotate_bytes
        self._key = key
        self._closed = False  # no more records accepted
        # Why the trail is not being written now (None while it is): read by the gateway before each call.
        self.failure: str | None = None
        # When records last went to the sealer whole (wall clock, None before the first): with ``failure`` None, the
        # trail's last successful write as far as this process can know; with ``behind``, the metrics' audit health.
        self.last_delivered: float | None = None
        self._outage: _Outage | None = None  # no sealer runs
        try:
            self._start_sealer()
        except BaseException:
            self._chain.release()
            raise
        if self._chain.index:
            log.info("audit trail %s is being written by another process: this one writes %s", self.path, self.chain_path)
        self._pending: collections.deque[Any] = collections.deque()
        if self._chain.fresh and self._chain.index:
            self._pending.append(orjson.dumps(opening_record(self._chain.index), option=_ONE_LINE))
        self._max_pending = max_pending
        self._gap: _Gap | None = None  # the run of dropped records in progress
        self._gap_lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._close_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="bastion-audit", daemon=True)
        self._thread.start()

    def _start_sealer(self, continuing: bool = False) -> None:
        """Start a sealer and wait until it holds the chain head; raises AuditStartError when it cannot.

        ``continuing``: it takes over from a sealer of this process that exited (which the gap record this
        process sends says), so it does not record the chain's unfinished end as a discontinuity of its own.
        """
        command = [sys.executable, "-P", audit_sealer.__file__, str(self.chain_path), str(self._rotate_bytes)]
        self._process = subprocess.Popen(
            # -P: the sealer's own directory (bastion/policy) must not shadow the modules it imports.
            command + [CONTINUE] if continuing else command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            # The chain's lock goes with it: held while the sealer still writes, should this process end first.
            pass_fds=(self._chain.lock_fd,),
            # Its own session: a terminal's Ctrl-C for the gateway must not end the trail before the gateway does.
            start_new_session=True,
        )
        self._pipe = self._process.stdin.fileno()  # type: ignore[union-attr]
        key_line = KEY_PREFIX + (self._key.hex().encode() if self._key else b"") + b"\n"
        if self._send(key_line) != len(key_line):
            self._process.wait()
            self._process.stdout.close()  # type: ignore[union-attr]
            self._process.stdin.close()  # type: ignore[union-attr]
            raise AuditStartError(f"the audit sealer for {self.chain_path} exited at start (see its error output above)")
        self._await_ready()

    def _await_ready(self) -> None:
        """Wait until the sealer holds the trail's chain head: a trail that cannot be sealed stops the start."""
        process = self._process
        answers = process.stdout  # type: ignore[union-attr]
        ready, _, _ = select.select([answers], [], [], _READY_SECONDS)
        line = answers.readline() if ready else b""
        if line != audit_sealer.READY:
            answers.close()
            process.kill()
            process.wait()
            with contextlib.suppress(OSError):
                process.stdin.close()  # type: ignore[union-attr]
            raise AuditStartError(f"the audit sealer for {self.chain_path} did not start (see its error output above)")
        self.failure = None
        # What it says from now on: that the trail cannot be written, or that it can again.
        threading.Thread(target=self._listen, args=(process, answers), name="bastion-audit-status", daemon=True).start()

    def _listen(self, process: subprocess.Popen[bytes], answers: Any) -> None:
        with answers:
            for line in answers:
                if process is not self._process:
                    continue  # a sealer already replaced: what it says no longer stands
                said = line.rstrip(b"\n").decode(errors="replace")
                if line.startswith(FAILING):
                    self.failure = f"the audit trail cannot be written ({said[len(FAILING):]})"
                    log.error("%s: %s: records are counted, not written, and the trail is tried again until it can "
                              "be written; then a gap record says how many are missing", self.chain_path, self.failure)
                elif line.startswith(RESUMED):
                    self.failure = None
                    log.warning("%s: the audit trail is written again: %s", self.chain_path, said[len(RESUMED):])

    def behind(self) -> int:
        """Records handed over and not yet sent to the sealer."""
        return len(self._pending)

    def write(self, record: dict[str, Any]) -> None:
        """Queue ``record`` (stamped now unless it has a ``ts``); never blocks on I/O."""
        if self._closed:
            return
        record.setdefault("ts", time.time())
        self._queue(orjson.dumps(record, option=_ONE_LINE))

    def write_call(self, facts: tuple[Any, ...]) -> None:
        """Queue a request's facts, from which the sealer builds its records (``call_records``).

        Raises TypeError when a value cannot be written as JSON.
        """
        if self._closed:
            return
        self._queue(orjson.dumps(facts, option=_ONE_LINE))

    def _queue(self, line: bytes) -> None:
        pending = self._pending
        if len(pending) < self._max_pending:
            if self._gap is not None:
                with self._gap_lock:
                    self._gap = None  # the run of drops has ended; a later one gets a gap of its own
            pending.append(line)
            if len(pending) > _WAKE_AT:
                self._wake.set()
            return
        with self._gap_lock:
            gap = self._gap
            if gap is None or gap.closed:
                gap = self._gap = _Gap()
                pending.append(gap)
            gap.dropped += 1
        self._wake.set()

    def _gap_line(self, gap: _Gap) -> bytes:
        with self._gap_lock:
            gap.closed = True
            dropped = gap.dropped
        log.error("%d audit record(s) dropped: the audit sealer fell behind", dropped)
        return _gap_record(f"{dropped} record(s) dropped here: the audit sealer fell behind", cause="fell_behind",
                           dropped=dropped)

    def _run(self) -> None:
        pending = self._pending
        while True:
            self._wake.wait(_DRAIN_SECONDS)
            self._wake.clear()
            lines: list[bytes] = []
            closing = False
            while pending:
                item = pending.popleft()
                if item is _CLOSE:
                    closing = True
                    break
                lines.append(self._gap_line(item) if type(item) is _Gap else item)
            if closing and self._outage is not None:
                self._outage.retry_at = 0.0  # one more try at the end, whatever the pause
            if lines:
                self._deliver(b"".join(lines))
            elif self._outage is not None:
                self._restart()
            if closing:
                self._finish()
                return

    def _send(self, data: bytes) -> int:
        """Write ``data`` into the sealer's pipe; returns how many bytes it took (fewer once it is gone)."""
        view = memoryview(data)
        sent = 0
        try:
            while sent < len(data):
                sent += os.write(self._pipe, view[sent:])
        except OSError:
            pass
        return sent

    def _deliver(self, data: bytes) -> None:
        """Send whole lines to the sealer, starting a new one (after a ``gap`` record) if it has died."""
        while True:
            if self._outage is not None and not self._restart():
                self._outage.drop(data)  # no sealer: counted, for the gap record its successor seals
                return
            sent = self._send(data)
            if sent == len(data):
                if self.failure is None:
                    self.last_delivered = time.time()
                return
            # Lines the pipe took whole were the dead sealer's; the rest go to its successor.
            data = data[data.rfind(b"\n", 0, sent) + 1 :]
            self._sealer_exited()

    def _sealer_exited(self) -> None:
        status = self._process.wait()
        with contextlib.suppress(OSError):
            self._process.stdin.close()  # type: ignore[union-attr]  # the dead sealer's end of the pipe
        self._outage = _Outage(status)
        self.failure = f"the audit sealer exited with status {status}"
        log.error("the audit sealer exited with status %s; starting another", status)

    def _restart(self) -> bool:
        """Start a sealer in place of the one that exited, once the pause is over; True when one runs."""
        outage = self._outage
        assert outage is not None
        if time.monotonic() < outage.retry_at:
            return False
        try:
            self._start_sealer(continuing=True)
        except (OSError, AuditStartError) as error:
            if not outage.attempts:
                log.error("the audit sealer could not be started again (%s): records are counted, not written, and "
                          "another is tried every %.0f s at most", error, _RESTART_MAX_SECONDS)
            outage.again_later()
            self.failure = f"the audit sealer could not be started ({error})"
            return False
        self._outage = None
        if outage.attempts:
            log.warning("an audit sealer runs again after %d failed start(s); the trail continues", outage.attempts)
        # If this one dies too, the next delivery finds out.
        self._send(outage.gap_line())
        return True

    def _finish(self) -> None:
        if self._outage is not None:
            log.error("no audit sealer could be started to close the trail: %d record(s) since %s are missing; the "
                      "next start records the discontinuity", self._outage.dropped, when(self._outage.since))
            self._chain.release()
            return
        self._process.stdin.close()  # type: ignore[union-attr]
        status = self._process.wait()
        self._chain.release()
        if status != 0:
            log.error("the audit sealer exited with status %s: the trail's last records may be missing", status)

    def close(self) -> None:
        """Seal a shutdown record and everything before it, and wait until it is on disk."""
        with self._close_lock:
            if not self._closing:
                self._closing = True
                self._closed = True
                # Past the queue's bound if need be: the trail's last word is that it ended cleanly.
                self._pending.append(orjson.dumps({"kind": "shutdown", "ts": time.time()}, option=_ONE_LINE))
                self._pending.append(_CLOSE)
                self._wake.set()
        self._thread.join()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


@dataclass
class AuditReport:
    files: list[str] = field(default_factory=list)
    records: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    first_record: dict[str, Any] | None = None  # the earliest record found, whose seq may not be 0
    last_kind: str | None = None
    # Where records are missing and the chain says so (gap and discontinuity records): not tampering.
    discontinuities: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(paths: Iterable[str | os.PathLike[str]], key: bytes | None = None) -> AuditReport:
    """Check the chain across ``paths`` (files of one trail, any order; a directory's trail is expanded)."""
    report = AuditReport()
    loaded: list[tuple[int, str, list[tuple[int, dict[str, Any]]]]] = []
    for raw in paths:
        path = Path(raw).expanduser()
        records: list[tuple[int, dict[str, Any]]] = []
        try:
            lines = path.read_bytes().splitlines()
        except OSError as error:
            report.problems.append(f"{path}: cannot read ({error.strerror})")
            continue
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
                int(record["seq"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                report.problems.append(f"{path}:{number}: not an audit record")
                continue
            records.append((number, record))
        first = records[0][1]["seq"] if records else -1
        loaded.append((first, str(path), records))
    loaded.sort(key=lambda item: item[0])
    expected_seq: int | None = None
    prev_hash: str | None = None
    for _, name, records in loaded:
        report.files.append(name)
        for number, record in records:
            where = f"{name}:{number} (seq {record['seq']})"
            if record_hash(record, key) != record.get("hash"):
                report.problems.append(f"{where}: record was altered (hash mismatch)")
            if expected_seq is None:
                report.first_seq = record["seq"]
                report.first_record = record
                if record["seq"] != 0 or record.get("prev") != GENESIS:
                    report.problems.append(f"{where}: the trail does not start at its first record; earlier records are missing")
            else:
                if record["seq"] != expected_seq:
                    kind = "missing" if record["seq"] > expected_seq else "out of order or repeated"
                    report.problems.append(f"{where}: expected seq {expected_seq}; records are {kind}")
                if record.get("prev") != prev_hash:
                    report.problems.append(f"{where}: does not follow the record before it (chain broken)")
            expected_seq = int(record["seq"]) + 1
            prev_hash = record.get("hash")
            report.records += 1
            report.last_seq = record["seq"]
            if record.get("kind") in _DISCONTINUITY_KINDS:
                report.discontinuities.append(_discontinuity(name, record))
    report.last_kind = records_last_kind(loaded)
    report.warnings.extend(_discontinuity_note(found) for found in report.discontinuities)
    if report.records and report.last_kind != "shutdown":
        report.warnings.append(UNFINISHED)
    return report


_DISCONTINUITY_KINDS = (GAP_KIND, DISCONTINUITY_KIND)


def _discontinuity(file: str, record: dict[str, Any]) -> dict[str, Any]:
    """A gap or discontinuity record as the report lists it (older gap records carry only a reason)."""
    return {
        "file": file,
        "seq": record.get("seq"),
        "kind": record.get("kind"),
        "cause": record.get("cause"),
        "lost": record.get("lost"),
        "from": record.get("from"),
        "to": record.get("to", record.get("ts")),
        "reason": str(record.get("reason", "")),
    }


def _discontinuity_note(found: dict[str, Any]) -> str:
    at = found["to"]
    stamp = f" ({when(at)})" if type(at) in (int, float) else ""
    return f"{found['kind']} at seq {found['seq']}{stamp}: {found['reason']}"


UNFINISHED = "the last record is not a shutdown record: the gateway is running, or the tail was cut"


def records_last_kind(loaded: list[tuple[int, str, list[tuple[int, dict[str, Any]]]]]) -> str | None:
    for _, _, records in reversed(loaded):
        if records:
            return records[-1][1].get("kind")
    return None


def expand_trail(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """A trail's current file expands to it and its rotated files."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        for member in trail_files(path) if path.exists() or list(trail_files(path)) else [path]:
            if member not in out:
                out.append(member)
    return out


@dataclass
class ChainReport:
    """One chain of a trail as verified: the main chain (0), a process's own chain (N ≥ 1), or the registry."""

    name: str  # the chain's current file
    chain: int | None  # None for the registry
    report: AuditReport
    writing: bool | None = None  # a process holds the chain's lock now (None: cannot tell)

    @property
    def role(self) -> str:
        return "registry" if self.chain is None else "main" if self.chain == 0 else "process"

    def to_json(self) -> dict[str, Any]:
        report = self.report
        return {
            "file": self.name,
            "chain": self.chain,
            "role": self.role,
            "status": "intact" if report.ok else "tampered",
            "records": report.records,
            "first_seq": report.first_seq,
            "last_seq": report.last_seq,
            "files": report.files,
            "writing": self.writing,
            "problems": report.problems,
            "notes": report.warnings,
            "discontinuities": report.discontinuities,
        }


@dataclass
class TrailReport:
    """Every chain named by the paths given, each verified, and what is wrong between them."""

    chains: list[ChainReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # a chain missing, unregistered, or in another's place

    @property
    def ok(self) -> bool:
        return not self.problems and all(chain.report.ok for chain in self.chains)

    @property
    def records(self) -> int:
        """Audit records in all chains (the registry's are not counted)."""
        return sum(chain.report.records for chain in self.chains if chain.chain is not None)

    @property
    def discontinuities(self) -> int:
        """Gap and discontinuity records in all chains: places where the trail says records are missing."""
        return sum(len(chain.report.discontinuities) for chain in self.chains)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": "intact" if self.ok else "tampered",
            "records": self.records,
            "discontinuities": self.discontinuities,
            "chains": [chain.to_json() for chain in self.chains],
            "problems": self.problems,
        }


_STILL_WRITING = "still being written: a Bastion process holds this chain (its latest records may not be on disk yet)"
_CUT_OR_KILLED = ("the last record is not a shutdown record and no process is writing this chain: "
                  "the tail was cut, or the process writing it was killed")


def verify_paths(paths: Iterable[str | os.PathLike[str]], key: bytes | None = None) -> TrailReport:
    """Verify every chain the paths name, each on its own, and the trail's registry of chains.

    A trail's configured path brings in all its chains (each with its rotated files) and its registry; a
    process chain's current file brings in its rotated files; a rotated file is checked alone.
    """
    groups: dict[tuple[Path, int], list[Path]] = {}
    trails: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        named = parse_name(path)
        if named.rotated or named.chain:
            _add_files(groups, (named.main, named.chain), [path] if named.rotated else trail_files(path) or [path])
            continue
        if path not in trails:
            trails.append(path)
        for index, members in trail_chains(path).items():
            _add_files(groups, (path, index), members or [path])
    trail = TrailReport()
    for (main, index), members in groups.items():
        chain = ChainReport(str(chain_path(main, index)), index, verify(members, key), chain_in_use(chain_path(main, index)))
        _explain_unfinished(chain)
        identity = _identity_problem(chain)
        if identity:
            trail.problems.append(identity)
        trail.chains.append(chain)
    for main in trails:
        _check_registry(main, {index: members for (owner, index), members in groups.items() if owner == main}, key, trail)
    return trail


def _add_files(groups: dict[tuple[Path, int], list[Path]], where: tuple[Path, int], members: list[Path]) -> None:
    group = groups.setdefault(where, [])
    seen = {member for files in groups.values() for member in files}
    group.extend(member for member in members if member not in seen)


def _explain_unfinished(chain: ChainReport) -> None:
    """Say whether a chain that does not end with a shutdown record is being written or was cut."""
    warnings = chain.report.warnings
    if UNFINISHED in warnings and chain.writing is not None:
        warnings[warnings.index(UNFINISHED)] = _STILL_WRITING if chain.writing else _CUT_OR_KILLED


def _chain_label(index: int) -> str:
    return "the main chain" if index == 0 else f"chain {index}"


def _identity_problem(chain: ChainReport) -> str | None:
    """A chain whose first record opens another chain holds that chain's records, not its own."""
    first, report = chain.report.first_record, chain.report
    if first is None or report.first_seq != 0 or chain.chain is None:
        return None  # empty, or its first records are missing (reported already)
    opens = first.get("chain") if first.get("kind") == CHAIN_KIND else 0
    if opens == chain.chain:
        return None
    opened = _chain_label(opens) if type(opens) is int else repr(opens)
    return (f"{chain.name}: its first record opens {opened}, not {_chain_label(chain.chain)}: "
            f"the records of another chain were put in its place")


def _check_registry(main: Path, chains: dict[int, list[Path]], key: bytes | None, trail: TrailReport) -> None:
    """Every process chain beside the trail is in its registry, and every registered chain is there."""
    registry = registry_path(main)
    extra = {index: members for index, members in chains.items() if index}
    if not registry.exists():
        for index in extra:
            trail.problems.append(
                f"{chain_path(main, index)}: chain {index} is not in the trail's registry ({registry} is missing)"
            )
        return
    report = verify([registry], key)
    report.warnings = [warning for warning in report.warnings if warning != UNFINISHED]  # it has no shutdown record
    trail.chains.append(ChainReport(str(registry), None, report))
    registered = registered_chains(read_records(registry))
    for index, members in extra.items():
        if index in registered:
            continue
        empty = all(member.stat().st_size == 0 for member in members if member.exists())
        if empty:  # made, but its process ended before registering it: nothing was written to it
            trail.chains[-1].report.warnings.append(f"chain {index} ({chain_path(main, index).name}) is empty and not registered")
        else:
            trail.problems.append(f"{chain_path(main, index)}: chain {index} is not in the trail's registry {registry}")
    for index, record in registered.items():
        if index not in extra:
            trail.problems.append(
                f"{registry}: chain {index} ({chain_path(main, index).name}) was made (registry seq "
                f"{record.get('seq')}) but none of its files are there: it was deleted"
            )
