"""Every string of a message that reaches the model, found in one place so every scanner reads the same ones.

``text_slots(method, message)`` yields a ``TextSlot`` for each string a model would read in a result of
``tools/call``, ``resources/read`` or ``prompts/get``, in the params of a server's ``sampling/createMessage``
request, or in an error (``error_slots``). A slot says where it is (``content[2].text``) and can replace its string
in place, so a redaction keeps the structure the client expects. Base64 payloads (images, audio, blobs) and the
keys of structured content are not text a scanner could sensibly rewrite and are left alone; a modern server's
``{"resultType": "input_required"}`` is not content yet and yields nothing.
"""

from __future__ import annotations

from typing import Any, Iterator, MutableMapping, MutableSequence

# The text-bearing fields of content items (MCP 2025-11-25 ContentBlock), by type; an unknown type yields its
# "text" when it has one, so a newer kind of content is not silently skipped.
_ITEM_FIELDS: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "resource_link": ("uri", "name", "title", "description"),
    "image": (),
    "audio": (),
}
_EMBEDDED_FIELDS = ("uri", "text")


class TextSlot:
    """One string in a message, with where it is and the way to write a replacement back."""

    __slots__ = ("_container", "_key", "_named", "where")

    def __init__(self, container: MutableMapping[str, Any] | MutableSequence[Any], key: Any, where: str,
                 named: bool = False) -> None:
        self._container = container
        self._key = key
        self._named = named
        self.where = where

    @property
    def text(self) -> str:
        return self._container[self._key]

    @property
    def name(self) -> str | None:
        """The key the string is filed under in structured data (``{"secret": "..."}`` gives "secret"), which says
        what the value is as a name beside it in text would; None for the fields of content blocks."""
        return self._key if self._named else None

    def replace(self, new: str) -> None:
        """Write ``new`` where this string was; the message's structure stays as it was."""
        self._container[self._key] = new

    def __repr__(self) -> str:
        return f"TextSlot({self.where!r})"


def text_slots(method: str, message: Any) -> Iterator[TextSlot]:
    """The strings of ``message`` that reach the model: a result of ``method`` or, for
    ``sampling/createMessage``, the server's request params."""
    if not isinstance(message, dict) or message.get("resultType") == "input_required":
        return
    if method == "tools/call":
        yield from _content_list(message, "content", "content")
        if "structuredContent" in message:
            yield from _anything(message, "structuredContent", "structuredContent")
        if "toolResult" in message:  # the 2024-10-07 era's shape of a result
            yield from _anything(message, "toolResult", "toolResult")
    elif method == "resources/read":
        contents = message.get("contents")
        if isinstance(contents, list):
            for index, item in enumerate(contents):
                if isinstance(item, dict):
                    yield from _fields(item, ("text",), f"contents[{index}]")
    elif method == "prompts/get":
        yield from _fields(message, ("description",), "")
        yield from _messages(message, "messages")
    elif method == "sampling/createMessage":
        yield from _fields(message, ("systemPrompt",), "")
        yield from _messages(message, "messages")
    else:
        yield from _anything_in(message, "")


def error_slots(error: dict[str, Any]) -> Iterator[TextSlot]:
    """The strings of a JSON-RPC error object (``{"code", "message", "data"}``) that reach the model."""
    yield from _fields(error, ("message",), "error")
    if "data" in error:
        yield from _anything(error, "data", "error.data")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _fields(item: dict[str, Any], names: tuple[str, ...], prefix: str) -> Iterator[TextSlot]:
    for name in names:
        if isinstance(item.get(name), str):
            yield TextSlot(item, name, _join(prefix, name))


def _messages(message: dict[str, Any], key: str) -> Iterator[TextSlot]:
    messages = message.get(key)
    if not isinstance(messages, list):
        return
    for index, entry in enumerate(messages):
        if not isinstance(entry, dict):
            continue
        where = f"{key}[{index}].content"
        content = entry.get("content")
        if isinstance(content, list):  # sampling messages may carry several blocks
            yield from _content_list(entry, "content", where)
        elif isinstance(content, dict):
            yield from _content_item(content, where)


def _content_list(holder: dict[str, Any], key: str, where: str) -> Iterator[TextSlot]:
    items = holder.get(key)
    if not isinstance(items, list):
        return
    for index, item in enumerate(items):
        if isinstance(item, dict):
            yield from _content_item(item, f"{where}[{index}]")


def _content_item(item: dict[str, Any], where: str) -> Iterator[TextSlot]:
    kind = item.get("type")
    if kind == "resource":
        embedded = item.get("resource")
        if isinstance(embedded, dict):
            yield from _fields(embedded, _EMBEDDED_FIELDS, f"{where}.resource")
        return
    if kind in ("tool_result",):  # a sampling message's tool result carries content of its own
        yield from _content_list(item, "content", f"{where}.content")
        if "structuredContent" in item:
            yield from _anything(item, "structuredContent", f"{where}.structuredContent")
        return
    if kind == "tool_use":
        if "input" in item:
            yield from _anything(item, "input", f"{where}.input")
        return
    yield from _fields(item, _ITEM_FIELDS.get(kind, ("text",)), where)


def _anything(holder: MutableMapping[str, Any] | MutableSequence[Any], key: Any, where: str) -> Iterator[TextSlot]:
    """Every string value under ``holder[key]``, depth first (structured content, error data)."""
    value = holder[key]
    if isinstance(value, str):
        yield TextSlot(holder, key, where)
    elif isinstance(value, (dict, list)):
        yield from _anything_in(value, where)


def _anything_in(value: dict[str, Any] | list[Any], where: str) -> Iterator[TextSlot]:
    # A stack of iterators rather than recursion: a deeply nested result must not exhaust Python's stack, and the
    # strings still come in document order.
    stack: list[tuple[Any, Iterator[tuple[Any, Any]], str]] = [(value, _pairs(value), where)]
    while stack:
        container, pairs, prefix = stack[-1]
        for key, item in pairs:
            path = f"{prefix}[{key}]" if isinstance(key, int) else _join(prefix, str(key))
            if isinstance(item, str):
                yield TextSlot(container, key, path, named=isinstance(key, str))
            elif isinstance(item, (dict, list)):
                stack.append((item, _pairs(item), path))
                break
        else:
            stack.pop()


def _pairs(container: dict[str, Any] | list[Any]) -> Iterator[tuple[Any, Any]]:
    return iter(container.items()) if isinstance(container, dict) else enumerate(container)
