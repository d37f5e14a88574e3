"""A hash-chained audit trail written as JSON lines off the event loop, and its verifier.

Each record carries ``seq``, ``prev`` (the hash of the record before it) and ``hash`` (SHA-256, or
HMAC-SHA-256 when a key is configured, over the canonical JSON of the record without ``hash``). Editing,
deleting or reordering records breaks the chain; with a key, an editor cannot recompute it either.
When the file exceeds ``rotate_bytes`` it is renamed ``NAME.<first seq>.jsonl`` and the chain continues in a
fresh file, so ``verify`` checks all files of a trail as one sequence.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import collections
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import orjson

GENESIS = "0" * 64
_CLOSE = object()
_DRAIN_SECONDS = 0.05
_WAKE_AT = 4096


def _digest(body: bytes, key: bytes | None) -> str:
    if key:
        return hmac.new(key, body, hashlib.sha256).hexdigest()
    return hashlib.sha256(body).hexdigest()


def record_hash(record: Mapping[str, Any], key: bytes | None) -> str:
    """The hash of a record: over its canonical JSON (sorted keys, orjson's number format) without ``hash``."""
    return _digest(orjson.dumps({k: v for k, v in record.items() if k != "hash"}, option=orjson.OPT_SORT_KEYS), key)


_SORT_KEYS = orjson.OPT_SORT_KEYS
_sha256 = hashlib.sha256


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
        # Strings and scalars, the usual members, are shaped here rather than by a recursive call.
        shapes: dict[str, Any] = {}
        inner = depth + 1
        for k, v in value.items():
            member = type(v)
            if member is str:
                shapes[str(k)] = {"string": len(v)}
            else:
                scalar = _SCALAR_SHAPES.get(member)
                shapes[str(k)] = scalar if scalar is not None else shape_of(v, inner)
        return shapes
    return type(value).__name__


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


class AuditWriter:
    """Appends records from any thread or coroutine; a background thread hashes, writes and rotates."""

    def __init__(self, path: str | os.PathLike[str], rotate_bytes: int = 50 * 1024 * 1024, key: bytes | None = None):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._rotate_bytes = rotate_bytes
        self._key = key
        # Records wait in a deque that the writer thread drains every few milliseconds: appending to a deque
        # costs no system call, whereas waking the thread for each record would cost one per record.
        self._pending: collections.deque[Any] = collections.deque()
        self._wake = threading.Event()
        self._seq, self._prev = self._chain_head()
        self._chain_lock = threading.Lock()
        first = _first_record(self.path)
        self._file_first_seq = first["seq"] if first else self._seq
        self._file = self.path.open("ab")
        os.chmod(self.path, 0o600)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="bastion-audit", daemon=True)
        self._thread.start()

    def _chain_head(self) -> tuple[int, str]:
        for candidate in reversed(trail_files(self.path)):
            last = _last_record(candidate)
            if last is not None:
                return int(last["seq"]) + 1, str(last["hash"])
        return 0, GENESIS

    def write(self, record: dict[str, Any]) -> None:
        """Chain and queue ``record``; never blocks on I/O.

        The chain fields are computed here (a few µs) rather than in the writer thread: Python work in a
        second thread holds the GIL for up to the 5 ms switch interval and would stall the event loop,
        whereas the writer thread only does file writes, which release the GIL.
        """
        self.write_many((record,))

    def write_many(self, records: Iterable[dict[str, Any]]) -> None:
        """``write`` each record in order, holding the chain lock once for all of them."""
        key = self._key
        pending = self._pending
        with self._chain_lock:
            if self._closed:
                return
            for record in records:
                record.setdefault("ts", time.time())
                record["seq"] = self._seq
                record["prev"] = self._prev
                line, self._prev = sealed_line(record, key)
                pending.append((self._seq, line))
                self._seq += 1
        if len(pending) > _WAKE_AT:
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(_DRAIN_SECONDS)
            self._wake.clear()
            done = False
            # Lines are gathered and written in one call per batch; the position is tracked here so the
            # file rotates before exactly the same record as when each line was written on its own.
            pending = self._pending
            lines: list[bytes] = []
            position = self._file.tell()
            while pending:
                item = pending.popleft()
                if type(item) is tuple:
                    seq, line = item
                    if position + len(line) > self._rotate_bytes and position > 0:
                        self._file.write(b"".join(lines))
                        lines.clear()
                        self._rotate(seq)
                        position = self._file.tell()
                    lines.append(line)
                    position += len(line)
                    continue
                if lines:
                    self._file.write(b"".join(lines))
                    lines.clear()
                if item is _CLOSE:
                    done = True
                elif isinstance(item, threading.Event):
                    self._file.flush()
                    item.set()
            if lines:
                self._file.write(b"".join(lines))
            self._file.flush()
            if done:
                os.fsync(self._file.fileno())
                self._file.close()
                return

    def _rotate(self, next_seq: int) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.path, rotated_name(self.path, self._file_first_seq))
        self._file = self.path.open("ab")
        os.chmod(self.path, 0o600)
        self._file_first_seq = next_seq

    def flush(self, timeout: float = 10.0) -> None:
        """Block until everything queued so far is on disk (call from a thread, not the event loop)."""
        if self._closed:
            return
        done = threading.Event()
        self._pending.append(done)
        self._wake.set()
        done.wait(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self.write({"kind": "shutdown"})
        with self._chain_lock:
            self._closed = True
        self._pending.append(_CLOSE)
        self._wake.set()
        self._thread.join()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    async def aflush(self) -> None:
        await asyncio.to_thread(self.flush)


@dataclass
class AuditReport:
    files: list[str] = field(default_factory=list)
    records: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

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
    if report.records and records_last_kind(loaded) != "shutdown":
        report.warnings.append("the last record is not a shutdown record: the gateway is running, or the tail was cut")
    return report


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
