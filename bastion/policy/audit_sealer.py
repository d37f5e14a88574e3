"""The audit trail's sealer: a process of its own that chains, hashes, writes and rotates the records.

The gateway sends it one JSON value per line on its standard input: an object is a finished record, an
array is the facts of one request, from which ``call_parts`` makes its ``decision`` and ``call`` records.
The first line is ``key:`` and the HMAC key in hex (nothing after it for plain SHA-256). Once it holds the
chain head it answers ``ready`` on its standard output. Lines are sealed in the order they arrive, which is
the order of the decisions. At the end of its input it syncs the file to disk and exits. The file is the
chain its gateway claimed; the gateway hands over that chain's lock as an inherited descriptor, so that no
other process takes the chain while this one still writes it, should the gateway end first.

Encoding and hashing records is Python work; in a thread of the gateway it would hold the GIL the event
loop needs, so it runs here, beside the loop. This file imports nothing from Bastion, so it starts as a
plain script, without loading the gateway. Its time per request is kept low by serialising what a
request's two records share once and what repeats across requests (the stages' part) once per kind; the
bytes are those of serialising each record whole with sorted keys, as verification does.

Each record carries ``seq``, ``prev`` (the hash of the record before it) and ``hash`` (SHA-256, or
HMAC-SHA-256 with a key, over the canonical JSON of the record without ``hash``). When the file would
exceed ``rotate_bytes`` it is renamed ``NAME.<first seq>.jsonl`` and the chain continues in a fresh file.

A trail that cannot be written (a full disk, a file system gone read-only) does not end the sealer. It
tells the gateway ``failing <why>`` on its standard output, keeps reading its input (so the gateway never
waits on it) and counts the records it cannot write, and tries again after a pause that doubles up to
``RETRY_MAX_SECONDS``. The first write that works again is a ``gap`` record: how many records are missing
and between which times, hash-chained after the last record that is on disk (a line cut short by the
failure is cut off first); then ``resumed``. At its start, a sealer that finds its chain not ended by a
``shutdown`` record (its last writer was killed, or its host stopped) first seals a ``discontinuity``
record saying so, unless the gateway started it to continue a chain its previous sealer left (``continue``
as its third argument: the gateway records that gap itself).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import io
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import orjson

GENESIS = "0" * 64
KEY_PREFIX = b"key:"
READY = b"ready\n"  # told the gateway once the chain head is read and the file is open
FAILING = b"failing "  # told the gateway, with the reason, when the trail cannot be written
RESUMED = b"resumed "  # told the gateway, with the gap record's reason, once it can again
CONTINUE = "continue"  # third argument: the gateway continues a chain its previous sealer left
SHUTDOWN_KIND = "shutdown"
GAP_KIND = "gap"
DISCONTINUITY_KIND = "discontinuity"
RETRY_FIRST_SECONDS = 0.05
RETRY_MAX_SECONDS = 1.0  # a trail that cannot be written is tried again at least this often
_SORT_KEYS = orjson.OPT_SORT_KEYS
_sha256 = hashlib.sha256


def record_hash(record: Mapping[str, Any], key: bytes | None) -> str:
    """The hash of a record: over its canonical JSON (sorted keys, orjson's number format) without ``hash``."""
    body = orjson.dumps({k: v for k, v in record.items() if k != "hash"}, option=_SORT_KEYS)
    return hmac.new(key, body, hashlib.sha256).hexdigest() if key else _sha256(body).hexdigest()


def sealed_line(record: dict[str, Any], key: bytes | None) -> tuple[bytes, str]:
    """The record's JSON line with its hash appended, serialising it only once."""
    body = orjson.dumps(record, option=_SORT_KEYS)
    digest = hmac.new(key, body, hashlib.sha256).hexdigest() if key else _sha256(body).hexdigest()
    return b"%b,\"hash\":\"%b\"}\n" % (body[:-1], digest.encode()), digest


_SCALAR_SHAPES = {bool: "boolean", int: "number", float: "number", type(None): "null"}


def shape_of(value: Any, depth: int = 0) -> Any:
    """A value's shape without its content: types, lengths and object keys."""
    kind = type(value)
    scalar = _SCALAR_SHAPES.get(kind)
    if scalar is not None:
        return scalar
    if kind is str:
        return {"string": len(value)}
    if kind is list:
        return {"array": len(value)}
    if kind is dict or isinstance(value, Mapping):
        if depth >= 3:
            return {"object": len(value)}
        # Strings, arrays and scalars, the usual members, are shaped here rather than by a recursive call.
        shapes: dict[str, Any] = {}
        inner = depth + 1
        for k, v in value.items():
            member = type(v)
            if member is str:
                shapes[str(k)] = {"string": len(v)}
            elif member is list:
                shapes[str(k)] = {"array": len(v)}
            else:
                scalar = _SCALAR_SHAPES.get(member)
                shapes[str(k)] = scalar if scalar is not None else shape_of(v, inner)
        return shapes
    return type(value).__name__


def call_records(facts: list[Any]) -> list[dict[str, Any]]:
    """A request's records as the sealer writes them, read back as objects (without ``seq`` and ``prev``)."""
    records = []
    for head, middle, tail in call_parts(facts, StageParts()):
        record = orjson.loads(b"%b%b0%b}" % (head, middle, tail))
        del record["prev"], record["seq"]
        records.append(record)
    return records


# A record's JSON is head + prev + middle + seq + tail + "}", where prev is the previous record's hash as
# it stands between quotes (head ends with the opening one, middle starts with the closing one). All but
# the chain's two members is made before the record's turn in the chain comes.
RecordParts = tuple[bytes, bytes, bytes]
_PREV = b',"prev":"'


def call_parts(facts: list[Any], stage_parts: StageParts) -> list[RecordParts]:
    """A request's ``decision`` record (when a policy stage decided) and its ``call`` record, as parts.

    ``facts`` is ``[ts, who, method, target, arguments, shape_them, outcome, latency_ns, stages]``, each
    stage ``[stage, effect, rule, reason, detail]``; the last refusal, else the last stage, decides. With
    ``shape_them`` the arguments are recorded as their shape (the gateway sends their values so that it
    does not spend its own time shaping them; they go no further than this process).

    The records' members are sorted by name, so ``ts``, ``what`` and ``who`` end both: they are serialised
    once. Each part is serialised by orjson with sorted keys inside an object, at the depth it has in the
    record, so a record's bytes are those of serialising it whole, and a value too deep for orjson fails
    here as it would there.
    """
    ts, who, method, target, arguments, shape_them, outcome, latency_ns, stages = facts
    what: dict[str, Any] = {"method": method}
    if target is not None:
        what["target"] = target
    if arguments is not None:
        what["arguments"] = shape_of(arguments) if shape_them else arguments
    latency_ms = round(latency_ns / 1e6, 3)
    decided = stage_parts.of(stages) if stages else None
    try:
        shared_tail = b"," + orjson.dumps({"ts": ts, "what": what, "who": who}, option=_SORT_KEYS)[1:-1]
        if type(outcome) is str:  # as usual: nothing nested, so no depth to serialise it at
            call_head = _CALL_HEAD % (orjson.dumps(latency_ms), orjson.dumps(outcome))
        else:
            members = {"kind": "call", "latency_ms": latency_ms, "outcome": outcome}
            call_head = orjson.dumps(members, option=_SORT_KEYS)[:-1] + _PREV
    except TypeError as error:  # orjson.JSONEncodeError is TypeError itself
        raise Unwritable(error) from error
    call = (call_head, b'","seq":', shared_tail)
    if decided is None:
        return [call]
    head, middle, stages_member = decided
    return [(head, middle, stages_member + shared_tail), call]


_CALL_HEAD = b'{"kind":"call","latency_ms":%b,"outcome":%b' + _PREV


def _unrecordable(error: BaseException | None) -> dict[str, Any]:
    return {"kind": "unrecordable", "error": str(error)[:200]}


class Unwritable(Exception):
    """A value orjson cannot write (nested too deep), told apart from a malformed request's TypeError."""


def decision_parts(stages: Any) -> RecordParts:
    """The parts of a ``decision`` record but its shared tail: the last is its ``stages`` member."""
    final = next((stage for stage in reversed(stages) if stage[1] == "deny"), stages[-1])
    decision, rule, reason = final[1], final[2], final[3]
    recorded = [
        {"stage": stage, "decision": effect, "rule": rule, "reason": reason, **(detail or {})}
        for stage, effect, rule, reason, detail in stages
    ]
    try:
        head = orjson.dumps({"decision": decision, "kind": "decision"}, option=_SORT_KEYS)[:-1] + _PREV
        middle = b'",' + orjson.dumps({"reason": reason, "rule": rule}, option=_SORT_KEYS)[1:-1] + b',"seq":'
        stages_member = b"," + orjson.dumps({"stages": recorded}, option=_SORT_KEYS)[1:-1]
    except TypeError as error:
        raise Unwritable(error) from error
    return head, middle, stages_member


class StageParts:
    """``decision_parts`` kept by the stages' own JSON: the same few decisions repeat call after call."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit  # distinct stage lists kept: a refusal's reason may name what it refused
        self._parts: dict[bytes, RecordParts] = {}

    def of(self, stages: Any) -> RecordParts:
        try:
            key = orjson.dumps(stages)
        except TypeError:
            return decision_parts(stages)  # too deep to be a key, and to be recorded: fails there
        parts = self._parts.get(key)
        if parts is None:
            if len(self._parts) >= self._limit:
                self._parts.clear()
            parts = self._parts[key] = decision_parts(stages)
        return parts


def rotated_name(path: Path, first_seq: int) -> Path:
    return path.with_name(f"{path.stem}.{first_seq:012d}{path.suffix or '.jsonl'}")


def trail_files(path: Path) -> list[Path]:
    """The rotated files of a trail, oldest first, then the current file."""
    rotated = sorted(path.parent.glob(f"{path.stem}.[0-9]*{path.suffix or '.jsonl'}"))
    return [*rotated, *([path] if path.exists() else [])]


def _last_record(path: Path) -> dict[str, Any] | None:
    try:
        with path.open("rb") as file:
            file.seek(0, os.SEEK_END)
            size = file.tell()
            file.seek(max(0, size - 65536))
            lines = file.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
    return None


def _first_record(path: Path) -> dict[str, Any] | None:
    try:
        with path.open("rb") as file:
            return orjson.loads(file.readline())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None


def when(ts: float) -> str:
    """A time as people read it in a record's reason: UTC, to the millisecond."""
    try:
        moment = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return repr(ts)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def repair_tail(path: Path) -> int:
    """Cut off a last line that was never finished (a write cut short); returns how many bytes were cut.

    A complete line ends with a newline; appending after an unfinished one would join it to the next record.
    """
    try:
        file = open(path, "r+b")
    except FileNotFoundError:
        return 0
    with file:
        size = file.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        file.seek(size - 1)
        if file.read(1) == b"\n":
            return 0
        end = size
        while end > 0:
            start = max(0, end - 65536)
            file.seek(start)
            block = file.read(end - start)
            newline = block.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        else:
            keep = 0
        file.truncate(keep)
        return size - keep


def records_in(line: bytes) -> tuple[int, float | None, str | None]:
    """How many records one input line stands for, its time, and its kind (for a finished record)."""
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError:
        return 1, None, None  # would have been an ``unrecordable`` record
    if type(message) is list:
        ts = message[0] if message and type(message[0]) in (int, float) else None
        stages = message[8] if len(message) > 8 else None
        return (2 if stages else 1), ts, None
    if type(message) is dict:
        ts = message.get("ts")
        return 1, ts if type(ts) in (int, float) else None, message.get("kind")
    return 1, None, None


class _Failure:
    """The trail cannot be written: since when, why, what is lost meanwhile, and when to try again."""

    def __init__(self, error: OSError, unwritten: list[bytes]) -> None:
        self.since = time.time()
        self.error = error.strerror or str(error)  # the first failure's reason: the one the gap record gives
        self.unwritten = unwritten  # sealed lines that may not be on disk: those whose write failed
        self.lost = 0  # records missing from the chain, not yet told by a gap record on disk
        self.first_ts: float | None = None  # the earliest time among them
        self.shutdown: dict[str, Any] | None = None  # the gateway's last word, kept for when the trail is back
        self.attempted: tuple[str | None, str | None] = (None, None)  # hashes of the last attempt's gap and shutdown
        self.sent: tuple[int, float] = (0, 0.0)  # the last attempt's gap record: its count and its time
        self.pause = RETRY_FIRST_SECONDS
        self.retry_at = time.monotonic() + self.pause

    def count(self, line: bytes) -> None:
        records, ts, kind = records_in(line)
        if kind == SHUTDOWN_KIND:
            self.shutdown = orjson.loads(line)
            return
        self._lose(records, ts)

    def _lose(self, records: int, ts: float | None) -> None:
        self.lost += records
        if ts is not None and (self.first_ts is None or ts < self.first_ts):
            self.first_ts = ts

    def settle(self, on_disk: int, last_hash: str | None) -> None:
        """Bring the count up to what is on disk: ``on_disk`` is the chain's next seq, ``last_hash`` its head."""
        for line in self.unwritten:  # the failed write's records: those not on disk are lost
            record = orjson.loads(line)
            if record["seq"] < on_disk:
                continue
            if record.get("kind") == SHUTDOWN_KIND:
                if self.shutdown is None:
                    self.shutdown = {k: v for k, v in record.items() if k not in ("seq", "prev", "hash")}
                continue
            ts = record.get("ts")
            self._lose(1, ts if type(ts) in (int, float) else None)
        self.unwritten = []
        gap_hash, shutdown_hash = self.attempted
        if last_hash is not None and last_hash in (gap_hash, shutdown_hash):
            # The last attempt's records are on disk although it failed (at its sync, or between them).
            if gap_hash is not None:
                told, at = self.sent
                self.lost -= told
                self.since, self.first_ts = at, None
            if last_hash == shutdown_hash:
                self.shutdown = None
        self.attempted = (None, None)

    def again_later(self) -> None:
        self.pause = min(self.pause * 2, RETRY_MAX_SECONDS)
        self.retry_at = time.monotonic() + self.pause


class Sealer:
    """Continues a trail's chain: seals records in the order given and writes them, rotating by size.

    A write that fails leaves it failing (``failure``): it counts what it is given instead of sealing it,
    and ``write`` tries the trail again when the pause is over, first sealing a ``gap`` record.
    """

    def __init__(self, path: Path, rotate_bytes: int, key: bytes | None, report: int | None = None) -> None:
        self.path = path
        self._rotate_bytes = rotate_bytes
        self._key = key
        # Copied for each record: with a key, its pads are hashed once, not per record.
        self._hash = hmac.new(key, digestmod=hashlib.sha256) if key else _sha256()
        self._stage_parts = StageParts()
        self._seq, prev = self._chain_head()
        self._prev = orjson.dumps(prev)[1:-1]  # as it stands between quotes
        first = _first_record(path)
        self._file_first_seq = first["seq"] if first else self._seq
        self._file: io.FileIO | None = self._open()
        self._position = self._file.tell()
        self._lines: list[bytes] = []
        self.failure: _Failure | None = None
        self._report = report  # where the gateway is told the trail is failing, or resumed (a descriptor)
        self._resumed_reason = ""

    def _chain_head(self) -> tuple[int, str]:
        last = self.last_record()
        return (int(last["seq"]) + 1, str(last["hash"])) if last is not None else (0, GENESIS)

    def last_record(self) -> dict[str, Any] | None:
        """The chain's last record on disk, in its current file or, when that is empty, its rotated ones."""
        for candidate in reversed(trail_files(self.path)):
            last = _last_record(candidate)
            if last is not None:
                return last
        return None

    def note_unclean_end(self, cut: int = 0) -> None:
        """Seal a ``discontinuity`` record when the chain's last writer did not end it with a shutdown record."""
        last = self.last_record()
        if last is None or (last.get("kind") == SHUTDOWN_KIND and not cut):
            return
        now = time.time()
        last_ts = last.get("ts") if type(last.get("ts")) in (int, float) else None
        since = f" (its last record, seq {last.get('seq')}, is of {when(last_ts)})" if last_ts is not None else ""
        torn = f"; an unfinished last line of {cut} byte(s) was cut off" if cut else ""
        record: dict[str, Any] = {
            "kind": DISCONTINUITY_KIND,
            "cause": "unclean_end",
            "after_seq": last.get("seq"),
            "lost": None,
            "from": last_ts,
            "to": now,
            "ts": now,
            "reason": f"the previous run did not close this chain with a shutdown record{since}: it was killed or "
                      f"its host stopped, and records it had not yet written, an unknown number, are missing{torn}",
        }
        if cut:
            record["cut_bytes"] = cut
        try:
            self._add(record)
        except OSError as error:  # a rotation that could not be done: this record is the first one missing
            self._fail(error)
            self.failure.lost += 1  # type: ignore[union-attr]

    def _open(self) -> io.FileIO:
        file = io.FileIO(self.path, "ab")
        os.chmod(self.path, 0o600)
        return file

    def take(self, line: bytes) -> None:
        """Seal the records one input line stands for (count them, while the trail cannot be written)."""
        failure = self.failure
        if failure is not None:
            failure.count(line)
            return
        before = self._seq
        try:
            self._take(line)
        except OSError as error:  # a rotation that could not be done
            self._fail(error)
            unsealed = records_in(line)[0] - (self._seq - before)
            if self.failure is not None and unsealed > 0:
                self.failure.lost += unsealed

    def _take(self, line: bytes) -> None:
        try:
            message = orjson.loads(line)
            parts = call_parts(message, self._stage_parts) if type(message) is list else None
        except Unwritable as unwritable:
            message, parts = _unrecordable(unwritable.__cause__), None
        except (orjson.JSONDecodeError, TypeError, ValueError) as error:
            # The gap stays visible in the trail instead of silently shortening it.
            message, parts = _unrecordable(error), None
        if parts is not None:
            self._seal(parts)
            return
        try:
            self._add(message)
        except TypeError as error:
            if type(message) is not dict:
                raise
            self._add(_unrecordable(error))  # nested deeper than orjson writes

    def _seal(self, parts: list[RecordParts]) -> None:
        for head, middle, tail in parts:
            unclosed = b"".join((head, self._prev, middle, orjson.dumps(self._seq), tail))
            state = self._hash.copy()
            state.update(unclosed)
            state.update(b"}")
            digest = state.hexdigest().encode()
            self._append(b"".join((unclosed, b',"hash":"', digest, b'"}\n')), digest)

    def _add(self, record: dict[str, Any]) -> None:
        record["seq"] = self._seq
        record["prev"] = orjson.loads(b'"%b"' % self._prev)
        line, digest = sealed_line(record, self._key)
        self._append(line, digest.encode())

    def _append(self, line: bytes, digest: bytes) -> None:
        if self._position + len(line) > self._rotate_bytes and self._position > 0:
            self._write_lines()
            self._rotate(self._seq)
        self._lines.append(line)
        self._position += len(line)
        self._prev = digest
        self._seq += 1

    def write(self) -> None:
        """Write the sealed lines not yet written; while failing, try the trail again once the pause is over."""
        if self.failure is not None:
            if time.monotonic() >= self.failure.retry_at:
                self._recover()
            return
        try:
            self._write_lines()
        except OSError as error:
            self._fail(error)

    def _write_lines(self) -> None:
        """Write the sealed lines; they stay in ``_lines`` until all are written (a failure needs to know them)."""
        if not self._lines:
            return
        data = memoryview(b"".join(self._lines))
        while data:
            data = data[self._file.write(data) :]  # type: ignore[union-attr]
        self._lines.clear()

    def retry_in(self) -> float | None:
        """Seconds until the trail is tried again (None: it is being written)."""
        if self.failure is None:
            return None
        return max(0.0, self.failure.retry_at - time.monotonic())

    def _fail(self, error: OSError) -> None:
        """The trail cannot be written: stop sealing, count what comes, and tell the gateway."""
        self.failure = _Failure(error, self._lines)  # sealed, and maybe not (all) on disk
        self._lines = []
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        self._tell(FAILING + self.failure.error.encode(errors="replace"))

    def _tell(self, message: bytes) -> None:
        if self._report is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._report, message.replace(b"\n", b" ") + b"\n")

    def _recover(self) -> bool:
        """Continue the chain after its last record on disk with a ``gap`` record; False if it still fails.

        An attempt that fails may still have left whole records on disk (the gap record written, its sync
        failed): the next attempt finds them by their hashes and does not count their losses twice.
        """
        failure = self.failure
        assert failure is not None
        try:
            repair_tail(self.path)
            last = self.last_record()
            self._seq, prev = (int(last["seq"]) + 1, str(last["hash"])) if last is not None else (0, GENESIS)
            self._prev = orjson.dumps(prev)[1:-1]
            failure.settle(self._seq, last.get("hash") if last is not None else None)
            first = _first_record(self.path)
            self._file_first_seq = first["seq"] if first else self._seq
            self._file = self._open()
            self._position = self._file.tell()
            self._lines = []
            self._resumed_reason = "the audit trail is written again"
            gap_hash = shutdown_hash = None
            if failure.lost:
                self._add(self._gap_record(failure))
                gap_hash = self._prev.decode()
            if failure.shutdown is not None:  # the gateway's last word comes last, as it was sent
                self._add(dict(failure.shutdown))
                shutdown_hash = self._prev.decode()
            failure.attempted = (gap_hash, shutdown_hash)
            self._write_lines()
            os.fsync(self._file.fileno())
        except OSError as error:
            self._lines = []
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None
            failure.again_later()
            return False
        self.failure = None
        self._tell(RESUMED + self._resumed_reason.encode(errors="replace"))
        return True

    def _gap_record(self, failure: _Failure) -> dict[str, Any]:
        now = time.time()
        start = min(failure.first_ts, failure.since) if failure.first_ts is not None else failure.since
        self._resumed_reason = (
            f"{failure.lost} audit record(s) could not be written between {when(start)} and {when(now)} "
            f"({failure.error}): they are missing here"
        )
        failure.sent = (failure.lost, now)
        return {"kind": GAP_KIND, "cause": "write_failed", "error": failure.error, "lost": failure.lost,
                "from": start, "to": now, "ts": now, "reason": self._resumed_reason}

    def _rotate(self, next_seq: int) -> None:
        os.fsync(self._file.fileno())  # type: ignore[union-attr]
        self._file.close()  # type: ignore[union-attr]
        self._file = None
        os.replace(self.path, rotated_name(self.path, self._file_first_seq))
        self._file = self._open()
        self._position = 0
        self._file_first_seq = next_seq

    def close(self) -> bool:
        """Write what is left and sync it; a trail still failing is tried once more. True if all is on disk."""
        if self.failure is None:
            try:
                self._write_lines()
                os.fsync(self._file.fileno())  # type: ignore[union-attr]
            except OSError as error:
                self._fail(error)
        if self.failure is not None and not self._recover():
            return False
        with contextlib.suppress(OSError):
            self._file.close()  # type: ignore[union-attr]
        return True


