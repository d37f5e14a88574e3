"""search_tools / call_tool results built from a real index."""

from __future__ import annotations

import orjson
import pytest

from bastion.search.index import ToolIndex
from bastion.search.meta_tools import (
    CALL_TOOL,
    SEARCH_TOOL,
    ResolvedCall,
    call_tool,
    meta_tool_definitions,
    search_tools,
)

from .conftest import CATALOG


@pytest.fixture
def index():
    ix = ToolIndex(encoder=None)
    ix.build(CATALOG)
    return ix


def test_definitions_are_valid_tool_shapes_and_copies():
    defs = meta_tool_definitions()
    assert [d["name"] for d in defs] == ["search_tools", "call_tool"]
    assert SEARCH_TOOL["inputSchema"]["required"] == ["query"]
    assert CALL_TOOL["inputSchema"]["required"] == ["name"]
    defs[0]["name"] = "prefixed__search_tools"
    assert SEARCH_TOOL["name"] == "search_tools"


def test_search_returns_names_descriptions_and_schemas(index):
    result = search_tools(index, {"query": "open a github issue", "k": 2})
    assert result["isError"] is False
    found = result["structuredContent"]["tools"]
    assert len(found) == 2 and found[0]["name"] == "create_issue"
    assert found[0]["description"] == CATALOG[0]["description"]
    assert found[0]["inputSchema"] == CATALOG[0]["inputSchema"]
    assert orjson.loads(result["content"][0]["text"]) == result["structuredContent"]


def test_search_never_finds_what_policy_hides(index):
    hidden = {"create_issue"}
    visible = {t["name"]: t for t in CATALOG if t["name"] not in hidden}
    result = search_tools(index, {"query": "open a github issue", "k": 8}, visible)
    names = [t["name"] for t in result["structuredContent"]["tools"]]
    assert "create_issue" not in names and names[0] == "list_pull_requests"


@pytest.mark.parametrize("args", [{}, {"query": ""}, {"query": "x", "k": 0}, {"query": "x", "k": 21}, {"query": "x", "k": True}, {"query": 3}])
def test_search_rejects_bad_arguments(index, args):
    result = search_tools(index, args)
    assert result["isError"] is True and "search_tools" in result["content"][0]["text"]


def test_call_tool_resolves_permitted_tools(index):
    resolved = call_tool(index, {"name": "get_weather", "arguments": {"city": "Oslo"}})
    assert resolved == ResolvedCall(name="get_weather", arguments={"city": "Oslo"})
    assert call_tool(index, {"name": "get_weather"}) == ResolvedCall("get_weather", {})


def test_call_tool_hides_existence_of_forbidden_tools(index):
    forbidden = call_tool(index, {"name": "send_email", "arguments": {}},
                          {t["name"]: t for t in CATALOG if t["name"] != "send_email"})
    missing = call_tool(index, {"name": "no_such_tool", "arguments": {}})
    assert forbidden["isError"] and missing["isError"]
    assert forbidden["content"][0]["text"].replace("send_email", "X") == missing["content"][0]["text"].replace("no_such_tool", "X")
    assert call_tool(index, {"name": "call_tool", "arguments": {}})["isError"]
    assert call_tool(index, {"name": "get_weather", "arguments": [1]})["isError"]


def test_search_mode_listing_is_canonical_and_follows_policy(index):
    from bastion.search.canonical import canonical_tools_bytes
    from bastion.search.meta_tools import search_mode_listing

    listing = search_mode_listing(index, always_listed=["read_file", "not_a_tool"], discovered=["get_weather", "send_email"])
    assert [t["name"] for t in listing] == ["call_tool", "get_weather", "read_file", "search_tools", "send_email"]
    assert canonical_tools_bytes(listing) == canonical_tools_bytes(reversed(listing))
    hidden = search_mode_listing(index, ["read_file"], ["get_weather"],
                                 {t["name"]: t for t in CATALOG if t["name"] != "get_weather"})
    assert [t["name"] for t in hidden] == ["call_tool", "read_file", "search_tools"]


def test_what_is_visible_now_wins_over_an_index_that_has_not_caught_up(index):
    # A server changed a tool and added one; the index has not re-indexed yet.
    renamed = {**CATALOG[0], "description": "Open an issue (v2 of this tool)."}
    added = {"name": "close_issue", "description": "Close an issue.", "inputSchema": {"type": "object"}}
    visible = {t["name"]: t for t in [renamed, *CATALOG[1:], added]}
    found = search_tools(index, {"query": "open a github issue", "k": 1}, visible)["structuredContent"]["tools"]
    assert found == [{"name": "create_issue", "description": "Open an issue (v2 of this tool).",
                      "inputSchema": renamed["inputSchema"]}]
    assert call_tool(index, {"name": "close_issue"}, visible) == ResolvedCall("close_issue", {})
    from bastion.search.meta_tools import search_mode_listing

    listed = search_mode_listing(index, ["close_issue"], ["create_issue"], visible)
    assert {t["name"]: t.get("description") for t in listed if t["name"] in visible} == {
        "close_issue": "Close an issue.", "create_issue": "Open an issue (v2 of this tool)."}
