"""The audit sealer writes exactly the bytes it wrote when it built each record as an object and serialised it.

The sealer assembles a request's records from parts serialised once (``call_parts``); a trail written before
that change must continue unchanged, so every line must match, byte for byte, what the earlier code wrote.
That code is kept here, and only here, as the reference: ``ReferenceSealer`` below.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.policy.audit import AuditWriter, verify
from bastion.policy.audit_sealer import (
    GENESIS,
    Sealer,
    StageParts,
    _first_record,
    _last_record,
    call_records,
    decision_parts,
    rotated_name,
    shape_of,
    trail_files,
)
from tests.properties import JSON_INTS, JSON_OBJECTS, JSON_TEXT, JSON_VALUES, PROPERTY

KEY = b"k" * 32

# ---- The reference: the sealer's record building and sealing as they were, unchanged. ----
# (Reading the chain head did not change: the reference reads it with the sealer's own functions.)

_SORT_KEYS = orjson.OPT_SORT_KEYS
_SCALAR_SHAPES = {bool: "boolean", int: "number", float: "number", type(None): "null"}


def reference_sealed_line(record: dict[str, Any], key: bytes | None) -> tuple[bytes, str]:
    body = orjson.dumps(record, option=_SORT_KEYS)
    digest = hmac.new(key, body, hashlib.sha256).hexdigest() if key else hashlib.sha256(body).hexdigest()
    return b"%b,\"hash\":\"%b\"}\n" % (body[:-1], digest.encode()), digest


def reference_shape_of(value: Any, depth: int = 0) -> Any:
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
        shapes: dict[str, Any] = {}
        inner = depth + 1
        for k, v in value.items():
            member = type(v)
            if member is str:
                shapes[str(k)] = {"string": len(v)}
            else:
                scalar = _SCALAR_SHAPES.get(member)
                shapes[str(k)] = scalar if scalar is not None else reference_shape_of(v, inner)
        return shapes
    return type(value).__name__


def reference_call_records(facts: list[Any]) -> list[dict[str, Any]]:
    ts, who, method, target, arguments, shape_them, outcome, latency_ns, stages = facts
    what: dict[str, Any] = {"method": method}
    if target is not None:
        what["target"] = target
    if arguments is not None:
        what["arguments"] = reference_shape_of(arguments) if shape_them else arguments
    latency_ms = round(latency_ns / 1e6, 3)
    call = {"kind": "call", "ts": ts, "who": who, "what": what, "outcome": outcome, "latency_ms": latency_ms}
    if not stages:
        return [call]
    final = next((stage for stage in reversed(stages) if stage[1] == "deny"), stages[-1])
    decision = {
        "kind": "decision",
        "ts": ts,
        "who": who,
        "what": what,
        "decision": final[1],
        "rule": final[2],
        "reason": final[3],
        "stages": [
            {"stage": stage, "decision": effect, "rule": rule, "reason": reason, **(detail or {})}
            for stage, effect, rule, reason, detail in stages
        ],
    }
    return [decision, call]


class ReferenceSealer:
    def __init__(self, path: Path, rotate_bytes: int, key: bytes | None) -> None:
        self.path = path
        self._rotate_bytes = rotate_bytes
        self._key = key
        self._seq, self._prev = self._chain_head()
        first = _first_record(path)
        self._file_first_seq = first["seq"] if first else self._seq
        self._file = io.FileIO(self.path, "ab")
        self._position = self._file.tell()
        self._lines: list[bytes] = []

    def _chain_head(self) -> tuple[int, str]:
        for candidate in reversed(trail_files(self.path)):
            last = _last_record(candidate)
            if last is not None:
                return int(last["seq"]) + 1, str(last["hash"])
        return 0, GENESIS

    def take(self, line: bytes) -> None:
        try:
            message = orjson.loads(line)
            records = reference_call_records(message) if type(message) is list else [message]
            for record in records:
                if type(record) is dict:
                    orjson.dumps(record, option=_SORT_KEYS)  # nested deeper than orjson writes: unrecordable
        except (orjson.JSONDecodeError, TypeError, ValueError) as error:
            records = [{"kind": "unrecordable", "error": str(error)[:200]}]
        for record in records:
            self._add(record)

    def _add(self, record: dict[str, Any]) -> None:
        record["seq"] = self._seq
        record["prev"] = self._prev
        line, digest = reference_sealed_line(record, self._key)
        if self._position + len(line) > self._rotate_bytes and self._position > 0:
            self.write()
            self._rotate(self._seq)
        self._lines.append(line)
        self._position += len(line)
        self._prev = digest
        self._seq += 1

    def write(self) -> None:
        if self._lines:
            self._file.write(b"".join(self._lines))
            self._lines.clear()

    def _rotate(self, next_seq: int) -> None:
        self._file.close()
        os.replace(self.path, rotated_name(self.path, self._file_first_seq))
        self._file = io.FileIO(self.path, "ab")
        self._position = 0
        self._file_first_seq = next_seq

    def close(self) -> None:
        self.write()
        self._file.close()


# ---- Running both on the same input. ----


def outcome_of(sealer: Any, line: bytes) -> str | None:
    """What taking ``line`` raised (the sealer process would stop there), or None."""
    try:
        sealer.take(line)
    except Exception as error:  # noqa: BLE001 - the reference's crash is part of what must match
        return f"{type(error).__name__}: {error}"
    return None


def trail_bytes(path: Path) -> list[tuple[str, bytes]]:
    return [(member.name, member.read_bytes()) for member in trail_files(path)]


def assert_same_trail(
    lines: list[bytes], key: bytes | None = None, rotate_bytes: int = 1 << 30, existing: bytes = b""
) -> list[bytes]:
    """Seal ``lines`` with the sealer and with the reference, each continuing ``existing``; the files must match.

    Lines are sealed and written one by one, as the sealer process does. Returns the lines of the trail.
    """
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name in ("new", "reference"):
            os.mkdir(Path(tmp) / name)
            path = Path(tmp) / name / "audit.jsonl"
            if existing:
                path.write_bytes(existing)
            paths.append(path)
        sealer, reference = Sealer(paths[0], rotate_bytes, key), ReferenceSealer(paths[1], rotate_bytes, key)
        stopped = False
        for line in lines:
            failure = outcome_of(reference, line)
            assert outcome_of(sealer, line) == failure, line
            if failure is not None:
                stopped = True  # the process stops: what it sealed of this chunk is never written
                break
            sealer.write()
            reference.write()
        for each in (sealer, reference):
            if stopped:
                each._file.close()
            else:
                each.close()
        written = trail_bytes(paths[0])
        assert written == trail_bytes(paths[1])
        return b"".join(content for _, content in written).splitlines(keepends=True)


def facts_line(
    *,
    ts: Any = 1796052593.846039,
    who: Any = None,
    method: Any = "tools/call",
    target: Any = "fs__read_1",
    arguments: Any = None,
    shape_them: Any = True,
    outcome: Any = "complete",
    latency_ns: Any = 12_345_678,
    stages: Any = None,
) -> bytes:
    who = {"name": "alice", "groups": ["dev", "research"], "session": "s1"} if who is None else who
    arguments = {"path": "projects/a.md", "limit": 5, "tags": ["a"]} if arguments is None else arguments
    stages = ALLOWED if stages is None else stages
    return orjson.dumps([ts, who, method, target, arguments, shape_them, outcome, latency_ns, stages])


ALLOWED = [
    ["authorization", "allow", "p03-devs-fs", "permitted by p03-devs-fs", None],
    ["guards", "allow", "guards", "arguments accepted", None],
    ["rate_limit", "allow", "rate", "within limits", None],
]
DENIED = [
    ["authorization", "allow", "p03-devs-fs", "permitted", None],
    ["guards", "deny", "path", "outside the allowed roots", {"path": "/etc/passwd", "argument": "path"}],
    ["rate_limit", "allow", "rate", "within limits", None],
]


# ---- Hand-written edge cases. ----

EDGE_CASES: dict[str, list[bytes]] = {
    "usual call, repeated (stage parts reused)": [facts_line(), facts_line(ts=2.5), facts_line(latency_ns=1500)],
    "refusal decides over a later allow, with detail": [facts_line(stages=DENIED)],
    "two refusals: the last decides": [
        facts_line(stages=[DENIED[1], ["rate_limit", "deny", "rate", "too many", None]])
    ],
    "no stages": [facts_line(stages=[])],
    "stages null": [orjson.dumps([1.0, {}, "tools/list", None, None, True, "complete", 5, None])],
    "detail keys collide with the stage's own": [
        facts_line(
            stages=[["guards", "deny", "r", "why", {"decision": "overridden", "stage": 7, "rule": None, "zzz": 1}]]
        )
    ],
    "detail keys sort among the stage's": [
        facts_line(
            stages=[["guards", "allow", "r", "why", {"aaa": 1, "reasonable": 2, "s": 3, "é": 4, "Z": 5, "": 6}]]
        )
    ],
    "detail empty object": [facts_line(stages=[["guards", "allow", "r", "why", {}]])],
    "strings needing escapes everywhere": [
        facts_line(
            who={"name": 'a"b\\c\n\u2028\x00é😀', "groups": ["\t"], "session": "</script>"},
            method='tools/"call"',
            target="t\u0007",
            outcome='o"\\',
            stages=[['s"', 'd\n', 'r\\', "é😀\x1f", {'k"\n': 'v\\"'}]],
        )
    ],
    "target null": [facts_line(target=None)],
    "arguments null": [orjson.dumps([1.0, {"name": "a"}, "tools/call", "t", None, True, "complete", 5, ALLOWED])],
    "arguments not an object": [facts_line(arguments=[1, "two", {"three": 3}]), facts_line(arguments="text")],
    "arguments recorded as given, nested objects sorted": [
        facts_line(shape_them=False, arguments={"z": {"b": [1, {"y": 2, "x": 1}], "a": None}, "a": 1.5, "m": "é"})
    ],
    "arguments shaped, deep and mixed": [
        facts_line(arguments={"a": {"b": {"c": {"d": {"e": 1}}}}, "s": "xx", "l": [], "n": None, "t": True, "f": 0.5})
    ],
    "shape_them not a boolean": [facts_line(shape_them=0), facts_line(shape_them="yes")],
    "numbers: big ints, negative zero, floats": [
        facts_line(ts=2**64 - 1, latency_ns=2**63, outcome=-(2**63)),
        facts_line(ts=-0.0, latency_ns=0.5, outcome=1e-300),
        facts_line(ts=1e16, latency_ns=True, outcome=[1, 2.0]),
    ],
    "latency rounding ties": [facts_line(latency_ns=n) for n in (500, 1500, 2500, 1_000_500, 123_456_789_500)],
    "ts and who of any kind": [facts_line(ts="now", who=[1, 2]), facts_line(ts=None, who="alice"), facts_line(who={})],
    "outcome an object with a ts key": [facts_line(outcome={"b": 1, "ts": 2, "a": {"ts": 3}})],
    "unrecordable: not JSON": [b"{not json", b"[1, 2", b"\xff\xfe"],
    "unrecordable: wrong number of facts": [orjson.dumps([1, 2, 3]), orjson.dumps([]), orjson.dumps(list(range(10)))],
    "unrecordable: latency not a number": [facts_line(latency_ns="fast"), facts_line(latency_ns=None)],
    "unrecordable: stage not five long": [facts_line(stages=[["authorization", "allow", "r", "why"]])],
    "unrecordable: stage not a list": [facts_line(stages=[5]), facts_line(stages=7), facts_line(stages=True)],
    "unrecordable: detail not an object": [facts_line(stages=[["guards", "deny", "r", "why", [1, 2]]])],
    "weird stages that still record": [facts_line(stages="abcde"), facts_line(stages={"abcde": 1, "vwxyz": 2})],
    "plain records": [
        orjson.dumps({"kind": "shutdown", "ts": 1.0}),
        orjson.dumps({"seq": "mine", "prev": 1, "z": {"b": 1, "a": 2}}),
    ],
    "mixed: plain, facts, broken, facts": [
        orjson.dumps({"kind": "start"}), facts_line(), b"nope", facts_line(stages=DENIED)
    ],
    # The earlier code stopped on these (the sealer process exited): so must the sealer, at the same line.
    "stops: stage too short for its rule": [facts_line(), facts_line(stages=[["a", "deny"]])],
    "stops: stages a short string": [facts_line(stages="ab")],
    "stops: a record that is not an object": [facts_line(), b'"text"', facts_line()],
}


@pytest.mark.parametrize("lines", EDGE_CASES.values(), ids=EDGE_CASES.keys())
@pytest.mark.parametrize("key", [None, KEY], ids=["sha256", "hmac"])
def test_edge_cases_seal_as_the_reference_does(lines: list[bytes], key: bytes | None) -> None:
    assert_same_trail(lines, key)


DEEP = b'"DEEP"'
# Where a deep value goes, and whether the depth limit decides what happens to it there.
DEEP_PLACES = {
    "ts": (facts_line(ts="DEEP"), True),
    "who": (facts_line(who="DEEP"), True),
    "method": (facts_line(method="DEEP"), True),
    "target": (facts_line(target="DEEP"), True),
    "arguments recorded": (facts_line(arguments="DEEP", shape_them=False), True),
    "outcome": (facts_line(outcome="DEEP"), True),
    "stage name": (facts_line(stages=[["DEEP", "allow", "r", "w", None]]), True),
    "deciding rule": (facts_line(stages=[["g", "deny", "DEEP", "w", None]]), True),
    "detail": (facts_line(stages=[["g", "deny", "r", "w", {"d": "DEEP"}]]), True),
    # Shaped, a value is a few levels at most; a latency that is no number makes the request unrecordable
    # before any depth matters; stages nested as one list have a stage too short for a decision.
    "stages": (facts_line(stages="DEEP"), False),
    "arguments shaped": (facts_line(arguments={"a": "DEEP"}), False),
    "latency": (facts_line(latency_ns="DEEP"), False),
    "stages, and a latency that is no number": (facts_line(stages="DEEP", latency_ns="slow"), False),
}


@pytest.mark.parametrize(("line", "limit_matters"), DEEP_PLACES.values(), ids=DEEP_PLACES.keys())
def test_values_past_the_depth_limit_make_an_unrecordable_record(line: bytes, limit_matters: bool) -> None:
    # orjson writes 254 levels of nesting and no more; a record holds its values one or more levels down.
    # Past that limit the request is sealed as "unrecordable" (the earlier code stopped the sealer there).
    sealed_counts = set()
    for depth in range(247, 258):
        nested = b"[" * depth + b"]" * depth
        trail = assert_same_trail([facts_line(), line.replace(DEEP, nested)])
        sealed_counts.add(len(trail))
    assert (len(sealed_counts) > 1) == limit_matters
    if limit_matters:
        last = orjson.loads(trail[-1])
        assert last["kind"] == "unrecordable" and "ecursion" in last["error"]


def test_rotation_splits_where_the_reference_splits() -> None:
    lines = [facts_line(ts=float(i), stages=ALLOWED if i % 3 else DENIED) for i in range(40)]
    assert_same_trail(lines, rotate_bytes=3000)
    assert_same_trail(lines, KEY, rotate_bytes=1)  # every record in a file of its own


@pytest.mark.parametrize(
    "last",
    [
        {"seq": 41, "hash": "ab" * 32},
        {"seq": "7", "hash": 'odd "hash"\n\u2028é'},  # a hand-edited head: prev must be escaped as before
        {"seq": 2.0, "hash": None},
    ],
    ids=["usual", "escapes", "odd types"],
)
def test_continuing_an_existing_trail(last: dict[str, Any]) -> None:
    first = {"kind": "start", "seq": 0, "prev": GENESIS, "hash": "0" * 64}
    existing = orjson.dumps(first) + b"\n" + orjson.dumps(last) + b"\n"
    lines = [facts_line(), orjson.dumps({"kind": "plain"}), b"broken", facts_line(stages=DENIED)]
    assert_same_trail(lines, None, existing=existing)
    assert_same_trail(lines, KEY, existing=existing)


def test_a_chain_head_past_64_bits_stops_as_before() -> None:
    existing = orjson.dumps({"seq": 2**64 - 1, "hash": "ab" * 32}) + b"\n"
    assert assert_same_trail([facts_line(), orjson.dumps({"kind": "plain"})], existing=existing) == [existing]


def test_stage_parts_are_rebuilt_after_the_limit() -> None:
    parts = StageParts(limit=2)
    lists = [ALLOWED, DENIED, [["x", "allow", "r", "why", None]], ALLOWED]
    for stages in lists * 2:
        assert parts.of(orjson.loads(orjson.dumps(stages))) == decision_parts(stages)


def test_call_records_reads_back_what_the_reference_builds() -> None:
    for stages in (ALLOWED, DENIED, []):
        facts = orjson.loads(facts_line(stages=stages))
        assert call_records(facts) == reference_call_records(orjson.loads(facts_line(stages=stages)))


def test_shape_of_is_the_reference_shape() -> None:
    value = {"s": "abc", "l": [1, 2], "t": (1,), "d": {"a": {"b": {"c": {"d": 1}}}}, "n": None, "b": False, 3: 1.5}
    assert shape_of(value) == reference_shape_of(value)
    assert [shape_of(v) for v in ("x", [], (), 1, object)] == [reference_shape_of(v) for v in ("x", [], (), 1, object)]


# ---- Generated facts. ----

EFFECTS = st.sampled_from(["allow", "deny", "approval"])
STAGE_KEYS = st.sampled_from(["stage", "decision", "rule", "reason", "a", "reasons", "rulé", "z"]) | JSON_TEXT
DETAILS = st.none() | st.dictionaries(STAGE_KEYS, JSON_VALUES, min_size=1, max_size=4)
USUAL_STAGE = st.tuples(JSON_TEXT, EFFECTS, JSON_TEXT, JSON_TEXT, DETAILS).map(list)
USUAL_FACTS = st.tuples(
    st.floats(min_value=0, max_value=4e9),  # ts
    st.fixed_dictionaries({"name": JSON_TEXT, "groups": st.lists(JSON_TEXT, max_size=3), "session": JSON_TEXT}),
    JSON_TEXT,  # method
    st.none() | JSON_TEXT,  # target
    st.none() | JSON_OBJECTS | JSON_VALUES,  # arguments
    st.booleans(),  # shape_them
    JSON_TEXT | JSON_INTS,  # outcome
    st.integers(min_value=0, max_value=2**63) | st.floats(min_value=0, allow_infinity=False),  # latency_ns
    st.lists(USUAL_STAGE, max_size=4),
).map(list)
# Anything in any place: what the gateway never sends must still be sealed as before, or stop as before.
ODD_STAGE = st.tuples(JSON_VALUES, EFFECTS | JSON_VALUES, JSON_VALUES, JSON_VALUES, DETAILS | JSON_VALUES).map(list)
ODD_FACTS = st.tuples(
    *([JSON_VALUES] * 4),
    st.none() | JSON_OBJECTS | JSON_VALUES,
    JSON_VALUES,
    JSON_VALUES,
    st.integers(min_value=0, max_value=2**63) | JSON_VALUES,
    st.lists(USUAL_STAGE | ODD_STAGE, max_size=3) | JSON_VALUES,
).map(list)
FACTS = USUAL_FACTS | ODD_FACTS
LINES = st.one_of(
    USUAL_FACTS.map(orjson.dumps),  # mostly requests as the gateway sends them
    USUAL_FACTS.map(orjson.dumps),
    USUAL_FACTS.map(orjson.dumps),
    ODD_FACTS.map(orjson.dumps),
    FACTS.map(lambda facts: orjson.dumps(facts[:-1])),  # one fact short
    JSON_OBJECTS.map(orjson.dumps),  # plain records
    JSON_VALUES.map(orjson.dumps),
    st.binary(min_size=1, max_size=30).filter(lambda raw: b"\n" not in raw),
)


@PROPERTY
@given(st.lists(LINES, min_size=1, max_size=4), st.sampled_from([None, KEY]))
def test_generated_lines_seal_as_the_reference_does(lines: list[bytes], key: bytes | None) -> None:
    # Each list repeats its lines once more, so stage parts made for one line serve a later one.
    assert_same_trail(lines + lines, key)


@PROPERTY
@given(st.lists(USUAL_FACTS, min_size=1, max_size=3), st.integers(min_value=1, max_value=2000))
def test_generated_facts_rotate_as_the_reference_does(facts: list[list[Any]], rotate_bytes: int) -> None:
    assert_same_trail([orjson.dumps(f) for f in facts] * 3, KEY, rotate_bytes=rotate_bytes)


# ---- The sealer process and the verifier. ----


def test_a_trail_sealed_by_the_process_verifies_and_matches_the_reference(tmp_path: Path) -> None:
    alice = {"name": "alice", "groups": ["dev"], "session": "s1"}
    escaped = {"name": 'esc"aped\n', "groups": ["é"], "session": "s4"}
    facts = [
        (1.5, alice, "tools/call", "fs__read", {"path": "a"}, True, "complete", 1000, ALLOWED),
        (2.5, alice, "tools/call", "fs__write", {"path": "/etc"}, False, -32001, 2500, DENIED),
        (3.5, alice, "tools/list", None, None, True, "complete", 3, []),
        (4.5, escaped, "resources/read", "file:///x", None, True, "complete", 4, ALLOWED),
    ]
    for key in (None, KEY):
        path = tmp_path / f"{'keyed' if key else 'plain'}.jsonl"
        writer = AuditWriter(path, rotate_bytes=2000, key=key)
        for one in facts * 5:
            writer.write_call(one)
        writer.close()
        report = verify(trail_files(path), key)
        assert report.ok and report.records == sum(2 if one[-1] else 1 for one in facts) * 5 + 1, report.problems
        sealed = b"".join(member.read_bytes() for member in trail_files(path)).splitlines(keepends=True)
        expected = assert_same_trail([orjson.dumps(one) for one in facts * 5], key, rotate_bytes=2000)
        assert sealed[:-1] == expected  # all but the shutdown record, whose time is the writer's
        assert len(trail_files(path)) > 1  # rotation happened along the way
