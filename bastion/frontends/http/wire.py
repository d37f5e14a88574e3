"""What the HTTP frontend reads and writes on the wire, below its routes: the ASGI types, the error that answers a
request before it reaches the gateway, a request's headers and its one JSON-RPC message (size and time bounded),
and the JSON, empty and lifespan answers."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import orjson

from bastion.frontends.http.exchanges import Peeked, peek
from bastion.frontends.http.guards import is_json_content
from bastion.protocol.jsonrpc import DEFAULT_MAX_MESSAGE_BYTES, INVALID_REQUEST, InvalidFrame, parse_message, read_frame

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

NO_STORE = (b"cache-control", b"private, no-store")


class HttpError(Exception):
    """A request answered with an HTTP status and a JSON-RPC error, before it reaches the gateway."""

    def __init__(self, status: int, code: int, message: str, request_id: Any = None,
                 headers: tuple[tuple[bytes, bytes], ...] = (), data: Any = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.request_id, self.headers = status, code, message, request_id, headers
        self.data = data


class Gone(Exception):
    """The client disconnected while sending its request."""


async def read_body(headers: dict[str, str], receive: Receive, limit: int, body_timeout: float) -> bytes:
    """The request's body, refused past ``limit`` bytes (http.max_body_bytes) or ``body_timeout`` seconds."""
    declared = headers.get("content-length")
    # ASCII digits only (str.isdigit admits "²", which int refuses); past 18 digits it is over any limit
    if declared is not None and declared.isascii() and declared.isdigit() and (
            len(declared) > 18 or int(declared) > limit):
        size_said = declared if len(declared) <= 18 else "over 10^18"
        raise HttpError(413, -32600, f"the request body of {size_said} bytes exceeds the limit of {limit} bytes "
                                     "(http.max_body_bytes)")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(body_timeout):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise Gone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise HttpError(413, -32600, f"the request body exceeds the limit of {limit} bytes "
                                                 "(http.max_body_bytes)")
                chunks.append(chunk)
                if not message.get("more_body"):
                    break
    except TimeoutError:
        raise HttpError(408, -32600, f"the request body did not arrive within {body_timeout:g} s "
                                     "(http.body_timeout)") from None
    return b"".join(chunks)


async def read_message(headers: dict[str, str], receive: Receive, limit: int, body_timeout: float,
                       max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> tuple[bytes, Peeked, dict[str, Any]]:
    """The request's one JSON-RPC message: its bytes, what it is, and it decoded, for the session to take without
    reading the bytes again.

    The body is read as every transport reads a client's frame (``read_frame``, then ``parse_message``), so it is
    accepted or refused here exactly as a client session over stdio accepts or refuses the same bytes, and refused
    with the error that session would send (status 400; 413 past ``max_message_bytes``): nothing the session would
    refuse reaches it, so no refused request is registered as in flight."""
    if not is_json_content(headers.get("content-type")):
        raise HttpError(415, -32600, f"Content-Type {headers.get('content-type', '(none)')!r}: a request body is "
                                     "one JSON-RPC message as application/json")
    body = await read_body(headers, receive, limit, body_timeout)
    value = read_frame(body, max_message_bytes)
    parsed = value if type(value) is InvalidFrame else parse_message(value)
    if type(parsed) is InvalidFrame:
        reply = parsed.reply
        status = 413 if len(body) > max_message_bytes else 400
        if reply is None:  # a malformed response: a stream would not answer it, but a POST is answered
            raise HttpError(status, INVALID_REQUEST, f"Invalid response: {parsed.reason}")
        raise HttpError(status, reply.error["code"], reply.error["message"], reply.id)
    return body, peek(parsed), value


def headers_of(scope: Scope) -> dict[str, str]:
    headers: dict[str, str] = {}
    repeated: dict[str, list[str]] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1").strip()  # whitespace around a field value is not part of it (RFC 9110)
        if name in headers:
            repeated.setdefault(name, [headers[name]]).append(value)
        headers[name] = value
    for name, values in repeated.items():  # joined once: a field repeated n times costs n, not n squared
        headers[name] = ", ".join(values)
    return headers


def error_body(request_id: Any, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": error})


async def json_response(send: Send, status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = (),
                        cache: str | None = None) -> None:
    try:
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"cache-control", cache.encode()) if cache is not None else NO_STORE, *headers]})
        await send({"type": "http.response.body", "body": body})
    except OSError:
        pass


async def empty_response(send: Send, status: int, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    try:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", b"0"), *headers]})
        await send({"type": "http.response.body", "body": b""})
    except OSError:
        pass


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
