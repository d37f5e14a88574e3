"""What each retriever reads of a tool: nested parameters and allowed values included, bounded."""

from __future__ import annotations

from bastion.search.index import ToolIndex
from bastion.search.text import (
    MAX_LEXICAL_CHOICES,
    MAX_PARAMETERS,
    MAX_SEMANTIC_CHOICES,
    Parameter,
    lexical_text,
    parameters,
    semantic_text,
)

from .conftest import CATALOG

APPLIANCE = {
    "name": "ThinQ_Connect",
    "description": "Send a command to an LG ThinQ appliance.",
    "inputSchema": {
        "type": "object",
        "properties": {
            "body": {
                "type": "object",
                "description": "Settings to apply.",
                "properties": {
                    "airConJobMode": {"type": "string", "description": "Job mode.", "enum": ["AIR_CLEAN", "COOL", "AIR_DRY"]},
                    "windStrength": {"type": "string", "description": "Air flow.", "enum": ["LOW", "HIGH", "MID"]},
                },
            },
            "rooms": {
                "type": "array",
                "items": {"type": "object", "properties": {"roomName": {"type": "string", "description": "Room."}}},
            },
            "days": {"type": "array", "items": {"type": "string", "enum": ["monday", "friday"]}},
        },
    },
}


def test_parameters_walk_nested_objects_and_array_items_in_schema_order():
    assert parameters(APPLIANCE) == [
        Parameter("body", "Settings to apply.", ()),
        Parameter("air con job mode", "Job mode.", ("air clean", "cool", "air dry")),
        Parameter("wind strength", "Air flow.", ("low", "high", "mid")),
        Parameter("rooms", "", ()),
        Parameter("room name", "Room.", ()),
        Parameter("days", "", ("monday", "friday")),
    ]


def test_both_texts_carry_nested_names_and_allowed_values():
    lexical, semantic = lexical_text(APPLIANCE), semantic_text(APPLIANCE)
    for words in ("wind strength", "air con job mode", "room name", "cool", "friday"):
        assert words in lexical and words in semantic
    assert "wind strength: Air flow. (low, high, mid)" in semantic


def test_a_nested_parameter_is_what_finds_the_tool():
    ix = ToolIndex(encoder=None)
    ix.build([*CATALOG, APPLIANCE])
    assert ix.search("set the wind strength to high", 1)[0][0] == "ThinQ_Connect"


def test_hostile_schemas_are_read_within_bounds():
    deep: dict = {"type": "object", "properties": {}}
    node = deep
    for level in range(200):
        child = {"type": "object", "description": f"level {level}", "properties": {}}
        node["properties"][f"p{level}"] = child
        node = child
    tool = {"name": "deep", "description": "", "inputSchema": deep}
    assert [p.name for p in parameters(tool)] == ["p0", "p1", "p2", "p3", "p4"]

    huge_enum = {"name": "e", "inputSchema": {"properties": {"mode": {"enum": [f"m{i}" for i in range(100_000)]}}}}
    assert len(parameters(huge_enum)[0].choices) == MAX_LEXICAL_CHOICES

    wide = {"name": "wide", "inputSchema": {"properties": {f"p{i}": {"enum": [f"v{j}" for j in range(500)]} for i in range(500)}}}
    found = parameters(wide)
    assert len(found) == MAX_PARAMETERS
    assert semantic_text(wide).count("v1,") == MAX_PARAMETERS  # each list cut at MAX_SEMANTIC_CHOICES
    assert f"v{MAX_SEMANTIC_CHOICES}," not in semantic_text(wide)

    odd = {"name": "odd", "inputSchema": {"properties": {"a": "not a schema", "b": {"enum": "x", "items": 3},
                                                          "c": {"enum": [1, None, "", "ok"], "description": 7}}}}
    assert parameters(odd) == [Parameter("a", "", ()), Parameter("b", "", ()), Parameter("c", "", ("ok",))]
    for broken in ({"name": "x", "inputSchema": "nope"}, {"name": "x", "inputSchema": {"properties": []}}, {"name": "x"}):
        assert parameters(broken) == []
        assert semantic_text(broken) == "x:"


def test_requests_split_sentences_sequencing_words_and_enumerations():
    from bastion.search.text import requests

    assert requests("Convert 5000 yen into dollars. Then, what is the weather in Paris?") == [
        "Convert 5000 yen into dollars", "what is the weather in Paris"]
    assert requests("First, book a flight to Rome; second, reserve a hotel near the station") == [
        "book a flight to Rome", "reserve a hotel near the station"]
    assert requests("List my open pull requests and also close the stale issues\nsend the summary by email") == [
        "List my open pull requests", "close the stale issues", "send the summary by email"]


def test_a_single_request_stays_whole_and_fragments_are_not_requests():
    from bastion.search.text import requests

    # "and" joins one request's own arguments: no split.
    assert requests("Get temperature and humidity for Boston and Rome") == ["Get temperature and humidity for Boston and Rome"]
    assert requests("Thanks. Find flights to Oslo. Second, 3.") == ["Find flights to Oslo"]
    assert requests("") == [] and requests("?!. ;") == []
    assert len(requests("東京の天気を教えてください。明日の予定も。")) <= 1  # no spaces: not split


def test_requests_are_bounded_for_long_messages():
    from bastion.search.text import MAX_REQUESTS, requests

    message = " ".join(f"Please fetch report number {i}." for i in range(500))
    parts = requests(message)
    assert len(parts) == MAX_REQUESTS and parts[0] == "Please fetch report number 0"
