"""What changed between two definitions of a tool, prompt or resource template, in words a person can check.

``describe_changes(before, after)`` walks both definitions and names each difference by what it means:
a new parameter, a new required one, an annotation that now claims the tool is harmless, a wider enum, a
description rewritten. The walk is exhaustive (every differing value yields a change), so a change that has no
special wording is still named by its place in the definition.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any, Mapping

# MCP's tool annotations and the value a client must assume when one is absent (2025-11-25 ToolAnnotations).
ANNOTATION_DEFAULTS = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True}
# The value of each hint that makes a tool look harmless: a server that moves a hint to it claims fewer effects,
# which a policy or a client may reward with fewer questions.
_HARMLESS = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
_CLAIMS = {"readOnlyHint": "now claims to be read-only", "destructiveHint": "now claims not to be destructive",
           "idempotentHint": "now claims to be idempotent", "openWorldHint": "now claims not to reach outside systems"}
_SCHEMAS = {"inputSchema": "parameter", "outputSchema": "output field"}
_ABSENT = object()  # a hint a definition does not give


@dataclass(frozen=True, slots=True)
class Change:
    """One difference: where it is (``inputSchema.required``) and what it means, in words."""

    where: str
    summary: str
    widens: bool = False  # accepts more input or claims fewer effects than before


def describe_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Change]:
    """Every difference between two definitions, in a stable order (by place in the definition)."""
    found: list[Change] = []
    _walk(before, after, (), found)
    return found


def summary(changes: list[Change], limit: int = 4) -> str:
    """The changes as one sentence part: ``description changed; new required parameter 'cc'``."""
    if not changes:
        return "no difference"
    said = "; ".join(change.summary for change in changes[:limit])
    more = len(changes) - limit
    return f"{said}; and {more} more" if more > 0 else said


def unified(before: Mapping[str, Any] | None, after: Mapping[str, Any], before_label: str, after_label: str) -> str:
    """A line diff of the two definitions as indented JSON with sorted keys, for ``bastion pins diff``; for one
    nested deeper than Python's json writes, the changes in words, one a line."""
    def lines(definition: Mapping[str, Any] | None) -> list[str]:
        if definition is None:
            return []
        return json.dumps(definition, indent=2, sort_keys=True, ensure_ascii=False).splitlines(keepends=True)

    try:
        text = "".join(difflib.unified_diff(lines(before), lines(after), before_label, after_label))
    except RecursionError:
        changes = describe_changes(before or {}, after)
        return "".join([f"--- {before_label}\n+++ {after_label}\n", *(f"! {c.where}: {c.summary}\n" for c in changes)]
                       ) if changes else ""
    return text if text.endswith("\n") or not text else text + "\n"


def same(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1`` and ``1`` is not ``1.0``, as they are not to a schema validator.

    A loop, not recursion: a server's definition may nest as deep as Bastion reads its frames (1,024 levels), past
    Python's recursion limit."""
    pending = [(a, b)]
    while pending:
        a, b = pending.pop()
        if type(a) is not type(b):
            return False
        if isinstance(a, dict):
            if a.keys() != b.keys():
                return False
            pending.extend((a[k], b[k]) for k in a)
        elif isinstance(a, list):
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b))
        elif a != b:
            return False
    return True


_DEEPEST = 64  # levels of a definition the walk names places in; a difference further down is named here
_TOO_DEEP = "(nested too deeply to show)"


# ------------------------------------------------------------------------------------------ the walk
def _walk(a: Any, b: Any, path: tuple[Any, ...], found: list[Change]) -> None:
    if same(a, b):
        return
    if len(path) >= _DEEPEST:
        found.append(Change(_where(path), f"{_where(path)} changed"))
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            here = (*path, key)
            if key not in b:
                found.append(_removed(here, a[key]))
            elif key not in a:
                found.append(_added(here, b[key]))
            else:
                _walk(a[key], b[key], here, found)
        return
    if isinstance(a, list) and isinstance(b, list):
        if _named_items(a) and _named_items(b):
            _walk_named(a, b, path, found)
            return
        if _scalars(a) and _scalars(b):
            found.extend(_set_change(path, a, b))
            return
    found.append(_replaced(path, a, b))


