"""Personal data a tool's answer echoes from the call itself, which is no leak.

"Email sent to alice@example.org" answers a call whose arguments held alice@example.org: the caller (the model, on
the user's behalf) wrote that address, so the answer tells it nothing it did not have, and redacting it only breaks
the confirmation. A value of personal data found in a ``tools/call`` result is therefore left as it is when the same
value (any case) appears in one of that call's argument strings. Only personal data: a secret is redacted wherever it
appears, since a credential in the arguments may have come from the client's configuration rather than from the
model, and an answer should not hand it to the model either way. Any other value of the answer (another address, a
phone number the caller never gave) is redacted as before.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import msgspec

MAX_ARGUMENT_STRINGS = 1000  # strings read from one call's arguments; a call with more is read only that far
MAX_ARGUMENT_BYTES = 256 * 1024  # bytes of argument text kept for the comparison


class CallerInput:
    """The strings of one call's arguments, lowercased, to ask whether a value found in the answer is one of them."""

    __slots__ = ("_texts",)

    def __init__(self, arguments: Any) -> None:
        if type(arguments) is msgspec.Raw:
            try:
                arguments = msgspec.json.decode(arguments)
            except msgspec.DecodeError:
                arguments = None
        texts: list[str] = []
        size = 0
        for text in _strings(arguments):
            if len(texts) >= MAX_ARGUMENT_STRINGS or size + len(text) > MAX_ARGUMENT_BYTES:
                break
            texts.append(text.lower())
            size += len(text)
        self._texts = tuple(texts)

    def supplied(self, value: bytes) -> bool:
        """Whether ``value`` (UTF-8, as the scanner found it) is written in one of the argument strings."""
        if not self._texts:
            return False
        wanted = value.decode("utf-8", "replace").lower()
        return any(wanted in text for text in self._texts)


class EchoCheck:
    """Whether values found in one answer were written in the arguments of the call it answers: the arguments are
    read at the first value asked about (an answer without personal data never reads them), once per answer, and at
    most ``MAX_CHECKS`` values are compared (each comparison reads the arguments' text; past that, values are
    redacted as any other), so an answer with thousands of addresses costs no more than a few hundred lookups."""

    MAX_CHECKS = 256

    __slots__ = ("_call", "_given", "_checks")

    def __init__(self, call: Mapping[str, Any]) -> None:
        self._call = call
        self._given: CallerInput | None = None
        self._checks = 0

    def supplied(self, value: bytes) -> bool:
        if self._checks >= self.MAX_CHECKS or not isinstance(self._call, Mapping):
            return False
        self._checks += 1
        if self._given is None:
            self._given = CallerInput(self._call.get("arguments"))
        return self._given.supplied(value)


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    if depth > 32:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                yield key
            yield from _strings(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, depth + 1)
