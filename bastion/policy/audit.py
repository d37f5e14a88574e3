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
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import orjson

GENESIS = "0" * 64
_CLOSE = object()


def record_hash(record: Mapping[str, Any], key: bytes | None) -> str:
    body = orjson.dumps({k: v for k, v in record.items() if k != "hash"}, option=orjson.OPT_SORT_KEYS)
    if key:
        return hmac.new(key, body, hashlib.sha256).hexdigest()
    return hashlib.sha256(body).hexdigest()


def shape_of(value: Any, depth: int = 0) -> Any:
    """A value's shape without its content: types, lengths and object keys."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if value is None:
        return "null"
    if isinstance(value, str):
        return {"string": len(value)}
    if isinstance(value, list):
        return {"array": len(value)}
    if isinstance(value, Mapping):
        if depth >= 3:
            return {"object": len(value)}
        return {str(k): shape_of(v, depth + 1) for k, v in value.items()}
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
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._seq, self._prev = self._chain_head()
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
        """Queue ``record``; never blocks. ``ts`` is stamped now, the chain fields by the writer thread."""
        if self._closed:
            return
        record.setdefault("ts", time.time())
        self._queue.put(record)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch = [item]
            while len(batch) < 512:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done = False
            for record in batch:
                if record is _CLOSE:
                    done = True
                    continue
                if isinstance(record, threading.Event):
                    self._file.flush()
                    record.set()
                    continue
                self._append(record)
            self._file.flush()
            if done:
                os.fsync(self._file.fileno())
                self._file.close()
                return

    def _append(self, record: dict[str, Any]) -> None:
        record["seq"] = self._seq
        record["prev"] = self._prev
        record["hash"] = record_hash(record, self._key)
        line = orjson.dumps(record) + b"\n"
        if self._file.tell() + len(line) > self._rotate_bytes and self._file.tell() > 0:
            self._rotate()
        self._file.write(line)
        self._seq += 1
        self._prev = record["hash"]

    def _rotate(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.path, rotated_name(self.path, self._file_first_seq))
        self._file = self.path.open("ab")
        os.chmod(self.path, 0o600)
        self._file_first_seq = self._seq

    def flush(self, timeout: float = 10.0) -> None:
        """Block until everything queued so far is on disk (call from a thread, not the event loop)."""
        if self._closed:
            return
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self.write({"kind": "shutdown"})
        self._closed = True
        self._queue.put(_CLOSE)
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
