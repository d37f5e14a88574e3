"""One reading of a client's frame, one verdict: the HTTP frontend's reading of a body (``read_message``) and the
session's of a frame (``parse_frame``, as over stdio) accept and refuse the same bytes, refuse them with the same
error, and what the frontend accepts the session takes as it would take the bytes. Random bytes, and JSON-ish
texts with the edge cases mixed in: NaN and Infinity, numbers no double holds, integers wider than 64 bits, lone
surrogates, invalid UTF-8, a byte order mark, UTF-16 and UTF-32, nesting around the depth limit and orjson's own."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Iterator

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.frontends.http.exchanges import peek
from bastion.frontends.http.wire import HttpError, read_message
from bastion.protocol.jsonrpc import (
    INVALID_REQUEST,
    MAX_DEPTH,
    InvalidFrame,
    Request,
    parse_frame,
    raw_request_of,
    read_frame,
)
from bastion.protocol.server_session import ServerSession

from tests.properties import JSON_VALUES, PROPERTY, REQUEST_IDS

MAX_BYTES = 4096  # the gateway's max_message_bytes in these tests: some frames are over it
BODY_LIMIT = 1 << 20  # http.max_body_bytes: above every frame here, so the message limit is the one that applies

SCALARS = st.sampled_from([
    b"NaN", b"-NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"1E+309", b"1e308", b"1.7976931348623157e308",
    b"1.8e308", b"1e-400", b"1" + b"0" * 308, b"1" + b"0" * 309, b"123456789012345678901234567890",
    b"18446744073709551615", b"18446744073709551616", b"-9223372036854775808", b"-9223372036854775809", b"0", b"-0",
    b"01", b"1.", b".5", b"1.5", b"-", b"true", b"false", b"null", b"nul", b'""', b'"x"', b'"\\ud800"', b'"\\udc00"',
    b'"\\ud800\\udc00"', b'"\\udbff\\udfff"', b'"\\ud800x"', b'"\\u0000"', b'"\\x"', b'"\xed\xa0\x80"', b'"\xff"',
    b'"\xc0\xaf"', b'"\xf0\x9f\x98\x80"', b'"caf\xc3\xa9"', b'"\x01"', b"'x'", b"[1,]", b"{}", b"[]",
]) | st.builds(lambda value: json.dumps(value).encode(), st.integers() | st.text(max_size=8) | st.floats())
# (json.dumps writes what orjson does not: NaN, Infinity, any integer, and lone surrogates as escapes.)
KEYS = st.sampled_from([b'"a"', b'"id"', b'"method"', b'"jsonrpc"', b'"params"', b'"result"', b'"error"',
                        b'"\\ud800"', b"a", b'"_meta"'])
NESTED = st.sampled_from([MAX_DEPTH - 3, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 300, 1022, 1023,
                          1024, 1025, 5000]).flatmap(
    lambda depth: st.sampled_from([b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth,
                                   b"[" * depth, b"[" * depth + b"]" * (depth - 1)]))


def _array(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.lists(children, max_size=3).map(lambda items: b"[" + b",".join(items) + b"]")


def _object(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.lists(st.tuples(KEYS, children), max_size=3).map(
        lambda members: b"{" + b",".join(key + b":" + value for key, value in members) + b"}")


PLAIN = st.builds(orjson.dumps, JSON_VALUES)
EDGES = SCALARS | NESTED
VALUES = st.recursive(PLAIN | PLAIN | PLAIN | PLAIN | EDGES, lambda children: _array(children) | _object(children),
                      max_leaves=4)
IDS = st.builds(lambda value: orjson.dumps(value), REQUEST_IDS) | st.sampled_from([
    b"null", b"true", b"1.5", b"1.0", b"18446744073709551615", b"18446744073709551616", b"-9223372036854775809",
    b"1e400", b"NaN", b"[1]", b'"\\ud800"'])
METHODS = st.sampled_from([b'"tools/call"', b'"tools/list"', b'"ping"', b'"initialize"', b'"notifications/cancelled"',
                           b'"notifications/initialized"'] * 2 + [b'""', b"7", b"null", b'"\\ud800"'])


@st.composite
def messages(draw: Callable[..., Any]) -> bytes:
    """A JSON-RPC-shaped object, its members drawn with the edge cases among them."""
    members = []
    if draw(st.integers(0, 9)):
        members.append(b'"jsonrpc":' + draw(st.sampled_from([b'"2.0"'] * 8 + [b'"1.0"', b"2.0"])))
    if draw(st.integers(0, 2)):
        members.append(b'"id":' + draw(IDS))
    kind = draw(st.sampled_from(["request", "request", "request", "response", "error", "other"]))
    if kind == "request":
        members.append(b'"method":' + draw(METHODS))
        if draw(st.booleans()):
            members.append(b'"params":' + draw(_object(VALUES) | _object(VALUES) | VALUES))
    elif kind == "response":
        members.append(b'"result":' + draw(_object(VALUES) | VALUES))
    elif kind == "error":
        members.append(b'"error":' + draw(st.sampled_from([b'{"code":-1,"message":"m"}', b"null", b'{"code":1.5}'])))
    else:
        members.append(draw(KEYS) + b":" + draw(VALUES))
    order = draw(st.permutations(members))
    return b"{" + b",".join(order) + b"}"


def _reencoded(frame: bytes, encoding: str) -> bytes:
    try:
        return frame.decode("utf-8", "surrogatepass").encode(encoding, "surrogatepass")
    except UnicodeError:
        return frame


TRANSFORMS: list[Callable[[bytes], bytes]] = [
    lambda frame: frame,
    lambda frame: frame,
    lambda frame: b"\xef\xbb\xbf" + frame,
    lambda frame: _reencoded(frame, "utf-16"),
    lambda frame: _reencoded(frame, "utf-16-le"),
    lambda frame: _reencoded(frame, "utf-32"),
    lambda frame: b" \t\r\n" + frame + b"\n ",
    lambda frame: frame[:-1],
    lambda frame: frame + b"x" * (MAX_BYTES - len(frame) + 1) if len(frame) <= MAX_BYTES else frame,
]
JSONISH = st.tuples(messages() | VALUES, st.sampled_from(TRANSFORMS)).map(lambda pair: pair[1](pair[0]))
FRAMES = st.binary(max_size=200) | JSONISH | messages() | messages()


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


def http_reading(frame: bytes, loop: asyncio.AbstractEventLoop) -> tuple[bytes, Any, dict[str, Any]] | HttpError:
    """What the HTTP frontend makes of ``frame`` as a POST body: the message, or the error it answers with."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": frame, "more_body": False}

    try:
        return loop.run_until_complete(read_message({"content-type": "application/json"}, receive, BODY_LIMIT,
                                                       30.0, MAX_BYTES))
    except HttpError as exc:
        return exc


