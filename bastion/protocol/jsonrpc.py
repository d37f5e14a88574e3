"""JSON-RPC 2.0 framing and validation, as MCP uses it: one message per frame, no batches.

Everything here works on bytes and plain objects; nothing reads or writes a transport.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, TypeVar, Union

import msgspec
import orjson

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Implementation-defined range (-32000 … -32019).
SERVER_BUSY = -32000  # queue or rate limit reached; data.retryAfterSeconds says when to retry
UPSTREAM_UNAVAILABLE = -32001  # the server that owns the request is down or crashed
REQUEST_TIMEOUT = -32003
RESOURCE_NOT_FOUND = -32002  # legacy; 2026-07-28 uses INVALID_PARAMS
HEADER_MISMATCH = -32020
MISSING_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022

DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
# How deep a client's message may nest arrays and objects, the message itself the first level. Well within what
# everything that handles its values can take: orjson writes no more than 254 levels (and a value Bastion passes on
# sits a few levels deeper in the frame it writes than in the one it read), msgspec and Python's recursion about
# a thousand. As System.Text.Json's default.
MAX_DEPTH = 64

RequestId = Union[str, int]
_ABSENT: Any = object()  # a key missing from a message, told apart from one present with the value null


@dataclass(slots=True)
class Request:
    id: RequestId
    method: str
    params: dict[str, Any] | None


@dataclass(slots=True)
class Notification:
    method: str
    params: dict[str, Any] | None


@dataclass(slots=True)
class Response:
    id: RequestId
    result: dict[str, Any]


@dataclass(slots=True)
class ErrorResponse:
    id: RequestId | None
    error: dict[str, Any]


Message = Union[Request, Notification, Response, ErrorResponse]


@dataclass(slots=True)
class RawResponse:
    """A success response whose result is still the JSON it arrived as.

    A result that only passes through Bastion need never become Python objects: it is sent on as the same bytes,
    under the id its requester used, at a fraction of the cost of decoding and re-encoding it (and without the
    object tree of a large result). ``decoded()`` gives the ordinary ``Response`` for anything that looks inside.
    """

    id: RequestId
    result: msgspec.Raw  # the exact bytes of the result object
    frame: bytes  # the whole frame it arrived in, for byte searches

    def decoded(self) -> Response | ErrorResponse:
        """The ordinary response, or an error saying why the result cannot be held as Python objects (valid JSON
        that orjson refuses, such as a number too large for a float)."""
        parsed = parse_frame(self.frame, len(self.frame), max_depth=None)
        if type(parsed) is Response:
            return parsed
        reason = parsed.reason if type(parsed) is InvalidFrame else "not a response"
        return ErrorResponse(self.id, error(INTERNAL_ERROR, f"the server's result could not be read: {reason}"))

    def reframed(self, request_id: RequestId) -> bytes:
        """This response as a frame answering ``request_id``."""
        return b"".join((_RESULT_HEAD, orjson.dumps(request_id), _RESULT_MIDDLE, self.result, _RESULT_TAIL))


_RESULT_HEAD = b'{"jsonrpc":"2.0","id":'
_RESULT_MIDDLE = b',"result":'
_RESULT_TAIL = b"}\n"
_NO_RAW = msgspec.Raw()


class _ResponseShape(msgspec.Struct, gc=False):
    """A success response with an integer id. Decoding into it checks the whole frame's JSON syntax, and keeps the
    result as bytes; members it does not name are skipped, as ``parse_message`` ignores them."""

    jsonrpc: Literal["2.0"]
    id: int
    result: msgspec.Raw
    method: msgspec.Raw = _NO_RAW  # present: a request after all
    error: msgspec.Raw = _NO_RAW  # present as well as a result: invalid


_decode_response_shape = msgspec.json.Decoder(_ResponseShape).decode


# What a session hands its transport with each frame it sends: the message the frame is.
Outgoing = Union[Message, RawResponse]


@dataclass(slots=True)
class RawRequest:
    """A request whose params are decoded one level deep: each member's value is still the JSON it arrived as.

    Enough to route a call (its name) and to send it on (``raw_request_frame``) without decoding the arguments
    and encoding them again.
    """

    id: RequestId
    method: str
    params: dict[str, msgspec.Raw]


class _RequestShape(msgspec.Struct, gc=False):
    jsonrpc: Literal["2.0"]
    id: Union[int, str]
    method: str
    params: dict[str, msgspec.Raw]


_decode_request_shape = msgspec.json.Decoder(_RequestShape).decode
_Shape = TypeVar("_Shape", _ResponseShape, _RequestShape)
_encode_with_raw = msgspec.json.Encoder().encode
_decode_string = msgspec.json.Decoder(str).decode
_OBJECT_START = ord("{")


@dataclass(frozen=True, slots=True)
class InvalidFrame:
    """A frame that is not a valid message. ``reply`` is the error response owed to the sender, if any."""

    reason: str
    reply: ErrorResponse | None


def is_valid_id(value: Any) -> bool:
    # bool is a subclass of int in Python but never a valid JSON-RPC id.
    return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)


def read_frame(frame: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
               max_depth: int | None = MAX_DEPTH) -> Any | InvalidFrame:
    """The one reading of a client's frame, whatever carried it (a line on stdio, an HTTP body): its JSON value, or
    why it is refused.

    Accepted: one JSON text (RFC 8259) in UTF-8 with no byte order mark, within ``max_bytes`` and nested at most
    ``max_depth`` levels of arrays and objects (the message itself is the first). Refused with -32700: malformed
    JSON or UTF-8, ``NaN`` and ``Infinity`` (not JSON), a number too large for a double (``1e400``, an integer of
    more than 309 digits), an escaped lone surrogate (``"\\ud800"``, no text), a byte order mark, UTF-16 and
    UTF-32. Refused with -32600: a frame over ``max_bytes`` or nested deeper than ``max_depth``, each naming its
    limit. An integer wider than 64 bits is valid JSON and is read (as the nearest double, as orjson reads it).
    ``max_depth`` None leaves only orjson's own bound (1,024 levels), for the frames of servers."""
    if len(frame) > max_bytes:
        reason = f"message of {len(frame)} bytes exceeds the limit of {max_bytes} bytes"
        return InvalidFrame(reason, ErrorResponse(None, {"code": INVALID_REQUEST, "message": reason}))
    try:
        value = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        text = str(exc)
        if max_depth is not None and text.startswith("depth limit exceeded"):  # deeper than orjson reads (1,024)
            return _too_deep(None, max_depth)
        if "byte order mark" in text:
            reason = "malformed JSON: a byte order mark (BOM) begins it; a JSON text in UTF-8 has none"
        elif "utf-8" in text.lower():
            reason = "invalid UTF-8"
        else:
            reason = f"malformed JSON: {text}"
        return InvalidFrame(reason, ErrorResponse(None, {"code": PARSE_ERROR, "message": f"Parse error: {reason}"}))
    kind = type(value)
    if (max_depth is not None and (kind is dict or kind is list) and _may_nest_deeper(frame, max_depth)
            and _deeper_than(value, max_depth - 1)):
        return _too_deep(value, max_depth)
    return value


