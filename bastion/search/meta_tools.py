"""The two tools a client sees in search mode, and pure functions that answer them.

``search_tools`` finds the tools a task needs; ``call_tool`` invokes any permitted tool by
name. The gateway prefixes/routes these names and performs the actual call; what is here
only validates arguments and builds MCP ``CallToolResult`` dicts from a :class:`ToolIndex`.
Both take ``visible``, the tools the caller may see now, so a tool that policy hides from a
client is never found by its searches nor callable through ``call_tool``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Container, Iterable, Mapping, Sequence

import orjson

from bastion.search.canonical import canonical_tool_list
from bastion.search.index import ToolIndex

SEARCH_TOOL_NAME = "search_tools"
CALL_TOOL_NAME = "call_tool"
DEFAULT_K = 5
MAX_K = 20

_FOUND_TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "title": {"type": "string"},
        "description": {"type": "string"},
        "inputSchema": {"type": "object"},
    },
    "required": ["name", "inputSchema"],
}

SEARCH_TOOL: dict[str, Any] = {
    "name": SEARCH_TOOL_NAME,
    "title": "Search tools",
    "description": (
        "Find the tools that can do a task. Describe the task in plain words; the answer lists the "
        "best-matching tools with their names, descriptions and input schemas. Then invoke one with "
        f"{CALL_TOOL_NAME} (or directly, if it has been added to your tool list)."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What you want to do, e.g. 'create a GitHub issue'."},
            "k": {"type": "integer", "minimum": 1, "maximum": MAX_K, "default": DEFAULT_K,
                  "description": "How many tools to return."},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    "outputSchema": {
        "type": "object",
        "properties": {"tools": {"type": "array", "items": _FOUND_TOOL_SCHEMA}},
        "required": ["tools"],
    },
    "annotations": {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False},
}

CALL_TOOL: dict[str, Any] = {
    "name": CALL_TOOL_NAME,
    "title": "Call a tool",
    "description": (
        f"Invoke a tool found with {SEARCH_TOOL_NAME}, by its exact name, with arguments that match "
        "its input schema. Returns that tool's result."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": f"The tool's exact name as {SEARCH_TOOL_NAME} returned it."},
            "arguments": {"type": "object", "description": "The tool's arguments.", "default": {}},
        },
        "required": ["name"],
        "additionalProperties": False,
    },
}


def meta_tool_definitions() -> list[dict[str, Any]]:
    """Fresh copies, so a caller that prefixes names cannot alter the originals."""
    return [copy.deepcopy(SEARCH_TOOL), copy.deepcopy(CALL_TOOL)]


def error_result(message: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": message}], "isError": True}


def _describe(tool: Mapping[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {"name": tool["name"]}
    if isinstance(tool.get("title"), str):
        found["title"] = tool["title"]
    found["description"] = tool.get("description") or ""
    found["inputSchema"] = tool.get("inputSchema") or {"type": "object"}
    return found


def _seen(index: ToolIndex, visible: Mapping[str, Mapping[str, Any]] | None) -> Any:
    """Where tools are looked up by name: what the caller sees now, or else the index (both answer
    ``in`` and ``get``)."""
    return index if visible is None else visible


def search_tools(
    index: ToolIndex,
    arguments: Mapping[str, Any] | None,
    visible: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ``CallToolResult`` for a ``search_tools`` call: JSON text plus structured content.

    ``visible``: the tools the caller may see now, by name (default: every indexed tool). Only
    these are found, each described as given there: the index ranks, but may not have caught up
    with a change to the catalog yet.
    """
    args = arguments or {}
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        return error_result("search_tools needs 'query': a non-empty string describing the task")
    k = args.get("k", DEFAULT_K)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        return error_result(f"search_tools 'k' must be an integer from 1 to {MAX_K}")
    seen = _seen(index, visible)
    tools = []
    for name, _score in index.search(query, k, allowed=None if visible is None else visible.keys()):
        tool = seen.get(name)
        if tool is not None:
            tools.append(_describe(tool))
    structured = {"tools": tools}
    text = orjson.dumps(structured, option=orjson.OPT_SORT_KEYS).decode()
    return {"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": False}


@dataclass(frozen=True)
class ResolvedCall:
    """A ``call_tool`` request the gateway may forward: the real tool and its arguments."""

    name: str
    arguments: dict[str, Any]


def call_tool(
    index: ToolIndex,
    arguments: Mapping[str, Any] | None,
    visible: Mapping[str, Mapping[str, Any]] | None = None,
    withheld: Container[str] = frozenset(),
) -> ResolvedCall | dict[str, Any]:
    """Validate a ``call_tool`` call: the call to forward, or an error ``CallToolResult``.

    ``visible``: the tools the caller may see now, by name (default: every indexed tool). A
    tool that exists but is not visible gets the same answer as one that does not exist, so
    ``call_tool`` cannot be used to probe for hidden tools; except a tool in ``withheld``, which a
    screen left out of the caller's list and refuses to call itself, saying why (a pinned
    definition that changed: the person needs to know to review it). Its call is forwarded to be
    refused there, as a direct ``tools/call`` of it is.
    """
    args = arguments or {}
    name = args.get("name")
    if not isinstance(name, str) or not name:
        return error_result("call_tool needs 'name': the exact name of a tool found with search_tools")
    inner = args.get("arguments", {})
    if inner is None:
        inner = {}
    if not isinstance(inner, dict):
        return error_result("call_tool 'arguments' must be an object")
    if name in (SEARCH_TOOL_NAME, CALL_TOOL_NAME) or (name not in _seen(index, visible) and name not in withheld):
        return error_result(f"unknown tool {name!r}; use search_tools to find available tools")
    return ResolvedCall(name=name, arguments=dict(inner))


def with_starting(result: dict[str, Any], starting: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """A meta-tool's ``CallToolResult`` that says which servers are still starting and what each is doing (their
    tools are found once they join), in its text and its structured content; as it was when none is."""
    if not starting:
        return result
    pending = [{"server": server, "doing": doing} for server, doing in starting]
    note = ("servers still starting, whose tools are not found yet (search again once they join): "
            + "; ".join(f"{server}: {doing}" for server, doing in starting))
    structured = result.get("structuredContent")
    if isinstance(structured, dict):  # a search's answer: its text is its structured content as JSON
        structured = {**structured, "starting": pending}
        text = orjson.dumps(structured, option=orjson.OPT_SORT_KEYS).decode()
        return {**result, "structuredContent": structured, "content": [{"type": "text", "text": text}]}
    return {**result, "content": [*result.get("content", []), {"type": "text", "text": note}]}


def search_mode_listing(
    index: ToolIndex,
    always_listed: Iterable[str] = (),
    discovered: Iterable[str] = (),
    visible: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The ``tools/list`` answer for a search-mode client, in canonical order.

    The two meta-tools, the configured always-listed tools, and (for clients that support
    ``list_changed``) the tools its searches found so far, as ``visible`` gives them (default:
    every indexed tool). Given afresh on every call, so a tool that policy hides later drops
    out of the list too.
    """
    seen = _seen(index, visible)
    names = set(always_listed) | set(discovered)
    listed = [dict(tool) for name in names if (tool := seen.get(name)) is not None]
    return canonical_tool_list([*meta_tool_definitions(), *listed])
