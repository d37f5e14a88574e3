"""Every string of a message that reaches the client, found in one place so every scanner reads the same ones.

``text_slots(method, message)`` walks a whole message body (a result, a notification's params, a server's request
params, an error object, one definition of a list) and yields a ``TextSlot`` for every string in it: every value
and every key of every object, at any depth, in document order. A slot says where it is (``content[2].text``,
``structuredContent.rows[0] (key)``) and can replace its string in place, so a redaction keeps the structure the
client expects (a renamed key keeps its place among its siblings). Beside the text itself:

- a base64 payload (``blob`` of a resource, ``data`` of an image or audio block or of anything with a ``mimeType``)
  yields its string as text and, when it decodes, a second slot of the decoded bytes (``... (decoded)``), base64 or
  base64url, padded or not; a payload of more than ``MAX_DECODED_BLOB`` decoded bytes, or past the message's
  ``MAX_DECODED_TOTAL``, is read as text only. A replacement of decoded bytes is encoded again in the payload's own
  alphabet. One decode serves every scanner of the message (a few recent payloads are kept decoded).
- the text fields of consecutive ``type: "text"`` blocks of one content list share a ``run``, so a scanner can read
  them joined and find a value split across blocks.
- opaque protocol tokens the client echoes and no model reads are left alone: ``progressToken`` (of a notification
  and of a ``_meta``), ``nextCursor``, ``cursor`` and ``requestState`` at the top of a message.

The walk is bounded: past ``MAX_DEPTH`` nested containers, or ``MAX_NODES`` values, what is left unread is yielded as
``unscannable`` slots, whose ``replace`` withholds that part (the too-deep container, the rest of each open container)
so a guardrail can fail closed: redact or refuse per its mode, never pass unread content on.
"""

from __future__ import annotations

import base64
import binascii
import re
import threading
from collections import OrderedDict
from typing import Any, Iterator, MutableMapping, MutableSequence

MAX_DEPTH = 128  # nested objects and arrays below the message itself
MAX_NODES = 500_000  # keys and values visited in one message
MAX_DECODED_BLOB = 256 * 1024  # bytes decoded of one base64 payload
MAX_DECODED_TOTAL = 8 * 1024 * 1024  # bytes decoded in one message
UNSCANNABLE = "[withheld: beyond Bastion's scanning bounds]"
# Bastion's answers to a client that carry the servers' own words: their ``instructions``.
INSTRUCTED = frozenset({"initialize", "server/discover"})
UNSCANNABLE_KEY = "bastion:withheld"

# Field names of the protocol whose strings are the text itself: a value under one of them is not "filed under a
# name" the way ``{"password": "..."}`` is (see ``TextSlot.name``).
_PROTOCOL_FIELDS = frozenset({
    "text", "blob", "data", "uri", "name", "title", "description", "message", "systemPrompt", "mimeType", "type",
    "role", "logger", "level", "uriTemplate", "method", "resultType", "content", "values", "instructions",
})
# Keys that are the protocol's own names (and JSON Schema's): a key spelled exactly so carries nothing, so it yields
# no slot of its own (its value still does).
_KNOWN_KEYS = _PROTOCOL_FIELDS | frozenset({
    "structuredContent", "isError", "_meta", "annotations", "audience", "priority", "lastModified", "resource",
    "contents", "messages", "inputSchema", "outputSchema", "properties", "required", "items", "enum", "default",
    "arguments", "completion", "total", "hasMore", "progress", "tools", "prompts", "resources", "resourceTemplates",
    "inputRequests", "params", "requestedSchema", "icons", "src", "sizes", "size", "$schema", "additionalProperties",
    "format", "minimum", "maximum", "minLength", "maxLength", "anyOf", "oneOf", "allOf", "const", "examples",
    "readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint", "code", "maxTokens", "stopSequences",
    "temperature", "modelPreferences", "includeContext", "metadata", "hints", "costPriority", "speedPriority",
    "intelligencePriority", "toolUseId", "input", "id", "execution", "taskSupport", "mode", "url", "elicitationId",
    "progressToken", "nextCursor", "cursor", "requestState", "model", "stopReason", "toolResult",
})
_OPAQUE_AT_TOP = frozenset({"progressToken", "nextCursor", "cursor", "requestState"})
_BASE64_FIELDS = frozenset({"blob", "data"})
_MEDIA_TYPES = frozenset({"image", "audio"})


