"""The walker over what reaches the client: every scanner reads the same strings (keys and decoded payloads too), a
replacement keeps the message's structure, and its bounds fail closed."""

from __future__ import annotations

import base64
import copy

from bastion.guardrails import content
from bastion.guardrails.content import UNSCANNABLE, copy_tree, decode_base64, error_slots, text_slots


def _wheres(method, message):
    return [slot.where for slot in text_slots(method, message)]


def test_a_tool_result_yields_every_string_keys_and_decoded_payloads():
    result = {
        "content": [
            {"type": "text", "text": "first", "annotations": {"audience": ["user"]}, "_meta": {"note": "m"}},
            {"type": "image", "data": "aGVsbG8gd29ybGQ=", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "embedded", "mimeType": "text/plain"}},
            {"type": "resource", "resource": {"uri": "file:///b", "blob": "aGVsbG8gd29ybGQ="}},
        ],
        "structuredContent": {"rows": [{"name": "x", "n": 1}], "custom-key": "v"},
        "_meta": {"progressToken": "opaque", "trace": "t"},
        "isError": False,
    }
    assert _wheres("tools/call", result) == [
        "content[0].type", "content[0].text", "content[0].annotations.audience[0]", "content[0]._meta.note (key)",
        "content[0]._meta.note",
        "content[1].type", "content[1].data", "content[1].data (decoded)", "content[1].mimeType",
        "content[2].type", "content[2].resource.uri", "content[2].resource.text", "content[2].resource.mimeType",
        "content[3].type", "content[3].resource.uri", "content[3].resource.blob", "content[3].resource.blob (decoded)",
        "structuredContent.rows (key)", "structuredContent.rows[0].name", "structuredContent.rows[0].n (key)",
        "structuredContent.custom-key (key)", "structuredContent.custom-key",
        "_meta.trace (key)", "_meta.trace",
    ]
    decoded = [slot for slot in text_slots("tools/call", result) if slot.decoded]
    assert [slot.data for slot in decoded] == [b"hello world", b"hello world"]


def test_replace_writes_back_in_place_and_keeps_the_structure():
    result = {"content": [{"type": "text", "text": "key=SECRET"}], "structuredContent": {"a": ["SECRET", 3]}}
    expected = copy.deepcopy(result)
    expected["content"][0]["text"] = "key=[redacted]"
    expected["structuredContent"]["a"][0] = "[redacted]"
    for slot in text_slots("tools/call", result):
        slot.replace(slot.text.replace("SECRET", "[redacted]"))
    assert result == expected


def test_a_renamed_key_keeps_its_place_and_its_value_stays_reachable():
    result = {"structuredContent": {"first": 1, "SECRETKEY": "SECRETVALUE", "last": 2}}
    slots = list(text_slots("tools/call", result))
    for slot in slots:  # the key is renamed before its value is replaced, as a scanner does
        slot.replace(slot.text.replace("SECRET", "X-"))
    assert list(result["structuredContent"].items()) == [("first", 1), ("X-KEY", "X-VALUE"), ("last", 2)]


def test_two_keys_renamed_alike_stay_two_keys():
    holder = {"structuredContent": {"AAAAAAA1": 1, "AAAAAAA2": 2}}
    for slot in text_slots("tools/call", holder):
        slot.replace("[redacted]")
    assert holder["structuredContent"] == {"[redacted]": 1, "[redacted] #2": 2}


def test_a_decoded_payload_is_encoded_again_in_its_own_alphabet():
    standard = base64.b64encode(b"\xfb\xff token=SECRET").decode()
    urlsafe = base64.urlsafe_b64encode(b"\xfb\xff token=SECRET").decode().rstrip("=")
    result = {"content": [{"type": "image", "data": standard, "mimeType": "image/png"},
                          {"type": "audio", "data": urlsafe, "mimeType": "audio/wav"}]}
    for slot in text_slots("tools/call", result):
        if slot.decoded:
            slot.replace_data(slot.data.replace(b"SECRET", b"[r]"))
    assert base64.b64decode(result["content"][0]["data"]) == b"\xfb\xff token=[r]"
    assert "+" in result["content"][0]["data"] or "/" in result["content"][0]["data"]
    assert base64.urlsafe_b64decode(result["content"][1]["data"] + "==") == b"\xfb\xff token=[r]"
    assert "=" not in result["content"][1]["data"]