def session() -> ServerSession:
    return ServerSession(server_info={"name": "bastion", "version": "test"}, max_message_bytes=MAX_BYTES)


def agree(frame: bytes, loop: asyncio.AbstractEventLoop) -> None:
    parsed = parse_frame(frame, MAX_BYTES)
    read = http_reading(frame, loop)
    if isinstance(read, HttpError):
        assert isinstance(parsed, InvalidFrame), (frame, read.message, parsed)
        assert read.status == (413 if len(frame) > MAX_BYTES else 400)
        if parsed.reply is not None:  # the very error the session sends for the frame over stdio
            assert (read.code, read.message, read.request_id) == (
                parsed.reply.error["code"], parsed.reply.error["message"], parsed.reply.id)
        else:  # a response, which a stream leaves unanswered; a POST is answered all the same
            assert (read.code, read.request_id) == (INVALID_REQUEST, None) and parsed.reason in read.message
        return
    assert not isinstance(parsed, InvalidFrame), (frame, parsed)
    body, top, message = read
    assert body == frame and top == peek(parsed) and message == orjson.loads(frame)
    # The session takes the frontend's decoded message as it takes the bytes, and reads the raw params of a call
    # only from a frame the one reading accepted.
    assert session().receive_frame(frame, message) == session().receive_frame(frame)
    raw = raw_request_of(frame, message, MAX_BYTES)
    if raw is not None:
        assert type(parsed) is Request and (raw.id, raw.method) == (parsed.id, parsed.method)
        assert {key: orjson.loads(bytes(value)) for key, value in raw.params.items()} == parsed.params


@PROPERTY
@given(FRAMES)
def test_the_http_frontend_and_the_session_give_every_frame_one_verdict(loop: asyncio.AbstractEventLoop,
                                                                        frame: bytes) -> None:
    agree(frame, loop)


@PROPERTY
@given(st.sampled_from(TRANSFORMS), st.sampled_from([b"NaN", b"Infinity", b"1e400", b'"\\ud800"', b"1" + b"0" * 400,
                                                     b"123456789012345678901234567890"]), NESTED)
def test_calls_carrying_the_edge_cases_get_one_verdict(loop: asyncio.AbstractEventLoop, transform, scalar: bytes,
                                                       nested: bytes) -> None:
    for arguments in (b'{"a":' + scalar + b"}", b'{"a":' + nested + b"}", b'{"a":[' + scalar + b"," + nested + b"]}"):
        agree(transform(b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","arguments":'
                        + arguments + b"}}"), loop)


def test_a_blank_body_is_refused_while_a_blank_line_is_no_frame(loop: asyncio.AbstractEventLoop) -> None:
    """A body is one message, so an empty or blank one is a parse error; on stdio a blank line is framing, not a
    frame, and has no answer."""
    for blank in (b"", b" ", b"\r\n"):
        read = http_reading(blank, loop)
        assert isinstance(read, HttpError) and (read.status, read.code) == (400, -32700)
        assert isinstance(read_frame(blank), InvalidFrame)
        assert session().receive_frame(blank) == []
