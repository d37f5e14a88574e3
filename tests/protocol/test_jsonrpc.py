"""JSON-RPC 2.0 framing and validation: one message per frame, id rules, size limit, parse errors."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.protocol.framing import EDGE
from bastion.protocol.jsonrpc import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_DEPTH,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    NOT_READ,
    PARSE_ERROR,
    ErrorResponse,
    InvalidFrame,
    Message,
    Notification,
    RawResponse,
    Request,
    Response,
    edge_members,
    encode,
    error,
    is_valid_id,
    parse_frame,
    parse_message,
    parse_raw_request,
    parse_raw_response,
    raw_request_frame,
    raw_request_of,
    raw_string,
    read_frame,
    request_frame,
)

from tests.properties import JSON_INTS, JSON_OBJECTS, JSON_TEXT, JSON_VALUES, PROPERTY, REQUEST_IDS


def frame_of(value: object) -> bytes:
    # The standard library writes integers of any width, which is what a hostile peer could send.
    return json.dumps(value).encode()


# ------------------------------------------------------------------------------------------ valid messages
VALID = [
    ("request, integer id", {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}, Request(7, "tools/list", None)),
    ("request, zero id", {"jsonrpc": "2.0", "id": 0, "method": "ping"}, Request(0, "ping", None)),
    ("request, negative id", {"jsonrpc": "2.0", "id": -3, "method": "ping"}, Request(-3, "ping", None)),
    ("request, string id", {"jsonrpc": "2.0", "id": "a-1", "method": "ping"}, Request("a-1", "ping", None)),
    ("request, empty string id", {"jsonrpc": "2.0", "id": "", "method": "ping"}, Request("", "ping", None)),
    ("request, widest u64 id", {"jsonrpc": "2.0", "id": 2**64 - 1, "method": "ping"}, Request(2**64 - 1, "ping", None)),
    ("request, null params", {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": None}, Request(1, "ping", None)),
    ("request, empty params", {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {}}, Request(1, "ping", {})),
    (
        "request with params",
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "x", "arguments": {"a": [1, 2]}}},
        Request(2, "tools/call", {"name": "x", "arguments": {"a": [1, 2]}}),
    ),
    ("notification", {"jsonrpc": "2.0", "method": "notifications/initialized"}, Notification("notifications/initialized", None)),
    (
        "notification with params",
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}},
        Notification("notifications/cancelled", {"requestId": 3}),
    ),
    ("response", {"jsonrpc": "2.0", "id": 9, "result": {}}, Response(9, {})),
    ("response, string id", {"jsonrpc": "2.0", "id": "x", "result": {"tools": []}}, Response("x", {"tools": []})),
    (
        "error response",
        {"jsonrpc": "2.0", "id": 4, "error": {"code": -32601, "message": "Method not found"}},
        ErrorResponse(4, {"code": -32601, "message": "Method not found"}),
    ),
    (
        "error response with data",
        {"jsonrpc": "2.0", "id": 4, "error": {"code": -32000, "message": "busy", "data": {"retryAfterSeconds": 1}}},
        ErrorResponse(4, {"code": -32000, "message": "busy", "data": {"retryAfterSeconds": 1}}),
    ),
]


@pytest.mark.parametrize(("value", "expected"), [(v, e) for _, v, e in VALID], ids=[c for c, _, _ in VALID])
def test_valid_frames_parse_to_their_message(value: dict, expected: object) -> None:
    assert parse_frame(frame_of(value)) == expected


def test_surrounding_whitespace_is_allowed() -> None:
    assert parse_frame(b'  {"jsonrpc":"2.0","method":"x"}\r\t ') == Notification("x", None)


# ------------------------------------------------------------------------- invalid requests (-32600 with reply)
# (case, value, id the reply must carry)
INVALID_WITH_REPLY = [
    ("empty batch", [], None),
    ("batch of one request", [{"jsonrpc": "2.0", "id": 1, "method": "ping"}], None),
    ("batch of two requests", [{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "method": "ping"}], None),
    ("number", 1, None),
    ("string", "ping", None),
    ("null", None, None),
    ("boolean", True, None),
    ("null id", {"jsonrpc": "2.0", "id": None, "method": "ping"}, None),
    ("true id", {"jsonrpc": "2.0", "id": True, "method": "ping"}, None),
    ("false id", {"jsonrpc": "2.0", "id": False, "method": "ping"}, None),
    ("float id", {"jsonrpc": "2.0", "id": 1.5, "method": "ping"}, None),
    ("integral float id", {"jsonrpc": "2.0", "id": 1.0, "method": "ping"}, None),
    ("id wider than 64 bits", {"jsonrpc": "2.0", "id": 2**64, "method": "ping"}, None),
    ("array id", {"jsonrpc": "2.0", "id": [1], "method": "ping"}, None),
    ("object id", {"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}, None),
    ("missing jsonrpc", {"id": 5, "method": "ping"}, 5),
    ("jsonrpc 1.0", {"jsonrpc": "1.0", "id": 5, "method": "ping"}, 5),
    ("jsonrpc as a number", {"jsonrpc": 2.0, "id": "s", "method": "ping"}, "s"),
    ("jsonrpc missing on a notification", {"method": "ping"}, None),
    ("empty method", {"jsonrpc": "2.0", "id": 6, "method": ""}, 6),
    ("numeric method", {"jsonrpc": "2.0", "id": 6, "method": 12}, 6),
    ("null method", {"jsonrpc": "2.0", "id": 6, "method": None}, 6),
    ("array params", {"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": [1, 2]}, 8),
    ("string params", {"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": "x"}, 8),
    ("numeric params on a notification", {"jsonrpc": "2.0", "method": "x", "params": 3}, None),
]


@pytest.mark.parametrize(("value", "reply_id"), [(v, i) for _, v, i in INVALID_WITH_REPLY], ids=[c for c, _, _ in INVALID_WITH_REPLY])
def test_invalid_requests_are_answered_with_32600(value: object, reply_id: object) -> None:
    parsed = parse_frame(frame_of(value))
    assert isinstance(parsed, InvalidFrame)
    assert parsed.reason
    assert parsed.reply is not None
    assert parsed.reply.id == reply_id
    assert parsed.reply.error["code"] == INVALID_REQUEST
    assert parsed.reason in parsed.reply.error["message"]


def test_batch_refusal_says_to_send_one_message_per_frame() -> None:
    parsed = parse_frame(b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]')
    assert isinstance(parsed, InvalidFrame)
    assert "batch" in parsed.reason and "one message per frame" in parsed.reason


# ------------------------------------------------------------------- malformed responses: never answered
INVALID_WITHOUT_REPLY = [
    ("no id, no method", {"jsonrpc": "2.0"}),
    ("result without an id", {"jsonrpc": "2.0", "result": {}}),
    ("both result and error", {"jsonrpc": "2.0", "id": 1, "result": {}, "error": {"code": 1, "message": "m"}}),
    ("neither result nor error", {"jsonrpc": "2.0", "id": 1}),
    ("array result", {"jsonrpc": "2.0", "id": 1, "result": []}),
    ("null result", {"jsonrpc": "2.0", "id": 1, "result": None}),
    ("scalar result", {"jsonrpc": "2.0", "id": 1, "result": 3}),
    ("string error", {"jsonrpc": "2.0", "id": 1, "error": "bad"}),
    ("error without a code", {"jsonrpc": "2.0", "id": 1, "error": {"message": "m"}}),
    ("error with a string code", {"jsonrpc": "2.0", "id": 1, "error": {"code": "-32600", "message": "m"}}),
    ("error with a float code", {"jsonrpc": "2.0", "id": 1, "error": {"code": -32600.5, "message": "m"}}),
    ("error without a message", {"jsonrpc": "2.0", "id": 1, "error": {"code": -32600}}),
    ("error with a numeric message", {"jsonrpc": "2.0", "id": 1, "error": {"code": -32600, "message": 5}}),
]


@pytest.mark.parametrize("value", [v for _, v in INVALID_WITHOUT_REPLY], ids=[c for c, _ in INVALID_WITHOUT_REPLY])
def test_malformed_responses_are_rejected_without_a_reply(value: dict) -> None:
    parsed = parse_frame(frame_of(value))
    assert isinstance(parsed, InvalidFrame)
    assert parsed.reason
    assert parsed.reply is None


# Response-shaped frames (an id, no method) that the parser currently answers. JSON-RPC 2.0 never answers a
# response: the peer is not waiting for anything, and two gateways answering each other's errors would loop.
RESPONSES_THAT_MUST_NOT_BE_ANSWERED = [
    ("error response to an unparseable frame (id null)", {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}),
    ("response with jsonrpc 1.0", {"jsonrpc": "1.0", "id": 3, "result": {}}),
    ("response without jsonrpc", {"id": 3, "result": {}}),
    ("response with a boolean id", {"jsonrpc": "2.0", "id": True, "result": {}}),
]


@pytest.mark.parametrize("value", [v for _, v in RESPONSES_THAT_MUST_NOT_BE_ANSWERED], ids=[c for c, _ in RESPONSES_THAT_MUST_NOT_BE_ANSWERED])
def test_response_shaped_frames_are_never_answered(value: dict) -> None:
    parsed = parse_frame(frame_of(value))
    assert not (isinstance(parsed, InvalidFrame) and parsed.reply is not None)


def test_error_response_with_null_id_is_an_error_response() -> None:
    error_object = {"code": -32700, "message": "Parse error"}
    assert parse_frame(frame_of({"jsonrpc": "2.0", "id": None, "error": error_object})) == ErrorResponse(None, error_object)


def test_a_parse_error_reply_does_not_provoke_another_reply() -> None:
    first = parse_frame(b"not json")
    assert isinstance(first, InvalidFrame) and first.reply is not None
    echoed = parse_frame(encode(first.reply)[:-1])
    assert not (isinstance(echoed, InvalidFrame) and echoed.reply is not None)


@pytest.mark.parametrize("code", [True, False])
def test_boolean_error_code_is_rejected(code: bool) -> None:
    parsed = parse_frame(frame_of({"jsonrpc": "2.0", "id": 1, "error": {"code": code, "message": "m"}}))
    assert isinstance(parsed, InvalidFrame)


# ------------------------------------------------------------------------------------ parse errors (-32700)
PARSE_ERRORS = [
    ("empty frame", b""),
    ("whitespace only", b"   "),
    ("truncated object", b'{"jsonrpc":"2.0","id":1'),
    ("trailing comma", b'{"jsonrpc":"2.0","method":"x",}'),
    ("single quotes", b"{'jsonrpc':'2.0'}"),
    ("two objects in one frame", b'{"jsonrpc":"2.0","method":"a"}{"jsonrpc":"2.0","method":"b"}'),
    ("bare word", b"ping"),
    ("NaN", b"NaN"),
    ("infinite number", b'{"jsonrpc":"2.0","id":1e400,"method":"x"}'),
    ("raw control character in a string", b'{"jsonrpc":"2.0","method":"a\x01"}'),
    ("lone surrogate escape", b'{"jsonrpc":"2.0","method":"\\ud800"}'),
    ("lone low surrogate escape", b'{"jsonrpc":"2.0","method":"\\udc00"}'),
    ("Infinity", b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":Infinity}}'),
    ("integer too large for a double", b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1' + b"0" * 400 + b"}}"),
    ("UTF-16 without a byte order mark", '{"jsonrpc":"2.0","method":"x"}'.encode("utf-16-le")),
    ("comment", b'{"jsonrpc":"2.0","method":"x"} // hi'),
]


@pytest.mark.parametrize("frame", [f for _, f in PARSE_ERRORS], ids=[c for c, _ in PARSE_ERRORS])
def test_malformed_json_is_answered_with_32700(frame: bytes) -> None:
    parsed = parse_frame(frame)
    assert isinstance(parsed, InvalidFrame)
    assert parsed.reason.startswith("malformed JSON")
    assert parsed.reply == ErrorResponse(None, {"code": PARSE_ERROR, "message": f"Parse error: {parsed.reason}"})


INVALID_UTF8 = [
    ("stray continuation byte", b'{"jsonrpc":"2.0","method":"\x80"}'),
    ("0xff byte", b'{"jsonrpc":"2.0","method":"\xff"}'),
    ("overlong slash", b'{"jsonrpc":"2.0","method":"\xc0\xaf"}'),
    ("encoded surrogate", b'{"jsonrpc":"2.0","method":"\xed\xa0\x80"}'),
    ("truncated sequence", b'{"jsonrpc":"2.0","method":"\xe2\x82"}'),
    ("code point above U+10FFFF", b'{"jsonrpc":"2.0","method":"\xf4\x90\x80\x80"}'),
    ("latin-1 text", "{\"jsonrpc\":\"2.0\",\"method\":\"caf\u00e9\"}".encode("latin-1")),
]


@pytest.mark.parametrize("frame", [f for _, f in INVALID_UTF8], ids=[c for c, _ in INVALID_UTF8])
def test_invalid_utf8_is_answered_with_32700(frame: bytes) -> None:
    parsed = parse_frame(frame)
    assert isinstance(parsed, InvalidFrame)
    assert parsed.reason == "invalid UTF-8"
    assert parsed.reply == ErrorResponse(None, {"code": PARSE_ERROR, "message": "Parse error: invalid UTF-8"})


@pytest.mark.parametrize("frame", ['{"jsonrpc":"2.0","method":"x"}'.encode("utf-16"),
                                   '{"jsonrpc":"2.0","method":"x"}'.encode("utf-32")], ids=["UTF-16", "UTF-32"])
def test_text_in_another_encoding_than_utf8_is_answered_with_32700(frame: bytes) -> None:
    parsed = parse_frame(frame)
    assert isinstance(parsed, InvalidFrame) and parsed.reason == "invalid UTF-8"
    assert parsed.reply is not None and parsed.reply.error["code"] == PARSE_ERROR


def test_a_byte_order_mark_is_answered_with_32700_saying_so() -> None:
    parsed = parse_frame(b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"x"}')
    assert isinstance(parsed, InvalidFrame) and "byte order mark" in parsed.reason
    assert parsed.reply == ErrorResponse(None, {"code": PARSE_ERROR, "message": f"Parse error: {parsed.reason}"})


def test_an_integer_wider_than_64_bits_is_read_as_the_nearest_double() -> None:
    parsed = parse_frame(b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"n":123456789012345678901234567890}}')
    assert parsed == Request(1, "x", {"n": 1.2345678901234568e29})


# ------------------------------------------------------------------------------------------- depth limit
def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def request_with(value: bytes, request_id: bytes = b"7") -> bytes:
    """A request whose params hold ``value``, two levels below the message (message, params)."""
    return b'{"jsonrpc":"2.0","id":' + request_id + b',"method":"x","params":{"a":' + value + b"}}"


def test_the_depth_limit_is_64_levels() -> None:
    assert MAX_DEPTH == 64


@pytest.mark.parametrize("frame", [nested(MAX_DEPTH), request_with(nested(MAX_DEPTH - 2)),
                                   b'{"a":' * (MAX_DEPTH - 1) + b"{}" + b"}" * (MAX_DEPTH - 1)],
                         ids=["array", "request", "objects"])
def test_nesting_at_the_limit_is_read(frame: bytes) -> None:
    assert not isinstance(read_frame(frame), InvalidFrame)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 300, 1024, 1025, 100_000])
def test_a_request_nested_past_the_limit_is_refused_with_32600_naming_it(depth: int) -> None:
    parsed = parse_frame(request_with(nested(depth - 2)))
    assert isinstance(parsed, InvalidFrame) and parsed.reply is not None
    assert parsed.reply.error["code"] == INVALID_REQUEST
    assert f"deeper than {MAX_DEPTH} levels" in parsed.reply.error["message"]
    # Its id where the message could be read (orjson reads 1,024 levels); past that, none.
    assert parsed.reply.id == (7 if depth <= 1024 else None)


@pytest.mark.parametrize("frame", [nested(MAX_DEPTH + 1), nested(100_000), b'{"a":' * 100_000,
                                   b'{"jsonrpc":"2.0","method":"x","params":{"a":' + nested(MAX_DEPTH) + b"}}"],
                         ids=["array", "array 100,000 deep", "unclosed objects", "notification"])
def test_anything_nested_past_the_limit_is_refused_with_32600_and_no_id(frame: bytes) -> None:
    parsed = parse_frame(frame)
    assert isinstance(parsed, InvalidFrame) and parsed.reply is not None
    assert parsed.reply.id is None and parsed.reply.error["code"] == INVALID_REQUEST
    assert f"deeper than {MAX_DEPTH} levels" in parsed.reason


def test_a_response_nested_past_the_limit_is_refused_unanswered() -> None:
    parsed = parse_frame(b'{"jsonrpc":"2.0","id":1,"result":{"a":' + nested(MAX_DEPTH) + b"}}")
    assert isinstance(parsed, InvalidFrame) and parsed.reply is None and "64 levels" in parsed.reason


def test_a_servers_frame_has_only_orjsons_bound() -> None:
    deep = b'{"jsonrpc":"2.0","id":1,"result":{"a":' + nested(300) + b"}}"
    assert type(parse_frame(deep, max_depth=None)) is Response
    assert type(parse_raw_response(b'{"jsonrpc":"2.0","id":1,"result":{"a":' + nested(100_000) + b"}}")) is not \
        RawResponse  # never a RecursionError


def test_valid_multibyte_utf8_is_accepted() -> None:
    frame = '{"jsonrpc":"2.0","id":"\u00e9\u4e2d\U0001f600","method":"caf\u00e9"}'.encode()
    assert parse_frame(frame) == Request("\u00e9\u4e2d\U0001f600", "caf\u00e9", None)


# ------------------------------------------------------------------------------------------- size limit
def test_default_limit_is_32_mib() -> None:
    assert DEFAULT_MAX_MESSAGE_BYTES == 32 * 1024 * 1024


@pytest.mark.parametrize("limit", [64, 100, 1000])
def test_frame_of_exactly_the_limit_is_accepted(limit: int) -> None:
    head = b'{"jsonrpc":"2.0","method":"'
    tail = b'"}'
    frame = head + b"x" * (limit - len(head) - len(tail)) + tail
    assert len(frame) == limit
    assert isinstance(parse_frame(frame, max_bytes=limit), Notification)


@pytest.mark.parametrize("limit", [64, 100, 1000])
def test_frame_one_byte_over_the_limit_is_refused_with_a_clear_error(limit: int) -> None:
    head = b'{"jsonrpc":"2.0","id":1,"method":"'
    tail = b'"}'
    frame = head + b"x" * (limit + 1 - len(head) - len(tail)) + tail
    parsed = parse_frame(frame, max_bytes=limit)
    assert isinstance(parsed, InvalidFrame)
    assert parsed.reason == f"message of {limit + 1} bytes exceeds the limit of {limit} bytes"
    assert parsed.reply == ErrorResponse(None, {"code": INVALID_REQUEST, "message": parsed.reason})


def test_size_is_checked_before_parsing() -> None:
    # An oversized frame is not decoded at all, so even garbage gets the size error rather than -32700.
    parsed = parse_frame(b"\xff" * 11, max_bytes=10)
    assert isinstance(parsed, InvalidFrame)
    assert parsed.reply is not None and parsed.reply.error["code"] == INVALID_REQUEST
    assert "exceeds the limit of 10 bytes" in parsed.reason


# ----------------------------------------------------------------------------------------------- ids
@pytest.mark.parametrize(
    ("value", "valid"),
    [(0, True), (-1, True), (2**70, True), ("", True), ("x", True), (None, False), (True, False), (False, False),
     (1.0, False), (1.5, False), ([], False), ({}, False), (b"1", False)],
)
def test_is_valid_id(value: object, valid: bool) -> None:
    assert is_valid_id(value) is valid


# ----------------------------------------------------------------------------------------- encoding
def decoded(message: Message) -> dict:
    frame = encode(message)
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1
    return orjson.loads(frame)


def test_encoding_omits_absent_params() -> None:
    assert decoded(Request(1, "ping", None)) == {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert decoded(Notification("n", None)) == {"jsonrpc": "2.0", "method": "n"}
    assert decoded(Request(1, "ping", {})) == {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {}}
    assert request_frame(1, "ping", {}) == encode(Request(1, "ping", {}))


def test_encoding_of_responses() -> None:
    assert decoded(Response("a", {"x": 1})) == {"jsonrpc": "2.0", "id": "a", "result": {"x": 1}}
    assert decoded(ErrorResponse(None, {"code": -32700, "message": "m"})) == {
        "jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "m"}}


def test_encode_escapes_newlines_so_a_frame_is_one_line() -> None:
    frame = encode(Request(1, "x\ny", {"text": "a\nb\r\nc\u2028d"}))
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1 and b"\r" not in frame
    assert parse_frame(frame[:-1]) == Request(1, "x\ny", {"text": "a\nb\r\nc\u2028d"})


@pytest.mark.parametrize(
    ("data", "expected"),
    [(None, {"code": 1, "message": "m"}), (0, {"code": 1, "message": "m", "data": 0}),
     (False, {"code": 1, "message": "m", "data": False}), ({}, {"code": 1, "message": "m", "data": {}}),
     ({"k": "v"}, {"code": 1, "message": "m", "data": {"k": "v"}})],
)
def test_error_object_keeps_falsy_data(data: object, expected: dict) -> None:
    assert error(1, "m", data) == expected


# ----------------------------------------------------------------------------------------- properties
PARAMS = st.none() | JSON_OBJECTS
METHODS = JSON_TEXT.filter(bool)
MESSAGES = st.one_of(
    st.builds(Request, REQUEST_IDS, METHODS, PARAMS),
    st.builds(Notification, METHODS, PARAMS),
    st.builds(Response, REQUEST_IDS, JSON_OBJECTS),
    st.builds(
        ErrorResponse,
        REQUEST_IDS,
        st.fixed_dictionaries({"code": JSON_INTS, "message": JSON_TEXT}, optional={"data": JSON_VALUES}),
    ),
)


@PROPERTY
@given(st.binary(max_size=300))
def test_parse_frame_never_raises_on_arbitrary_bytes(frame: bytes) -> None:
    parsed = parse_frame(frame)
    assert isinstance(parsed, (Request, Notification, Response, ErrorResponse, InvalidFrame))
    if isinstance(parsed, InvalidFrame) and parsed.reply is not None:
        assert parsed.reply.error["code"] in (PARSE_ERROR, INVALID_REQUEST)
        # The reply itself must be sendable: one JSON line carrying the same error.
        sent = encode(parsed.reply)
        assert sent.count(b"\n") == 1
        assert orjson.loads(sent) == {"jsonrpc": "2.0", "id": None, "error": parsed.reply.error}


@PROPERTY
@given(JSON_VALUES)
def test_parse_frame_never_raises_on_arbitrary_json(value: object) -> None:
    parsed = parse_frame(orjson.dumps(value))
    assert isinstance(parsed, (Request, Notification, Response, ErrorResponse, InvalidFrame))
    if isinstance(parsed, InvalidFrame) and parsed.reply is not None:
        assert parsed.reply.error["code"] == INVALID_REQUEST
        assert parsed.reply.id is None or is_valid_id(parsed.reply.id)


MESSAGE_SHAPED = st.dictionaries(
    st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error"]),
    st.sampled_from(["2.0", "1.0", None, True, 0, 1.5, "", "ping", [], {}, {"code": 1, "message": "m"}]) | JSON_VALUES,
)


@PROPERTY
@given(MESSAGE_SHAPED)
def test_parse_message_classifies_every_message_shaped_object(value: dict) -> None:
    parsed = parse_message(value)
    if isinstance(parsed, (Request, Response, ErrorResponse)):
        assert is_valid_id(parsed.id) and value["id"] == parsed.id and value["jsonrpc"] == "2.0"
    if isinstance(parsed, (Request, Notification)):
        assert parsed.method == value["method"] and parsed.params == value.get("params")
    if isinstance(parsed, Notification):
        assert "id" not in value
    if isinstance(parsed, InvalidFrame) and parsed.reply is not None and "id" in value and is_valid_id(value["id"]):
        assert parsed.reply.id == value["id"], "an answerable invalid request is answered under its own id"


@PROPERTY
@given(MESSAGES)
def test_encode_then_parse_round_trips(message: object) -> None:
    frame = encode(message)
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1
    assert parse_frame(frame[:-1]) == message


@PROPERTY
@given(MESSAGES, st.integers(min_value=0, max_value=400))
def test_size_limit_is_exact(message: object, slack: int) -> None:
    frame = encode(message)[:-1]
    limit = max(len(frame) - 200 + slack, 0)
    parsed = parse_frame(frame, max_bytes=limit)
    if len(frame) <= limit:
        assert parsed == message
    else:
        assert isinstance(parsed, InvalidFrame) and "exceeds the limit" in parsed.reason


# ------------------------------------------------------------------------------ results kept as bytes
def _agrees_with_parse_frame(frame: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
    raw = parse_raw_response(frame, max_bytes)
    parsed = parse_frame(frame, max_bytes)
    if raw is not None and type(parsed) is InvalidFrame:  # valid JSON that orjson cannot hold, such as 1e400
        decoded = raw.decoded()
        assert "number" in parsed.reason and type(decoded) is ErrorResponse and decoded.id == raw.id
        assert parsed.reason in decoded.error["message"]
    elif raw is not None:
        assert isinstance(raw, RawResponse)
        assert type(parsed) is Response and parsed.id == raw.id and type(raw.id) is int
        assert orjson.loads(bytes(raw.result)) == parsed.result
        assert raw.decoded() == parsed
    elif type(parsed) is Response and type(parsed.id) is int:
        raise AssertionError(f"a plain success response was not recognised: {frame!r}")


@PROPERTY
@given(MESSAGE_SHAPED)
def test_raw_response_parsing_agrees_with_parse_frame_on_message_shaped_objects(value: dict) -> None:
    _agrees_with_parse_frame(orjson.dumps(value))


@PROPERTY
@given(st.binary(max_size=300))
def test_raw_response_parsing_agrees_with_parse_frame_on_arbitrary_bytes(frame: bytes) -> None:
    _agrees_with_parse_frame(frame)


@PROPERTY
@given(JSON_INTS, JSON_OBJECTS, st.sampled_from([b"", b" ", b"\t\n "]))
def test_a_result_passes_through_as_its_exact_bytes(request_id: int, result: dict, space: bytes) -> None:
    body = orjson.dumps(result, option=orjson.OPT_INDENT_2)  # not the bytes orjson would write by default
    frame = b'{' + space + b'"id":' + str(request_id).encode() + b',"result":' + space + body + space + b',"jsonrpc":"2.0"}'
    raw = parse_raw_response(frame)
    if not -(2**63) <= request_id < 2**63:
        return  # wider than the decoder's integers: parse_frame takes it (and no id Bastion sends is that wide)
    assert raw is not None and bytes(raw.result) == body
    reframed = raw.reframed("client-7")
    assert reframed.endswith(b"}\n") and reframed.count(b"\n") == 1 + body.count(b"\n")
    assert orjson.loads(reframed) == {"jsonrpc": "2.0", "id": "client-7", "result": result}


@pytest.mark.parametrize(
    "frame, why",
    [
        (b'{"jsonrpc":"2.0","id":1,"result":{"a":"\xff"}}', "invalid UTF-8 inside the result"),
        (b'{"jsonrpc":"2.0","id":1,"result":[]}', "a result that is not an object"),
        (b'{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"m"}}', "both result and error"),
        (b'{"jsonrpc":"2.0","id":"1","result":{}}', "a string id (Bastion sends integers)"),
        (b'{"jsonrpc":"2.0","id":true,"result":{}}', "a boolean id"),
        (b'{"jsonrpc":"1.0","id":1,"result":{}}', "the wrong version"),
        (b'{"jsonrpc":"2.0","id":1,"result":{"a":1,}}', "a trailing comma"),
        (b'{"jsonrpc":"2.0","id":1,"method":"m","result":{}}', "a method"),
    ],
)
def test_anything_unusual_is_left_to_parse_frame(frame: bytes, why: str) -> None:
    assert parse_raw_response(frame) is None, why


def test_the_size_limit_applies_to_raw_responses_too() -> None:
    frame = b'{"jsonrpc":"2.0","id":1,"result":{"text":"' + b"x" * 100 + b'"}}'
    assert parse_raw_response(frame, max_bytes=len(frame)) is not None
    assert parse_raw_response(frame, max_bytes=len(frame) - 1) is None


def test_a_number_orjson_cannot_hold_passes_through_but_cannot_be_decoded() -> None:
    raw = parse_raw_response(b'{"jsonrpc":"2.0","id":1,"result":{"a":1e400}}')
    assert raw is not None and bytes(raw.result) == b'{"a":1e400}'  # valid JSON, sent on as it is
    decoded = raw.decoded()
    assert type(decoded) is ErrorResponse and decoded.id == 1 and decoded.error["code"] == INTERNAL_ERROR
    assert "could not be read" in decoded.error["message"] and "infinity" in decoded.error["message"]


# ------------------------------------------------------------------------------ params kept as bytes
def _request_agrees_with_parse_frame(frame: bytes) -> None:
    """A client's frame is read once (``read_frame``); only what that reading accepts is read again for its raw
    params, so the raw request is exactly ``parse_frame``'s request."""
    value = read_frame(frame)
    raw = None if type(value) is InvalidFrame else raw_request_of(frame, value)
    parsed = parse_frame(frame)
    if raw is not None:
        assert type(parsed) is Request and (parsed.id, parsed.method) == (raw.id, raw.method)
        assert {key: orjson.loads(bytes(value)) for key, value in raw.params.items()} == parsed.params
    elif type(parsed) is Request and parsed.params is not None:
        raise AssertionError(f"a request with params was not recognised: {frame!r}")


