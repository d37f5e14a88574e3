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
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import signal
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping

import orjson

GENESIS = "0" * 64
KEY_PREFIX = b"key:"
READY = b"ready\n"  # told the gateway once the chain head is read and the file is open
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


class Sealer:
    """Continues a trail's chain: seals records in the order given and writes them, rotating by size."""

    def __init__(self, path: Path, rotate_bytes: int, key: bytes | None) -> None:
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
        self._file = self._open()
        self._position = self._file.tell()
        self._lines: list[bytes] = []

    def _chain_head(self) -> tuple[int, str]:
        for candidate in reversed(trail_files(self.path)):
            last = _last_record(candidate)
            if last is not None:
                return int(last["seq"]) + 1, str(last["hash"])
        return 0, GENESIS

    def _open(self) -> io.FileIO:
        file = io.FileIO(self.path, "ab")
        os.chmod(self.path, 0o600)
        return file

    def take(self, line: bytes) -> None:
        """Seal the records one input line stands for."""
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
            self.write()
            self._rotate(self._seq)
        self._lines.append(line)
        self._position += len(line)
        self._prev = digest
        self._seq += 1

    def write(self) -> None:
        """Write the sealed lines not yet written."""
        if not self._lines:
            return
        data = memoryview(b"".join(self._lines))
        self._lines.clear()
        while data:
            data = data[self._file.write(data) :]

    def _rotate(self, next_seq: int) -> None:
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.path, rotated_name(self.path, self._file_first_seq))
        self._file = self._open()
        self._position = 0
        self._file_first_seq = next_seq

    def close(self) -> None:
        self.write()
        os.fsync(self._file.fileno())
        self._file.close()


def serve(source: int, answer: int, path: Path, rotate_bytes: int) -> None:
    """Read lines from ``source`` until its end, sealing and writing each chunk as it arrives."""
    lines = _lines(source)
    first = next(lines, [KEY_PREFIX])
    key = bytes.fromhex(first[0].removeprefix(KEY_PREFIX).decode()) or None
    sealer = Sealer(path, rotate_bytes, key)
    os.write(answer, READY)
    for line in first[1:]:
        sealer.take(line)
    for chunk in lines:
        for line in chunk:
            sealer.take(line)
        sealer.write()
    sealer.close()


def _lines(source: int) -> Iterator[list[bytes]]:
    """The complete, non-empty lines of each read from ``source``, as they arrive."""
    partial = b""
    while True:
        chunk = os.read(source, 1 << 20)
        if not chunk:
            break
        *complete, partial = (partial + chunk).split(b"\n")
        found = [line for line in complete if line]
        if found:
            yield found
    if partial.strip():
        yield [partial]


def main(argv: list[str]) -> int:
    # Shutdown is the gateway's to order, by closing our input: a signal meant for the gateway's process
    # group (Ctrl-C, a service manager's SIGTERM) must not cut the trail before the gateway's last records.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    path, rotate_bytes = Path(argv[1]), int(argv[2])
    serve(sys.stdin.fileno(), sys.stdout.fileno(), path, rotate_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
