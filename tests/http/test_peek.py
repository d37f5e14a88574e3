"""``peek`` says what a message is for routing its POST, from the session's own classification of it: the HTTP
frontend has no reading of its own (what it refuses, and that it refuses exactly what the session does, is
tests/protocol/test_one_reading.py's)."""

from __future__ import annotations

import orjson
import pytest

from bastion.frontends.http.exchanges import Peeked, peek
from bastion.protocol.jsonrpc import InvalidFrame, parse_frame

MESSAGES = [
    (b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hi"}]}}', Peeked("response", 1)),
    (b'{"jsonrpc":"2.0","id":"a","error":{"code":-32001,"message":"refused"}}', Peeked("response", "a",
                                                                                     error_code=-32001)),
    (b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"no"}}', Peeked("response", None,
                                                                                 error_code=-32700)),
    (b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1}}',
     Peeked("notification", None, "notifications/progress", {"progressToken": "t", "progress": 1})),
    (b'{"jsonrpc":"2.0","id":"bastion-1","method":"sampling/createMessage","params":{"messages":[]}}',
     Peeked("request", "bastion-1", "sampling/createMessage", {"messages": []})),
    (b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}',
     Peeked("notification", None, "notifications/tools/list_changed")),
    (b'{"jsonrpc":"2.0","id":18446744073709551615,"method":"ping"}', Peeked("request", 2**64 - 1, "ping")),
]


@pytest.mark.parametrize("frame, expected", MESSAGES)
def test_peek_says_what_the_parsed_message_is(frame: bytes, expected: Peeked) -> None:
    message = parse_frame(frame)
    assert not isinstance(message, InvalidFrame)
    assert peek(message) == expected


def test_a_large_result_is_peeked_as_the_response_it_is() -> None:
    result = {"content": [{"type": "text", "text": "x" * 1_000_000}], "structuredContent": {"rows": list(range(1000))}}
    message = parse_frame(orjson.dumps({"jsonrpc": "2.0", "id": 42, "result": result}))
    assert not isinstance(message, InvalidFrame)
    assert peek(message) == Peeked("response", 42)