@PROPERTY
@given(MESSAGE_SHAPED)
def test_raw_request_parsing_agrees_with_parse_frame_on_message_shaped_objects(value: dict) -> None:
    _request_agrees_with_parse_frame(orjson.dumps(value))


@PROPERTY
@given(st.binary(max_size=300))
def test_raw_request_parsing_agrees_with_parse_frame_on_arbitrary_bytes(frame: bytes) -> None:
    _request_agrees_with_parse_frame(frame)


@pytest.mark.parametrize("frame", [
    request_with(b"1e400"), request_with(b"-1e400"), request_with(b"1" + b"0" * 400), request_with(nested(300)),
    request_with(nested(MAX_DEPTH - 1)), request_with(nested(5000)), request_with(b"1", b"18446744073709551616"),
    request_with(b"1", b"-9223372036854775809"), request_with(b'"\\ud800"'),
], ids=["1e400", "-1e400", "401 digits", "300 deep", "one level past the limit", "5000 deep", "id of 2**64",
        "id below -2**63", "lone surrogate"])
def test_what_only_the_raw_reader_would_take_is_refused_before_it_reads(frame: bytes) -> None:
    value = read_frame(frame)
    assert type(value) is InvalidFrame or raw_request_of(frame, value) is None
    assert type(parse_frame(frame)) is InvalidFrame