def test_payloads_that_do_not_decode_or_are_too_large_are_read_as_text_only():
    assert decode_base64("not base64 at all!") is None
    assert decode_base64("aGVsbG8") == b"hello"  # padding left off
    assert decode_base64("A" * (content.MAX_DECODED_BLOB * 2)) is None
    big = {"contents": [{"uri": "u", "blob": "A" * (content.MAX_DECODED_BLOB * 2)}]}
    assert _wheres("resources/read", big) == ["contents[0].uri", "contents[0].blob"]
    bad = {"contents": [{"uri": "u", "blob": "%%%%%%%%%%"}]}
    [_, _, decoded] = list(text_slots("resources/read", bad))
    assert decoded.data == b"" and not decoded.unscannable


def test_notifications_requests_completions_and_errors_yield_their_strings():
    progress = {"progressToken": "tok-123456", "progress": 1, "message": "step one"}
    assert _wheres("notifications/progress", progress) == ["message"]
    log = {"level": "info", "logger": "db", "data": {"conn": "c", "rows": ["r1"]}}
    assert _wheres("notifications/message", log) == ["level", "logger", "data.conn (key)", "data.conn",
                                                      "data.rows (key)", "data.rows[0]"]
    elicitation = {"message": "m", "requestedSchema": {"type": "object", "properties": {"api_key": {
        "type": "string", "description": "d", "default": "x"}}}}
    assert _wheres("elicitation/create", elicitation) == [
        "message", "requestedSchema.type", "requestedSchema.properties.api_key (key)",
        "requestedSchema.properties.api_key.type", "requestedSchema.properties.api_key.description",
        "requestedSchema.properties.api_key.default"]
    assert _wheres("completion/complete", {"completion": {"values": ["a", "b"], "hasMore": False}}) == [
        "completion.values[0]", "completion.values[1]"]
    error = {"code": -32000, "message": "boom", "data": {"detail": "more", "n": 2}}
    assert [slot.where for slot in error_slots(error)] == [
        "error.message", "error.data.detail (key)", "error.data.detail", "error.data.n (key)"]


def test_a_modern_input_required_result_yields_its_embedded_requests_but_not_its_state():
    result = {"resultType": "input_required", "requestState": "opaque-state",
              "inputRequests": {"ask": {"method": "elicitation/create", "params": {"message": "m"}}}}
    assert _wheres("tools/call", result) == [
        "resultType", "inputRequests.ask (key)", "inputRequests.ask.method", "inputRequests.ask.params.message"]
    assert _wheres("tools/call", {"content": "not a list", "structuredContent": None}) == ["content"]
    assert _wheres("tools/call", None) == []


def test_the_name_a_string_is_filed_under():
    result = {"content": [{"type": "text", "text": "t"}], "structuredContent": {"db": {"password": "p"}, "l": ["x"]}}
    named = [(slot.where, slot.name) for slot in text_slots("tools/call", result) if not slot.where.endswith("(key)")]
    assert named == [("content[0].type", None), ("content[0].text", None),
                     ("structuredContent.db.password", "password"), ("structuredContent.l[0]", None)]


def test_too_deep_a_message_is_withheld_below_the_bound_and_never_exhausts_the_stack():
    nested: dict = {"leaf": "deep"}
    for _ in range(5000):
        nested = {"n": nested}
    result = {"content": [], "structuredContent": nested}
    slots = list(text_slots("tools/call", result))
    [unscannable] = [slot for slot in slots if slot.unscannable]
    assert "deeper than" in unscannable.where
    unscannable.replace(UNSCANNABLE)
    node = result["structuredContent"]
    depth = 1
    while isinstance(node, dict):
        node = node["n"]
        depth += 1
    assert node == UNSCANNABLE and depth == content.MAX_DEPTH + 1
    copied = copy_tree(nested)  # no recursion either
    assert copied is not nested


def test_too_many_values_withhold_the_unread_rest_of_every_open_container(monkeypatch):
    monkeypatch.setattr(content, "MAX_NODES", 10)
    result = {"content": [{"type": "text", "text": f"t{i}"} for i in range(20)], "isError": False}
    slots = list(text_slots("tools/call", result))
    unscannable = [slot for slot in slots if slot.unscannable]
    assert unscannable
    for slot in unscannable:
        slot.replace(UNSCANNABLE)
    texts = [block.get("text") if isinstance(block, dict) else block for block in result["content"]]
    assert texts[-1] == UNSCANNABLE
    assert len(texts) < 20
    assert result.get(content.UNSCANNABLE_KEY) == UNSCANNABLE  # the top's unread "isError" withheld too
    assert "isError" not in result


def test_consecutive_text_blocks_share_a_run():
    result = {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"},
                          {"type": "image", "data": "AAAA", "mimeType": "image/png"}, {"type": "text", "text": "c"}]}
    runs = [slot.run for slot in text_slots("tools/call", result) if slot.run is not None]
    assert [index for _, index in runs] == [0, 1, 3]
    assert len({list_id for list_id, _ in runs}) == 1