def parse_frame(frame: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                max_depth: int | None = MAX_DEPTH) -> Message | InvalidFrame:
    """Parse one frame (without its newline) into a message, or say why it is not one (``read_frame``, then
    ``parse_message``)."""
    value = read_frame(frame, max_bytes, max_depth)
    if type(value) is InvalidFrame:
        return value
    return parse_message(value)


_COUNTED_BELOW = 1 << 16  # frames this small have their brackets counted first: far cheaper than a walk


def _may_nest_deeper(frame: bytes, max_depth: int) -> bool:
    """False when ``frame`` is too short, or has too few ``[`` and ``{``, to nest deeper than ``max_depth``: most
    frames, at the cost of two counts in C instead of a walk of the decoded value."""
    if len(frame) <= 2 * max_depth:
        return False
    return len(frame) > _COUNTED_BELOW or frame.count(b"[") + frame.count(b"{") > max_depth


def _deeper_than(container: dict[str, Any] | list[Any], room: int) -> bool:
    """Whether ``container`` holds arrays or objects more than ``room`` levels below itself."""
    for child in container.values() if type(container) is dict else container:  # type: ignore[union-attr]
        kind = type(child)
        if kind is dict or kind is list:
            if room == 0 or (child and _deeper_than(child, room - 1)):
                return True
    return False


