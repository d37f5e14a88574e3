"""``peek`` reads the top of a frame without building its result; what it says must be what the whole message,
decoded, says."""

from __future__ import annotations

import json

import orjson
import pytest

from bastion.frontends.http.exchanges import Peeked, peek

FRAMES = [
    b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hi"}]}}',
    b'{"jsonrpc":"2.0","id":"a","error":{"code":-32001,"message":"refused"}}',
    b'{"jsonrpc":"2.0","id":7,"error":{"code":"not a number","message":"odd"}}',
    b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1}}',
    b'{"jsonrpc":"2.0","id":"bastion-1","method":"sampling/createMessage","params":{"messages":[]}}',
    b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}',
    b'{"id":null,"error":null}',
    b'{"id":1}',
    b'{"result":{}}',
    b'{"method":null,"id":1,"result":{}}',
    b'{"method":7,"params":{}}',
    b'{"id":123456789012345678901234567890,"result":{"n":123456789012345678901234567890}}',
    b'{"jsonrpc":"2.0","id":2,"result":[]}',
    b'[{"jsonrpc":"2.0","id":1,"result":{}}]',
    b'"a string"',
    b"not json",
    b"",
]


def whole_message(frame: bytes) -> Peeked:
    """What ``peek`` says of the message decoded in full (the way it read every frame before)."""
    try:
        message = orjson.loads(frame)
    except orjson.JSONDecodeError:
        try:
            message = json.loads(frame)
        except ValueError:
            return Peeked("invalid")
    return peek(message) if isinstance(message, dict) else Peeked("invalid")


@pytest.mark.parametrize("frame", FRAMES)
def test_peek_of_the_bytes_says_what_the_decoded_message_says(frame: bytes) -> None:
    assert peek(frame) == whole_message(frame)


def test_a_large_result_is_peeked_as_the_response_it_is() -> None:
    result = {"content": [{"type": "text", "text": "x" * 1_000_000}], "structuredContent": {"rows": list(range(1000))}}
    frame = orjson.dumps({"jsonrpc": "2.0", "id": 42, "result": result})
    assert peek(frame) == Peeked("response", 42)
    assert peek(bytearray(frame)) == Peeked("response", 42)
    assert peek(memoryview(frame)) == Peeked("response", 42)