class TextSlot:
    """One string in a message, with where it is and the way to write a replacement back."""

    __slots__ = ("_container", "_key", "_named", "run", "where")
    unscannable = False
    decoded = False

    def __init__(self, container: MutableMapping[str, Any] | MutableSequence[Any], key: Any, where: str,
                 named: bool = False, run: tuple[int, int] | None = None) -> None:
        self._container = container
        self._key = key
        self._named = named
        self.where = where
        # (the content list's id, the block's index) of the text of a "text" block, for reading blocks joined.
        self.run = run

    @property
    def text(self) -> str:
        return self._container[self._key]

    @property
    def textual(self) -> bool:
        """Whether a model reads this as text (decoded binary does not)."""
        return True

    @property
    def data(self) -> bytes:
        """The string as UTF-8 bytes, which the detectors read."""
        return self.text.encode("utf-8", "surrogatepass")

    @property
    def name(self) -> str | None:
        """The key the string is filed under in structured data (``{"secret": "..."}`` gives "secret"), which says
        what the value is as a name beside it in text would; None for the protocol's own text fields."""
        return self._key if self._named else None

    def replace(self, new: str) -> None:
        """Write ``new`` where this string was; the message's structure stays as it was."""
        self._container[self._key] = new

    def replace_data(self, new: bytes) -> None:
        try:
            text = new.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            text = new.decode("utf-8", "replace")
        self.replace(text)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where!r})"


class KeySlot(TextSlot):
    """A key of an object; ``replace`` renames it in place (its siblings keep their order)."""

    __slots__ = ("_dependents",)

    def __init__(self, container: dict[str, Any], key: str, where: str) -> None:
        super().__init__(container, key, where)
        self._dependents: list[TextSlot] = []  # the slots that reach their string through this key

    @property
    def text(self) -> str:
        return self._key

    def replace(self, new: str) -> None:
        container: dict[str, Any] = self._container  # type: ignore[assignment]
        if new == self._key or self._key not in container:
            return
        unique, count = new, 1
        while unique in container:  # two keys redacted alike must stay two keys
            count += 1
            unique = f"{new} #{count}"
        items = list(container.items())
        container.clear()
        for key, value in items:
            container[unique if key == self._key else key] = value
        self._key = unique
        for slot in self._dependents:
            slot._key = unique


class BlobSlot(TextSlot):
    """The decoded bytes of a base64 payload; a replacement is encoded again in the payload's alphabet."""

    __slots__ = ("_original",)
    decoded = True

    def __init__(self, container: Any, key: Any, where: str, original: str) -> None:
        super().__init__(container, key, where)
        self._original = original

    @property
    def data(self) -> bytes:
        decoded = decode_base64(self._original)
        return decoded if decoded is not None else b""

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")

    @property
    def textual(self) -> bool:
        try:
            self.data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    def replace(self, new: str) -> None:
        self.replace_data(new.encode("utf-8", "surrogatepass"))

    def replace_data(self, new: bytes) -> None:
        if self._container[self._key] is not self._original:
            return  # the payload was already replaced as text
        urlsafe = "-" in self._original or "_" in self._original
        encoded = (base64.urlsafe_b64encode(new) if urlsafe else base64.b64encode(new)).decode("ascii")
        if not self._original.rstrip().endswith("="):
            encoded = encoded.rstrip("=")
        self._container[self._key] = encoded


