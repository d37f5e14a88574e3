"""The pins diff takes any definition a server can send: as deep as Bastion reads a server's frame (orjson's bound,
1,024 levels), with enums of thousands of values, in time proportional to its size. Found by
tests/fuzz/fuzz_pin_diff.py: 600 levels raised RecursionError out of the comparison, and two enums of 3,000
values took 2 s of the event loop."""

from __future__ import annotations

import time
from typing import Any

import orjson

from bastion.guardrails.pin_diff import describe_changes, same, summary, unified


def _deep(levels: int, leaf: Any) -> dict[str, Any]:
    schema: Any = leaf
    for _ in range(levels):
        schema = {"type": "object", "properties": {"p": schema}}
    return {"name": "t", "inputSchema": schema}


def _as_a_server_sends_it(levels: int, leaf: int) -> dict[str, Any]:
    frame = b'{"name":"t","inputSchema":' + b'{"properties":{"p":' * levels + str(leaf).encode() + b"}}" * levels + b"}"
    return orjson.loads(frame)  # orjson reads up to 1,024 levels: the frames of servers have no lower bound


def test_a_definition_nested_as_deep_as_a_server_frame_is_compared() -> None:
    before, after = _as_a_server_sends_it(510, 1), _as_a_server_sends_it(510, 2)
    assert same(before, before) and not same(before, after)
    changes = describe_changes(before, after)
    assert len(changes) == 1 and changes[0].summary.endswith(" changed")
    assert summary(changes)
    assert unified(before, after, "pinned", "now")  # a line diff, or a line saying it is too deep to show


def test_a_difference_past_the_walks_depth_is_named_where_the_walk_stops() -> None:
    [change] = describe_changes(_deep(300, 1), _deep(300, 2))
    assert change.where.startswith("inputSchema.properties.p.properties.p")


def test_two_long_enums_are_compared_in_linear_time() -> None:
    before = {"name": "t", "inputSchema": {"enum": list(range(20_000))}}
    after = {"name": "t", "inputSchema": {"enum": [*range(1, 20_000), "x", True]}}
    started = time.perf_counter()
    [change] = describe_changes(before, after)
    assert time.perf_counter() - started < 1.0  # pairwise: minutes
    assert change.summary == 'inputSchema.enum gains "x", true and loses 0 (widened)'