@PROPERTY
@given(REQUEST_IDS, JSON_TEXT.filter(bool), JSON_OBJECTS, JSON_TEXT)
def test_raw_params_are_sent_on_as_they_came_with_only_what_is_replaced_changed(
        request_id: object, method: str, params: dict, name: str) -> None:
    raw = parse_raw_request(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}))
    if type(request_id) is int and not -(2**63) <= request_id < 2**63:
        return  # wider than the decoder's integers: parse_frame takes it
    assert raw is not None and raw.id == request_id and raw.method == method
    frame = raw_request_frame(9, method, {**raw.params, "name": name})
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1
    assert parse_frame(frame[:-1]) == Request(9, method, {**params, "name": name})


def test_a_raw_string_is_decoded_and_anything_else_is_none() -> None:
    raw = parse_raw_request(b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":"caf\\u00e9","b":["x"],"c":null}}')
    assert raw is not None
    assert raw_string(raw.params["a"]) == "caf\u00e9"
    assert raw_string(raw.params["b"]) is None and raw_string(raw.params["c"]) is None
    assert raw_string(raw.params.get("missing")) is None


@pytest.mark.parametrize(
    "frame",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"m"}',  # no params: nothing to keep raw
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":null}',
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":[1]}',
        b'{"jsonrpc":"2.0","id":1,"method":"","params":{}}',
        b'{"jsonrpc":"2.0","id":1.5,"method":"m","params":{}}',
        b'{"jsonrpc":"2.0","id":null,"method":"m","params":{}}',
        b'{"jsonrpc":"2.0","method":"m","params":{}}',  # a notification
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":"\xff"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1,}}',
    ],
)
def test_anything_but_a_plain_request_with_params_is_left_to_parse_frame(frame: bytes) -> None:
    assert parse_raw_request(frame) is None