def _walk_named(a: list[dict[str, Any]], b: list[dict[str, Any]], path: tuple[Any, ...],
                found: list[Change]) -> None:
    """Lists of named objects (a prompt's arguments) are compared by name, not by position."""
    before = {item["name"]: item for item in a}
    after = {item["name"]: item for item in b}
    for name in sorted(set(before) | set(after)):
        here = (*path, name)
        if name not in after:
            found.append(Change(_where(here), f"{_subject(here)} removed"))
        elif name not in before:
            required = after[name].get("required") is True
            found.append(Change(_where(here), f"new {'required ' if required else ''}{_subject(here)}", widens=True))
        else:
            _walk(before[name], after[name], here, found)
    if [i["name"] for i in a] != [i["name"] for i in b] and set(before) == set(after):
        found.append(Change(_where(path), f"order of {_where(path)} changed"))


def _added(path: tuple[Any, ...], value: Any) -> Change:
    where = _where(path)
    key = path[-1]
    if _is_property(path):
        return Change(where, f"new {_subject(path)}", widens=True)
    if key == "required" and _schema_of(path):
        names = value if isinstance(value, list) else []
        return Change(where, "; ".join(f"new required {_subject((*path[:-1], 'properties', n))}" for n in names)
                      or f"{where} added", widens=bool(names))
    if len(path) == 2 and path[0] == "annotations" and key in ANNOTATION_DEFAULTS:
        return _hint(path, _ABSENT, value, "added")
    if key == "annotations" and len(path) == 1 and isinstance(value, dict):
        parts = [_hint((key, hint), _ABSENT, v, "added") for hint, v in sorted(value.items())
                 if hint in ANNOTATION_DEFAULTS]
        return Change(where, "annotations added" + (f" ({'; '.join(p.summary for p in parts)})" if parts else ""),
                      widens=any(p.widens for p in parts))
    if key in _SCHEMAS and len(path) == 1:
        return Change(where, f"{key} added")
    return Change(where, f"{where} added", widens=key == "additionalProperties" and value is not False)


def _removed(path: tuple[Any, ...], value: Any) -> Change:
    where = _where(path)
    key = path[-1]
    if _is_property(path):
        return Change(where, f"{_subject(path)} removed")
    if key == "required" and _schema_of(path):
        names = value if isinstance(value, list) else []
        return Change(where, "; ".join(f"{_subject((*path[:-1], 'properties', n))} no longer required"
                                       for n in names) or f"{where} removed", widens=bool(names))
    if len(path) == 2 and path[0] == "annotations" and key in ANNOTATION_DEFAULTS:
        return _hint(path, value, _ABSENT, "removed")
    if key == "annotations" and len(path) == 1 and isinstance(value, dict):
        parts = [_hint((key, hint), v, _ABSENT, "removed") for hint, v in sorted(value.items())
                 if hint in ANNOTATION_DEFAULTS]
        return Change(where, "annotations removed" + (f" ({'; '.join(p.summary for p in parts)})" if parts else ""),
                      widens=any(p.widens for p in parts))
    # A limit or a closed door that goes away lets more through.
    widens = key in _LIMITS or (key == "additionalProperties" and value is False)
    return Change(where, f"{where} removed" + (" (widened)" if widens else ""), widens=widens)


_LIMITS = frozenset({"maxLength", "minLength", "maximum", "minimum", "exclusiveMaximum", "exclusiveMinimum",
                     "maxItems", "minItems", "pattern", "enum", "const", "format", "maxProperties"})