def serve(source: int, answer: int, path: Path, rotate_bytes: int, continuing: bool = False) -> int:
    """Read lines from ``source`` until its end, sealing and writing each chunk as it arrives.

    Returns 0 when everything taken is on disk at the end, 1 when the trail could not be written by then.
    """
    lines = _Lines(source)
    first = lines.next(None) or [KEY_PREFIX]
    key = bytes.fromhex(first[0].removeprefix(KEY_PREFIX).decode()) or None
    cut = repair_tail(path)
    sealer = Sealer(path, rotate_bytes, key, answer)
    os.write(answer, READY)
    if not continuing:
        sealer.note_unclean_end(cut)
    chunk: list[bytes] | None = first[1:]
    while chunk is not None:
        for line in chunk:
            sealer.take(line)
        sealer.write()
        # While the trail cannot be written, input is waited for only until the next attempt is due.
        chunk = lines.next(sealer.retry_in())
    if sealer.close():
        return 0
    failure = sealer.failure
    missing = failure.lost + len(failure.unwritten) if failure else "some"
    print(f"bastion audit sealer: {path}: {missing} audit record(s) could not be "
          f"written ({failure.error if failure else 'unknown'}); the next start records the discontinuity",
          file=sys.stderr)
    return 1


class _Lines:
    """The complete, non-empty lines of each read from ``source``, as they arrive."""

    def __init__(self, source: int) -> None:
        self._source = source
        self._partial = b""
        self._ended = False

    def next(self, timeout: float | None) -> list[bytes] | None:
        """The lines of the next read; [] when ``timeout`` passes first; None at the end of the input."""
        while not self._ended:
            if timeout is not None:
                ready, _, _ = select.select([self._source], [], [], timeout)
                if not ready:
                    return []
            chunk = os.read(self._source, 1 << 20)
            if not chunk:
                self._ended = True
                break
            *complete, self._partial = (self._partial + chunk).split(b"\n")
            found = [line for line in complete if line]
            if found:
                return found
        if self._partial.strip():
            partial, self._partial = self._partial, b""
            return [partial]
        return None


def main(argv: list[str]) -> int:
    # Shutdown is the gateway's to order, by closing our input: a signal meant for the gateway's process
    # group (Ctrl-C, a service manager's SIGTERM) must not cut the trail before the gateway's last records.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A file size limit reached is a write that fails (EFBIG), counted and tried again, not the end of the sealer.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    path, rotate_bytes = Path(argv[1]), int(argv[2])
    continuing = argv[3:4] == [CONTINUE]
    return serve(sys.stdin.fileno(), sys.stdout.fileno(), path, rotate_bytes, continuing)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
