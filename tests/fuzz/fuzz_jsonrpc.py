"""The JSON-RPC reader (``read_frame``, ``parse_frame``) and its fast paths, on raw bytes.

Oracle: a frame is either a message that re-encodes to a frame parsed as an equal message, or an ``InvalidFrame``
whose reply (if any) is -32700 or -32600 with a valid id or null; what is accepted is what Python's own strict
JSON reader accepts, with an equal value (orjson and the stdlib never disagree silently); the fast readers
(``parse_raw_response``, ``raw_request_of``) agree with ``parse_frame`` whenever they answer; and
``edge_members`` reads only true members from a frame's two ends."""

from __future__ import annotations

import json
from typing import Any

from bastion.protocol import jsonrpc
from bastion.protocol.jsonrpc import (
    NOT_READ,
    ErrorResponse,
    InvalidFrame,
    Notification,
    Request,
    Response,
    edge_members,
    parse_frame,
    parse_raw_response,
    raw_request_of,
    read_frame,
)
from tests.fuzz.common import same_json

LIMIT = 3000
MESSAGES = (Request, Notification, Response, ErrorResponse)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Duplicate
    return out


class _Duplicate(Exception):
    pass


def _stdlib(frame: bytes) -> Any:
    """The value Python's json reads, or why not; its nesting is Python's to bound, not ours."""
    try:
        if frame[:3] == b"\xef\xbb\xbf":
            return ValueError("BOM")
        return json.loads(frame.decode("utf-8"), parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:
        return exc


def one_input(frame: bytes) -> None:
    value = read_frame(frame, LIMIT)
    message = parse_frame(frame, LIMIT)
    if type(value) is InvalidFrame:
        assert message == value
        reply = value.reply
        if reply is not None:
            assert reply.error["code"] in (jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST), reply
            assert reply.id is None or jsonrpc.is_valid_id(reply.id)
    else:
        theirs = _stdlib(frame)
        assert not isinstance(theirs, Exception), (frame[:200], theirs)  # we never accept what is not JSON
        assert same_json(value, theirs), (frame[:200], value, theirs)
    assert type(message) in MESSAGES or type(message) is InvalidFrame, message
    if type(message) in MESSAGES:
        again = parse_frame(jsonrpc.encode(message)[:-1], LIMIT * 4)
        assert type(again) is type(message) and same_json(_fields(again), _fields(message)), (message, again)
    raw = parse_raw_response(frame, LIMIT)
    if raw is not None:
        assert type(message) is Response and message.id == raw.id, (frame[:200], message)
        assert same_json(json.loads(bytes(raw.result)), message.result)
    if type(value) is not InvalidFrame:
        request = raw_request_of(frame, value, LIMIT)
        if request is not None:
            assert type(message) is Request and (request.id, request.method) == (message.id, message.method)
            assert type(request.id) is type(message.id)
            decoded = {k: json.loads(bytes(v)) for k, v in request.params.items()}
            assert same_json(decoded, message.params)
        _edges_agree(frame, value)


def _fields(message: Any) -> list[Any]:
    return [getattr(message, name) for name in message.__slots__]


def _edges_agree(frame: bytes, value: Any) -> None:
    if type(value) is not dict:
        return
    try:
        json.loads(frame.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _Duplicate:
        return  # the two ends may each see another of the same name's members: not a message
    for cut in (1, 7, 64, 256, len(frame)):
        members = edge_members(frame[:cut], frame[-cut:])
        if members is None:
            continue
        for name, seen in members.items():
            assert name in value, (frame[:200], name)
            if seen is NOT_READ:
                assert type(value[name]) in (dict, list), (frame[:200], name)
            else:
                assert same_json(seen, value[name]), (frame[:200], name, seen, value[name])
