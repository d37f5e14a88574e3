"""Differential: the HTTP frontend's reading of a POST body (``wire.read_message``) and the stdio reading of the
same bytes as a line (``LineFramer``, then ``ServerSession.receive_frame``) give one verdict on every input, as
issue 28 item 5 made them one parser: both accept it as the same message, or both refuse it with the same code,
message and id. Blank input is the one documented difference: a blank line is no message on stdio, an empty POST
body is malformed JSON. (A body ending in CR is left out of the stdio side: there the CR is the line's ending, not
part of the message, so it moves a parse error's position and does not count toward the size limit.)"""

from __future__ import annotations

import asyncio
from typing import Any

import atheris

from bastion.frontends.http.exchanges import peek
from bastion.frontends.http.wire import HttpError, read_message
from bastion.protocol.framing import LineFramer
from bastion.protocol.jsonrpc import InvalidFrame, parse_frame, read_frame
from bastion.protocol.server_session import Invalid, Send, ServerSession
from tests.fuzz.common import same_json

_loop: list[asyncio.AbstractEventLoop] = []


def setup() -> None:
    _loop.append(asyncio.new_event_loop())  # one loop for every input: a loop per input would be most of the cost


async def _http(body: bytes, limit: int) -> Any:
    chunks = [body[:len(body) // 2], body[len(body) // 2:]]

    async def receive() -> dict[str, Any]:
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    try:
        return await read_message({"content-type": "application/json"}, receive, 1 << 20, 5.0, limit)
    except HttpError as error:
        return error


def one_input(data: bytes) -> None:
    if not _loop:
        setup()
    limit = 1 + (data[0] * 7 if data else 0)
    body = data[1:]
    http = _loop[0].run_until_complete(_http(body, limit))
    parsed = parse_frame(body, limit)
    if type(http) is HttpError:
        assert type(parsed) is InvalidFrame, (body, http.message)
        if parsed.reply is not None:
            reply = parsed.reply
            assert (http.code, http.message, http.request_id) == (reply.error["code"], reply.error["message"],
                                                                  reply.id), (body, http.message, reply)
        assert http.status == (413 if len(body) > limit else 400)
    else:
        assert type(parsed) is not InvalidFrame, (body, parsed)
        _, peeked, value = http
        assert peeked == peek(parsed) and same_json(value, read_frame(body, limit)), body
    if b"\n" in body or body.endswith(b"\r"):
        return  # not one line; or a line whose CR the framer takes as its line ending, not as JSON's whitespace
    framer = LineFramer(limit)
    frames = framer.feed(body + b"\n")
    assert len(frames) == 1
    line = frames[0]
    if not isinstance(line, bytes):  # dropped by the framer as over the limit: so was the body
        assert type(http) is HttpError and http.status == 413, body
        return
    if not line or line.isspace():
        return  # a blank line: no message on stdio
    events = ServerSession(server_info={"name": "b"}, max_message_bytes=limit).receive_frame(line)
    refused = [e for e in events if type(e) is Invalid]
    sent = [e.message for e in events if type(e) is Send]
    if type(http) is HttpError:
        assert refused, (body, events)
        if type(parsed) is InvalidFrame and parsed.reply is not None:
            assert len(sent) == 1 and sent[0].id == http.request_id and sent[0].error["code"] == http.code
            assert sent[0].error["message"] == http.message, (body, sent, http.message)
    else:
        assert not refused, (body, events)
