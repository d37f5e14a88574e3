"""The walker over what reaches the model: every scanner reads the same strings, and a replacement keeps the
message's structure."""

from __future__ import annotations

import copy

from bastion.guardrails.content import error_slots, text_slots


def _wheres(method, message):
    return [slot.where for slot in text_slots(method, message)]


def test_a_tool_result_yields_text_embedded_resources_links_and_structured_content():
    result = {
        "content": [
            {"type": "text", "text": "first"},
            {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "embedded", "mimeType": "text/plain"}},
            {"type": "resource", "resource": {"uri": "file:///b", "blob": "aGVsbG8="}},
            {"type": "resource_link", "uri": "file:///c", "name": "c", "description": "a link"},
        ],
        "structuredContent": {"rows": [{"name": "x", "n": 1}, {"name": "y", "tags": ["p", "q"]}], "note": "n"},
        "isError": False,
    }
    assert _wheres("tools/call", result) == [
        "content[0].text",
        "content[2].resource.uri", "content[2].resource.text",
        "content[3].resource.uri",
        "content[4].uri", "content[4].name", "content[4].description",
        "structuredContent.rows[0].name", "structuredContent.rows[1].name",
        "structuredContent.rows[1].tags[0]", "structuredContent.rows[1].tags[1]",
        "structuredContent.note",
    ]


def test_replace_writes_back_in_place_and_keeps_the_structure():
    result = {"content": [{"type": "text", "text": "key=SECRET"}], "structuredContent": {"a": ["SECRET", 3]}}
    expected = copy.deepcopy(result)
    expected["content"][0]["text"] = "key=[redacted]"
    expected["structuredContent"]["a"][0] = "[redacted]"
    for slot in text_slots("tools/call", result):
        slot.replace(slot.text.replace("SECRET", "[redacted]"))
    assert result == expected


def test_resource_contents_prompt_messages_and_sampling_requests():
    read = {"contents": [{"uri": "file:///a", "text": "t", "mimeType": "text/plain"}, {"uri": "x", "blob": "AA=="}]}
    assert _wheres("resources/read", read) == ["contents[0].text"]
    prompt = {"description": "d", "messages": [
        {"role": "user", "content": {"type": "text", "text": "hello"}},
        {"role": "user", "content": {"type": "resource", "resource": {"uri": "u", "text": "r"}}},
    ]}
    assert _wheres("prompts/get", prompt) == [
        "description", "messages[0].content.text", "messages[1].content.resource.uri",
        "messages[1].content.resource.text"]
    sampling = {"systemPrompt": "s", "maxTokens": 10, "messages": [
        {"role": "user", "content": {"type": "text", "text": "one"}},
        {"role": "user", "content": [{"type": "text", "text": "two"}, {"type": "image", "data": "AA=="}]},
    ]}
    assert _wheres("sampling/createMessage", sampling) == [
        "systemPrompt", "messages[0].content.text", "messages[1].content[0].text"]


def test_errors_yield_the_message_and_the_strings_of_data():
    error = {"code": -32000, "message": "boom", "data": {"detail": "more", "n": 2}}
    assert [slot.where for slot in error_slots(error)] == ["error.message", "error.data.detail"]


def test_input_required_results_and_odd_shapes_yield_nothing_and_never_fail():
    assert _wheres("tools/call", {"resultType": "input_required", "inputRequests": {"a": {"message": "m"}}}) == []
    assert _wheres("tools/call", {"content": "not a list", "structuredContent": None}) == []
    assert _wheres("tools/call", None) == []
    assert _wheres("prompts/get", {"messages": [None, {"content": 3}]}) == []


def test_deep_nesting_does_not_exhaust_the_stack():
    nested: dict = {"leaf": "deep"}
    for _ in range(5000):
        nested = {"n": nested}
    slots = list(text_slots("tools/call", {"content": [], "structuredContent": nested}))
    assert [slot.text for slot in slots] == ["deep"]


def test_a_string_of_structured_content_knows_the_name_it_is_filed_under():
    result = {"content": [{"type": "text", "text": "t"}], "structuredContent": {"db": {"password": "p"}, "l": ["x"]}}
    assert [(slot.where, slot.name) for slot in text_slots("tools/call", result)] == [
        ("content[0].text", None), ("structuredContent.db.password", "password"), ("structuredContent.l[0]", None)]