def _too_deep(value: Any, max_depth: int) -> InvalidFrame:
    """The refusal of a message nested deeper than ``max_depth``: a request's names its id; a response, which is
    never answered, gets none."""
    reason = (f"nested deeper than {max_depth} levels of arrays and objects (the message itself is the first), the "
              "most Bastion reads")
    if type(value) is dict and "method" not in value:
        return InvalidFrame(reason, None)
    request_id = value.get("id") if type(value) is dict else None
    return _invalid(request_id if is_valid_id(request_id) else None, reason)


def parse_raw_response(frame: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> RawResponse | None:
    """The frame as a ``RawResponse`` when it is a valid success response with an integer id (the answer to every
    request Bastion sends a server), else None: ``parse_frame`` then says what the frame is.

    Valid means what ``parse_frame`` would accept: well-formed JSON in UTF-8, ``jsonrpc`` "2.0", an object result
    and no ``method`` or ``error``.
    """
    shape = _shape_of(frame, max_bytes, _decode_response_shape)
    if shape is None or shape.method or shape.error or memoryview(shape.result)[0] != _OBJECT_START:
        return None
    return RawResponse(shape.id, shape.result, frame)


def parse_raw_request(frame: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> RawRequest | None:
    """The frame as a ``RawRequest`` when it is a request with params, else None. Its values are not read, so it
    takes some frames ``read_frame`` refuses (a number no double holds, nesting past the limit, an id wider than 64
    bits): a client's frame is read with it only once that reading has accepted it (``raw_request_of``)."""
    shape = _shape_of(frame, max_bytes, _decode_request_shape)
    if shape is None or not shape.method:
        return None
    return RawRequest(shape.id, shape.method, shape.params)


def raw_request_of(frame: bytes, value: Any, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Request | None:
    """``frame``, which ``read_frame`` read as ``value`` (and so accepted), as a request whose params' values are
    still the JSON the client sent (``parse_raw_request``), when it is a valid request with params; else None. The
    verdict is the one reading's: ``parse_raw_request`` alone reads what orjson refuses (``1e400``, nesting past the
    limit, an id wider than 64 bits), so it reads only a frame that reading accepted, and its id and method are the
    message's."""
    if type(value) is not dict:
        return None
    message = parse_message(value)
    if type(message) is not Request or message.params is None:
        return None
    raw = parse_raw_request(frame, max_bytes)
    if raw is None or raw.id != message.id or type(raw.id) is not type(message.id) or raw.method != message.method:
        return None
    return Request(message.id, message.method, raw.params)  # type: ignore[arg-type]


def _shape_of(frame: bytes, max_bytes: int, decode: Callable[[bytes], _Shape]) -> _Shape | None:
    """``decode(frame)`` for a frame within the limit, well-formed and in UTF-8 throughout; else None."""
    if len(frame) > max_bytes:
        return None
    try:
        shape = decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):  # nested past Python's recursion
        return None
    # The decoder does not check the UTF-8 inside the strings it skips: all of those in the raw values.
    if not frame.isascii():
        try:
            frame.decode()
        except UnicodeDecodeError:
            return None
    return shape


def raw_string(value: msgspec.Raw | None) -> str | None:
    """A raw JSON value that is a string, decoded; None for anything else."""
    if value is None:
        return None
    try:
        return _decode_string(value)
    except msgspec.ValidationError:
        return None


def parse_message(value: Any) -> Message | InvalidFrame:
    """Classify an already-decoded JSON value as a JSON-RPC message."""
    # Exact type checks: a decoded JSON value is never a subclass, and bool (an int subclass) is never an id.
    if type(value) is not dict:
        if isinstance(value, list):
            return _invalid(None, "batches are not supported; send one message per frame")
        return _invalid(None, "a message must be a JSON object")
    method = value.get("method", _ABSENT)
    if method is _ABSENT:
        # Responses are never answered, however malformed: two peers must not bounce errors at each other.
        return _parse_response(value)
    raw_id = value.get("id", _ABSENT)
    has_id = raw_id is not _ABSENT
    if has_id and type(raw_id) is not int and type(raw_id) is not str:
        return _invalid(None, "id must be a string or an integer")
    reply_id = raw_id if has_id else None
    if value.get("jsonrpc") != "2.0":
        return _invalid(reply_id, 'jsonrpc must be "2.0"')
    if type(method) is not str or not method:
        return _invalid(reply_id, "method must be a non-empty string")
    params = value.get("params")
    if params is not None and type(params) is not dict:
        return _invalid(reply_id, "params must be an object")
    if has_id:
        return Request(raw_id, method, params)
    return Notification(method, params)


def _parse_response(value: dict[str, Any]) -> Message | InvalidFrame:
    if value.get("jsonrpc") != "2.0":
        return InvalidFrame('a response must carry jsonrpc "2.0"', None)
    raw_id = value.get("id", _ABSENT)
    if raw_id is _ABSENT:
        return InvalidFrame("neither a request, a notification nor a response", None)
    result = value.get("result", _ABSENT)
    has_error = "error" in value
    if (result is not _ABSENT) == has_error:
        return InvalidFrame("a response must carry exactly one of result and error", None)
    if result is not _ABSENT:
        if type(raw_id) is not int and type(raw_id) is not str:
            return InvalidFrame("a result's id must be a string or an integer", None)
        if type(result) is not dict:
            return InvalidFrame("result must be an object", None)
        return Response(raw_id, result)
    if raw_id is not None and not is_valid_id(raw_id):
        return InvalidFrame("an error's id must be a string, an integer or null", None)
    error = value["error"]
    code = error.get("code") if isinstance(error, dict) else None
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(error.get("message"), str):
        return InvalidFrame("error must be an object with an integer code and a string message", None)
    return ErrorResponse(raw_id, error)


def _invalid(reply_id: RequestId | None, reason: str) -> InvalidFrame:
    return InvalidFrame(reason, ErrorResponse(reply_id, {"code": INVALID_REQUEST, "message": f"Invalid request: {reason}"}))


_NEWLINE_AFTER = orjson.OPT_APPEND_NEWLINE


def request_frame(request_id: RequestId, method: str, params: dict[str, Any] | None) -> bytes:
    """A request as one frame, with no ``Request`` built first: Bastion sends one for every call it forwards."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return orjson.dumps(message, option=_NEWLINE_AFTER)


def raw_request_frame(request_id: RequestId, method: str, params: dict[str, Any]) -> bytes:
    """``request_frame`` for params whose values may be ``msgspec.Raw`` (written as they are)."""
    return _encode_with_raw({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}) + b"\n"


def request_encoder(params: Mapping[str, Any]) -> Callable[[RequestId, str, Any], bytes]:
    """How to frame a request with ``params``: as they are, when they still hold the client's raw JSON values
    (a call whose params nothing in the chain reads), else the ordinary way."""
    for value in params.values():
        if type(value) is msgspec.Raw:
            return raw_request_frame
    return request_frame


def encode(message: Message) -> bytes:
    """Serialize a message as one newline-terminated frame (orjson never emits raw newlines)."""
    kind = type(message)
    if kind is Response:
        return orjson.dumps({"jsonrpc": "2.0", "id": message.id, "result": message.result}, option=_NEWLINE_AFTER)
    if kind is Request:
        return request_frame(message.id, message.method, message.params)
    if kind is Notification:
        out: dict[str, Any] = {"jsonrpc": "2.0", "method": message.method}
        if message.params is not None:
            out["params"] = message.params
        return orjson.dumps(out, option=_NEWLINE_AFTER)
    return orjson.dumps({"jsonrpc": "2.0", "id": message.id, "error": message.error}, option=_NEWLINE_AFTER)


def error(code: int, message: str, data: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        out["data"] = data
    return out


# ------------------------------------------------------------------------------ a frame too large to read
NOT_READ: Any = object()  # a member whose value is an object or an array: present, not read
_WHITESPACE = b" \t\r\n"
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_SCALAR = re.compile(rb'(?:"(?:[^"\\]|\\.)*"|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null)'
                     rb'(?=[ \t\r\n,}])')
_SCALAR_AT_END = re.compile(rb'(?:-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null)\Z')


def edge_members(head: bytes, tail: bytes) -> dict[str, Any] | None:
    """The top-level members of a JSON object that can be read from its first bytes (``head``) and its last
    (``tail``, b"" when the end is not known), without the middle: a message too large to parse whole.

    From the head, members are read in order up to the first whose value is an object or an array (its key is
    there, with the value ``NOT_READ``); from the tail, backwards, up to the first such value. ``{"jsonrpc":
    "2.0", "id": 7, "result": {...`` gives ``jsonrpc``, ``id`` and ``result``; so does ``...}, "jsonrpc": "2.0",
    "id": 7}`` once the head gives ``result``. What is read is exact for any valid JSON (a string's closing
    quote is told from an escaped one); None when the two ends disagree about a member.
    """
    members = _head_members(head)
    for name, value in _tail_members(tail).items():
        if name in members and members[name] != value and NOT_READ not in (members[name], value):
            return None
        if members.get(name, NOT_READ) is NOT_READ:
            members[name] = value
    return members


def _head_members(head: bytes) -> dict[str, Any]:
    members: dict[str, Any] = {}
    at = _skip(head, 0)
    if head[at:at + 1] != b"{":
        return members
    at += 1
    while True:
        key = _STRING.match(head, _skip(head, at))
        if key is None:
            return members
        at = _skip(head, key.end())
        if head[at:at + 1] != b":":
            return members
        at = _skip(head, at + 1)
        value = _SCALAR.match(head, at)
        try:
            name = orjson.loads(key.group())
            if value is None:
                if head[at:at + 1] in (b"{", b"["):
                    members[name] = NOT_READ
                return members
            members[name] = orjson.loads(value.group())
        except orjson.JSONDecodeError:
            return members
        at = _skip(head, value.end())
        if head[at:at + 1] != b",":
            return members
        at += 1


def _tail_members(tail: bytes) -> dict[str, Any]:
    members: dict[str, Any] = {}
    end = _skip_back(tail, len(tail))
    if tail[end - 1:end] != b"}":
        return members
    end -= 1
    while True:
        end = _skip_back(tail, end)
        if tail[end - 1:end] == b'"':
            start = _string_start(tail, end)
        else:
            found = _SCALAR_AT_END.search(tail, 0, end)
            start = found.start() if found is not None else None
        if start is None:  # an object or an array, or cut by the start of the tail
            return members
        value = tail[start:end]
        end = _skip_back(tail, start)
        if tail[end - 1:end] != b":":
            return members
        end = _skip_back(tail, end - 1)
        key_start = _string_start(tail, end) if tail[end - 1:end] == b'"' else None
        if key_start is None:
            return members
        try:
            members[orjson.loads(tail[key_start:end])] = orjson.loads(value)
        except orjson.JSONDecodeError:
            return members
        end = _skip_back(tail, key_start)
        if tail[end - 1:end] != b",":
            return members
        end -= 1


def _skip(data: bytes, at: int) -> int:
    while at < len(data) and data[at] in _WHITESPACE:
        at += 1
    return at


def _skip_back(data: bytes, end: int) -> int:
    while end > 0 and data[end - 1] in _WHITESPACE:
        end -= 1
    return end


def _string_start(data: bytes, end: int) -> int | None:
    """Where the string that ends (with its closing quote) at ``end`` starts: the quote before it that no
    backslash escapes. None when that cannot be told from ``data`` alone."""
    at = end - 1
    while True:
        at = data.rfind(b'"', 0, at)
        if at <= 0:
            return None
        escapes = at
        while escapes > 0 and data[escapes - 1] == 0x5C:  # a backslash
            escapes -= 1
        if escapes == 0:
            return None  # a run of backslashes reaching the start: whether it escapes the quote is not known
        if (at - escapes) % 2 == 0:
            return at
