"""The pins diff (``pin_diff``): what changed between two definitions of a tool, as pinning tells a person.

Definitions are drawn as a server could send them: any JSON, as deep as Bastion reads a server's frame (orjson's
bound, 1,024 levels), and lists as long as a schema's enum may be.

Oracle: a definition compared with itself has no change, and two have a change exactly when they differ as JSON
(``same``); every change names a place and says something; the summary and the unified diff are text; nothing
raises, and the time is bounded per element compared."""

from __future__ import annotations

import json
import time
from typing import Any

import atheris

from bastion.guardrails.pin_diff import Change, describe_changes, same, summary, unified
from tests.fuzz.common import json_value

DEFINITION_KEYS = ["name", "description", "inputSchema", "outputSchema", "annotations", "arguments", "title"]


def _definition(fdp: atheris.FuzzedDataProvider) -> dict[str, Any]:
    definition: dict[str, Any] = {"name": "t"}
    for _ in range(fdp.ConsumeIntInRange(0, 4)):
        definition[fdp.PickValueInList(DEFINITION_KEYS)] = json_value(fdp, 1)
    return definition


def _mutated(fdp: atheris.FuzzedDataProvider, value: Any) -> Any:
    if isinstance(value, dict) and value and fdp.ConsumeBool():
        key = fdp.PickValueInList(sorted(value))
        return {**value, key: _mutated(fdp, value[key])}
    if isinstance(value, list) and value and fdp.ConsumeBool():
        at = fdp.ConsumeIntInRange(0, len(value) - 1)
        return [*value[:at], _mutated(fdp, value[at]), *value[at + 1:]]
    return json_value(fdp, 3) if fdp.ConsumeBool() else value


def _deepened(definition: dict[str, Any], levels: int) -> dict[str, Any]:
    inner: Any = definition.get("inputSchema")
    for _ in range(levels):
        inner = {"type": "object", "properties": {"p": inner}}
    return {**definition, "inputSchema": inner}


def _text(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True)
    except RecursionError:
        return "(nested too deeply to show)"


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    before = _definition(fdp)
    after = _mutated(fdp, before) if fdp.ConsumeBool() else _definition(fdp)
    if not isinstance(after, dict):  # a definition is an object
        after = {"name": "t", "description": after}
    levels = fdp.PickValueInList([0, 0, 0, 5, 100, 250, 330])  # 3 levels each: up to orjson's 1,024
    width = fdp.PickValueInList([0, 0, 10, 3000])
    if width:
        before = {**before, "inputSchema": {"enum": list(range(width))}}
        after = {**after, "inputSchema": {"enum": list(range(1, width + 1))}}
    before, after = _deepened(before, levels), _deepened(after, levels)
    started = time.perf_counter()
    assert describe_changes(before, before) == []
    changes = describe_changes(before, after)
    assert all(type(c) is Change and c.where and c.summary for c in changes), changes
    assert bool(changes) == (not same(before, after)), (before, after)
    assert isinstance(summary(changes), str)
    spent = time.perf_counter() - started
    elements = len(_text(before)) + len(_text(after))
    assert spent < 0.3 + 2e-5 * elements, (spent, elements)
    # The line diff is `bastion pins diff`'s, never the gateway's: Python's json writes a deep definition in time
    # growing with depth times size, so it is checked for what it says, not timed.
    text = unified(before, after, "pinned", "now")
    assert isinstance(text, str)
    if "\n! " in text:  # too deep for a line diff: the changes in words
        assert text.count("\n! ") == len(changes), text
    else:
        assert (text == "") == (_text(before) == _text(after)), text