class UnscannableSlot(TextSlot):
    """What the walk's bounds left unread: ``replace`` (whatever it is given) withholds it."""

    __slots__ = ("_rest",)
    unscannable = True

    def __init__(self, container: Any, key: Any, where: str, rest: list[Any] | None = None) -> None:
        super().__init__(container, key, where)
        self._rest = rest  # the keys (or the first index) of an open container left unread; None: container[key]

    @property
    def text(self) -> str:
        return ""

    @property
    def data(self) -> bytes:
        return b""

    def replace(self, new: str = UNSCANNABLE) -> None:
        container = self._container
        if self._rest is None:
            container[self._key] = UNSCANNABLE
        elif isinstance(container, dict):
            for key in self._rest:
                container.pop(key, None)
            container[UNSCANNABLE_KEY] = UNSCANNABLE
        else:
            del container[self._key:]
            container.append(UNSCANNABLE)

    def replace_data(self, new: bytes) -> None:
        self.replace()


# ------------------------------------------------------------------------------------------ base64

_DECODED: OrderedDict[int, tuple[str, bytes | None]] = OrderedDict()
_DECODED_KEPT = 8
_DECODING = threading.Lock()


def decode_base64(text: str) -> bytes | None:
    """``text`` decoded as base64 or base64url (padding optional, whitespace ignored); None when it is neither or
    would decode to more than ``MAX_DECODED_BLOB`` bytes. The last few payloads are kept decoded, so the scanners of
    one message decode each once."""
    with _DECODING:
        kept = _DECODED.get(id(text))
        if kept is not None and kept[0] is text:
            return kept[1]
    decoded = _decode(text)
    with _DECODING:
        _DECODED[id(text)] = (text, decoded)
        while len(_DECODED) > _DECODED_KEPT:
            _DECODED.popitem(last=False)
    return decoded


def _decode(text: str) -> bytes | None:
    if len(text) > _encoded_bound(MAX_DECODED_BLOB):
        return None
    try:
        compact = "".join(text.split()).encode("ascii")
    except UnicodeEncodeError:
        return None
    compact += b"=" * (-len(compact) % 4)
    if len(compact) // 4 * 3 - compact[-2:].count(b"=") > MAX_DECODED_BLOB:
        return None
    try:
        if b"-" in compact or b"_" in compact:
            return base64.b64decode(compact, altchars=b"-_", validate=True)
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        return None


def _encoded_bound(decoded: int) -> int:
    return (decoded + 2) // 3 * 4 + 1024  # room for line breaks


# ------------------------------------------------------------------------------------------ the walk


def text_slots(method: str, message: Any) -> Iterator[TextSlot]:
    """Every string of ``message`` (a result of ``method``, or the params of a notification or of a server's request
    ``method``), keys included; unscannable slots where the bounds stopped the walk."""
    if isinstance(message, (dict, list)):
        yield from walk(message, "")


def error_slots(error: dict[str, Any]) -> Iterator[TextSlot]:
    """The strings of a JSON-RPC error object (``{"code", "message", "data"}``)."""
    if isinstance(error, dict):
        yield from walk(error, "error", top_opaque=False)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


_PLAIN_KEY = re.compile(r"[A-Za-z_$-]{1,32}")


def _shown(key: Any, index: int) -> str:
    """A key as a place names it: a key that may itself be a value (digits, dots, @, long) is named by its position,
    so a report of where something was found never repeats what was found."""
    if isinstance(key, str) and (key in _KNOWN_KEYS or _PLAIN_KEY.fullmatch(key)):
        return key
    return f"[key {index}]"


class _Frame:
    __slots__ = ("container", "depth", "keys", "meta", "path", "position")

    def __init__(self, container: Any, path: str, depth: int, meta: bool) -> None:
        self.container = container
        self.path = path
        self.depth = depth
        self.meta = meta  # a _meta object or the message itself: where opaque tokens live
        self.keys: list[Any] | None = list(container) if isinstance(container, dict) else None
        self.position = 0