def _replaced(path: tuple[Any, ...], a: Any, b: Any) -> Change:
    where = _where(path)
    key = path[-1] if path else ""
    if len(path) == 2 and path[0] == "annotations" and key in ANNOTATION_DEFAULTS:
        return _hint(path, a, b, "changed")
    if path in (("description",), ("title",)) or key == "description":
        return Change(where, f"{where} changed")
    if key == "additionalProperties":
        widens = a is False and b is not False
        return Change(where, f"{where}: {_short(a)} → {_short(b)}" + (" (accepts parameters it did not declare)"
                                                                        if widens else ""), widens=widens)
    return Change(where, f"{where}: {_short(a)} → {_short(b)}")


def _set_change(path: tuple[Any, ...], a: list[Any], b: list[Any]) -> list[Change]:
    where = _where(path)
    key = path[-1] if path else ""
    # Scalars keyed by type and value (``same``'s equality), so that an enum of thousands is compared in linear
    # time: compared pairwise, two enums of 3,000 took 2 s.
    had, has = {(type(x), x) for x in a}, {(type(y), y) for y in b}
    gained = [x for x in b if (type(x), x) not in had]
    lost = [x for x in a if (type(x), x) not in has]
    if key == "required" and _schema_of(path):
        changes = [Change(where, f"new required {_subject((*path[:-1], 'properties', n))}", widens=True)
                   for n in gained]
        changes += [Change(where, f"{_subject((*path[:-1], 'properties', n))} no longer required", widens=True)
                    for n in lost]
        return changes or [Change(where, f"order of {where} changed")]
    if not gained and not lost:
        return [Change(where, f"order of {where} changed")]
    parts = []
    if gained:
        parts.append("gains " + ", ".join(_short(x) for x in gained))
    if lost:
        parts.append("loses " + ", ".join(_short(x) for x in lost))
    widens = bool(gained) and key in ("enum", "type")
    return [Change(where, f"{where} {' and '.join(parts)}" + (" (widened)" if widens else ""), widens=widens)]


def _hint(path: tuple[Any, ...], a: Any, b: Any, how: str) -> Change:
    hint = path[-1]
    harmless = _HARMLESS[hint]
    # Absent means the spec's default; a value that is not a boolean counts as absent.
    was = a if isinstance(a, bool) else ANNOTATION_DEFAULTS[hint]
    now = b if isinstance(b, bool) else ANNOTATION_DEFAULTS[hint]
    widens = now == harmless and was != harmless
    words = f"annotation {hint} {how}: {_short(a)} → {_short(b)}"
    return Change(_where(path), words + (f" ({_CLAIMS[hint]})" if widens else ""), widens=widens)


# ------------------------------------------------------------------------------------------ naming places
def _is_property(path: tuple[Any, ...]) -> bool:
    return len(path) >= 3 and path[-2] == "properties" and path[0] in _SCHEMAS


def _schema_of(path: tuple[Any, ...]) -> bool:
    return bool(path) and path[0] in _SCHEMAS


def _subject(path: tuple[Any, ...]) -> str:
    """``("inputSchema", "properties", "a", "properties", "b")`` → ``parameter 'a.b'``; a prompt's argument."""
    if path and path[0] in _SCHEMAS:
        names = [str(path[i + 1]) for i in range(1, len(path) - 1) if path[i] == "properties"]
        return f"{_SCHEMAS[path[0]]} '{'.'.join(names)}'"
    if path and path[0] == "arguments":
        return f"argument '{path[-1]}'"
    return _where(path)


def _where(path: tuple[Any, ...]) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path) or "(whole definition)"


def _named_items(items: list[Any]) -> bool:
    names = [item.get("name") for item in items if isinstance(item, dict)]
    return (len(names) == len(items) and all(isinstance(n, str) for n in names) and len(set(names)) == len(names))


def _scalars(items: list[Any]) -> bool:
    return all(isinstance(item, (str, int, float, bool)) or item is None for item in items)


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = "absent" if value is _ABSENT else json.dumps(value, ensure_ascii=False, sort_keys=True)
    except RecursionError:  # deeper than Python's json writes
        text = _TOO_DEEP
    return text if len(text) <= limit else text[: limit - 1] + "…"
