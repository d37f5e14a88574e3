"""Byte-stable tool lists, so a model provider's prompt cache keeps hitting.

The same set of tools always serialises to the same bytes: keys sorted at every depth,
tools ordered by name, no whitespace; the order servers answered in, dict insertion order
and restarts make no difference.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import orjson

_OPTIONS = orjson.OPT_SORT_KEYS


def _tool_sort_key(tool: Mapping[str, Any]) -> tuple[str, bytes]:
    # Name first; the full canonical bytes break ties so even duplicates order stably.
    return (str(tool.get("name", "")), orjson.dumps(tool, option=_OPTIONS))


def canonical_tool_list(tools: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tools in canonical order, each rebuilt with recursively sorted keys."""
    ordered = sorted(tools, key=_tool_sort_key)
    return [orjson.loads(orjson.dumps(t, option=_OPTIONS)) for t in ordered]


def canonical_tool_bytes(tool: Mapping[str, Any]) -> bytes:
    return orjson.dumps(tool, option=_OPTIONS)


def canonical_tools_bytes(tools: Iterable[Mapping[str, Any]]) -> bytes:
    """``[tool, ...]`` as compact JSON with sorted keys and tools ordered by name."""
    return orjson.dumps(sorted(tools, key=_tool_sort_key), option=_OPTIONS)