def walk(message: dict[str, Any] | list[Any], where: str, *, top_opaque: bool = True) -> Iterator[TextSlot]:
    """Every string under ``message``, depth first and in document order, keys before their values. A stack of
    frames rather than recursion: a deeply nested message must not exhaust Python's stack."""
    nodes = 0
    decoded_total = 0
    stack = [_Frame(message, where, 0, top_opaque)]
    while stack:
        frame = stack[-1]
        container = frame.container
        keys = frame.keys
        size = len(keys) if keys is not None else len(container)
        if frame.position >= size:
            stack.pop()
            continue
        if nodes >= MAX_NODES:
            # Fail closed: every container still open has its unread rest withheld, innermost first.
            for open_frame in reversed(stack):
                rest_keys = open_frame.keys
                if rest_keys is not None:
                    rest = rest_keys[open_frame.position:]
                    if rest:
                        yield UnscannableSlot(open_frame.container, None, f"{open_frame.path or 'message'} (beyond "
                                              f"{MAX_NODES} values)", rest)
                elif open_frame.position < len(open_frame.container):
                    yield UnscannableSlot(open_frame.container, open_frame.position,
                                          f"{open_frame.path or 'message'} (beyond {MAX_NODES} values)", [])
            return
        index = frame.position
        frame.position += 1
        nodes += 1
        depth = frame.depth
        if keys is not None:
            key = keys[index]
            if key not in container:
                continue
            value = container[key]
            path = _join(frame.path, _shown(key, index))
            key_slot: KeySlot | None = None
            if isinstance(key, str) and key not in _KNOWN_KEYS:
                key_slot = KeySlot(container, key, f"{path} (key)")
                yield key_slot
            if isinstance(value, str):
                if frame.meta and key in _OPAQUE_AT_TOP:
                    continue
                slot = TextSlot(container, key, path, named=key not in _PROTOCOL_FIELDS,
                                run=_run_of(stack, key, container))
                if key_slot is not None:
                    key_slot._dependents.append(slot)
                yield slot
                if key in _BASE64_FIELDS and _is_payload(key, container) and len(value) >= 8:
                    if len(value) <= _encoded_bound(MAX_DECODED_BLOB) and decoded_total < MAX_DECODED_TOTAL:
                        decoded_total += len(value) * 3 // 4
                        blob = BlobSlot(container, key, f"{path} (decoded)", value)
                        if key_slot is not None:
                            key_slot._dependents.append(blob)
                        yield blob
            elif isinstance(value, (dict, list)):
                if depth + 1 > MAX_DEPTH:
                    slot = UnscannableSlot(container, key, f"{path} (deeper than {MAX_DEPTH})")
                    if key_slot is not None:
                        key_slot._dependents.append(slot)
                    yield slot
                else:
                    stack.append(_Frame(value, path, depth + 1, key == "_meta"))
        else:
            value = container[index]
            path = f"{frame.path}[{index}]"
            if isinstance(value, str):
                yield TextSlot(container, index, path)
            elif isinstance(value, (dict, list)):
                if depth + 1 > MAX_DEPTH:
                    yield UnscannableSlot(container, index, f"{path} (deeper than {MAX_DEPTH})")
                else:
                    stack.append(_Frame(value, path, depth + 1, False))


def _is_payload(key: str, holder: dict[str, Any]) -> bool:
    return key == "blob" or holder.get("type") in _MEDIA_TYPES or "mimeType" in holder


def _run_of(stack: list[_Frame], key: str, holder: dict[str, Any]) -> tuple[int, int] | None:
    """The run of the text of a ``type: "text"`` block in a list: (the list's id, the block's index)."""
    if key != "text" or holder.get("type") != "text" or len(stack) < 2:
        return None
    parent = stack[-2]
    if parent.keys is not None:
        return None
    return (id(parent.container), parent.position - 1)


def copy_tree(value: Any) -> Any:
    """A copy of a JSON tree down to ``MAX_DEPTH`` (below it, parts are shared: the walk withholds them anyway),
    without recursion."""
    top = _shallow(value)
    stack: list[tuple[Any, int]] = [(top, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH or not isinstance(node, (dict, list)):
            continue
        pairs = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        for key, item in pairs:
            if isinstance(item, (dict, list)):
                node[key] = _shallow(item)
                stack.append((node[key], depth + 1))
    return top


def _shallow(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else list(value) if isinstance(value, list) else value