# ----------------------------------------------------------------------- the two ends of a frame too large to read
def _ends(data: bytes) -> dict | None:
    return edge_members(data[:EDGE], data[-EDGE:])


@pytest.mark.parametrize("message, expected", [
    # The official Python SDK's key order, then the TypeScript SDK's, for an answer and for a request of its own.
    ({"jsonrpc": "2.0", "id": 7, "result": {"text": "x" * 1000}}, {"jsonrpc": "2.0", "id": 7, "result": NOT_READ}),
    ({"result": {"text": "x" * 1000}, "jsonrpc": "2.0", "id": 7}, {"result": NOT_READ, "jsonrpc": "2.0", "id": 7}),
    ({"method": "sampling/createMessage", "params": {"m": "x" * 1000}, "jsonrpc": "2.0", "id": "s-1"},
     {"method": "sampling/createMessage", "params": NOT_READ, "jsonrpc": "2.0", "id": "s-1"}),
    # The id between two objects: neither end says it (nor the key of an object read backwards).
    ({"jsonrpc": "2.0", "result": {"text": "x" * 1000}, "id": 7, "_meta": {}}, {"jsonrpc": "2.0", "result": NOT_READ}),
    # Quotes and backslashes at the end of a string value: an escaped quote is not where a string starts.
    ({"result": {"t": "x" * 1000}, "note": 'a \\" "b\\\\', "id": 3}, {"result": NOT_READ, "note": 'a \\" "b\\\\', "id": 3}),
])
def test_the_ends_of_a_large_message_say_its_id_and_its_kind(message: dict, expected: dict) -> None:
    assert _ends(json.dumps(message).encode()) == expected
    assert _ends(orjson.dumps(message)) == expected


def test_the_ends_of_something_not_an_object_say_nothing() -> None:
    assert _ends(b"[" + b"1," * 1000 + b"1]") == {}
    assert _ends(b"not json at all, " * 100) == {}
    # The tail's first string is cut by where the tail starts: what escapes its quote cannot be told.
    assert edge_members(b'{"result": {', b'\\\\"id": 3}') == {"result": NOT_READ}


def test_ends_that_disagree_say_nothing_to_rely_on() -> None:
    assert edge_members(b'{"id": 1, "result": {', b'"x", "id": 2}') is None


@PROPERTY
@given(before=JSON_OBJECTS, after=JSON_OBJECTS, filler=st.integers(0, 3 * EDGE), spaced=st.booleans())
def test_what_the_ends_of_a_large_object_say_of_its_top_level_members_is_true(before, after, filler, spaced):
    whole = {**before, "middle": {"text": "x" * filler}, **after}
    data = json.dumps(whole, indent=1 if spaced else None, ensure_ascii=spaced).encode()
    read = _ends(data)
    assert read is not None
    for name, value in read.items():
        assert name in whole
        if value is NOT_READ:
            assert isinstance(whole[name], (dict, list))
        else:
            assert value == whole[name] and not isinstance(whole[name], (dict, list))
