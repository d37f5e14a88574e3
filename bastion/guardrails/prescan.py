"""A look at a ``tools/call`` result still as the server's bytes that can tell, without decoding it or walking its
strings, that no guardrail would change it: then the bytes go on as they came, as they would after the full path.

The full path (``bastion.guardrails.content.walk`` over the decoded result, then each scanner over each string) reads
every string of a result, keys included, decoded payloads, consecutive text blocks joined, invisible characters
taken out. The pre-scan calls a result clean only when all of that comes down to one string read by the same
detectors the full path would run on it, so the two cannot disagree:

- the result is exactly ``{"content": [], ...}`` or ``{"content": [{"type": "text", "text": "..."}], ...}`` with an
  optional ``"isError": true|false`` (members in either order, JSON whitespace anywhere): every key is a name of the
  protocol, so none is a string the walk yields, and no string is "filed under a name"; there is no ``_meta``,
  ``annotations``, ``structuredContent``, payload (``blob``, media ``data``), resource or second text block (no
  value split across blocks), and no key twice (so every JSON reader reads the bytes alike: ``raw.reads_alike``);
- its one text holds no ``\\u`` escape (the full path would not pass such bytes on either); any other escape is
  decoded, and only that one string;
- the text is valid UTF-8 (the detectors' automata need it), with no zero-width or other invisible character that
  either scanner takes out before matching;
- the detectors that are on for the server (secrets and personal data, output injection) find nothing in the
  text's UTF-8: the same calls, on the same bytes, that the full path makes on its one slot.

Anything else takes the full path. ``tests/guardrails/test_prescan.py`` holds it to that, against the full path, on
generated results with values placed in every channel, escaped, split and hidden.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

_WS = rb"[ \t\n\r]*"
# A JSON string's body (the bytes between its quotes), escapes included; the bytes were checked as JSON on arrival.
_STRING = rb'"([^"\\]*(?:\\.[^"\\]*)*)"'
_TEXT_VALUE = rb'"text"'


def _key(name: bytes) -> bytes:
    return rb'"' + name + rb'"' + _WS + rb":" + _WS


_BLOCK = (rb"\{" + _WS + rb"(?:"
          + _key(rb"type") + _TEXT_VALUE + _WS + rb"," + _WS + _key(rb"text") + _STRING
          + rb"|" + _key(rb"text") + _STRING + _WS + rb"," + _WS + _key(rb"type") + _TEXT_VALUE
          + rb")" + _WS + rb"\}")
_CONTENT = _key(rb"content") + rb"\[" + _WS + rb"(?:" + _BLOCK + _WS + rb")?\]"
_IS_ERROR = _key(rb"isError") + rb"(?:true|false)"
# The text's capture group is the last one a match sets (nothing after it captures), so ``lastindex`` finds it.
SHAPE = re.compile(_WS + rb"\{" + _WS + rb"(?:" + _CONTENT + rb"(?:" + _WS + rb"," + _WS + _IS_ERROR + rb")?"
                   + rb"|" + _IS_ERROR + _WS + rb"," + _WS + _CONTENT + rb")" + _WS + rb"\}" + _WS)

# Invisible characters, as UTF-8: those the secret scanner takes out of a value before matching
# (``scanning._INVISIBLE``) and those the injection rules read around (``injection._HIDDEN``: tag characters, bidi
# controls, zero-width characters and joiners, variation selectors of the supplement).
INVISIBLE = re.compile(
    rb"\xe2\x80[\x8b-\x8d]|\xe2\x81[\xa0-\xa4]|\xef\xbb\xbf|\xc2\xad|\xe1\xa0\x8e|\xcd\x8f"  # scanning._INVISIBLE
    rb"|\xe2\x80[\xaa-\xae]|\xe2\x81[\xa6-\xa9]"  # bidi embeddings, overrides and isolates
    rb"|\xf3\xa0[\x80-\x81][\x80-\xbf]"  # tag characters U+E0000-E007F
    rb"|\xf3\xa0[\x84-\x87][\x80-\xbf]")  # variation selectors U+E0100-E01EF

_decode_string = msgspec.json.Decoder(str).decode
NOT_CLEAN = None


def only_text(result: Any) -> bytes | None:
    """The UTF-8 of the one text of ``result`` (the server's bytes of a ``tools/call`` result; ``b""`` when it has no
    block), when it has the shape above and nothing in it could hide a value from a scan of that text; else None
    (the result takes the full path)."""
    match = SHAPE.fullmatch(result)
    if match is None:
        return NOT_CLEAN
    group = match.lastindex
    if group is None:
        return b""
    text = match[group]
    if b"\\" in text:
        if b"\\u" in text:
            return NOT_CLEAN
        try:
            text = _decode_string(b'"' + text + b'"').encode()
        except (msgspec.DecodeError, UnicodeEncodeError):
            return NOT_CLEAN
    if not text.isascii():
        try:
            text.decode()
        except UnicodeDecodeError:
            return NOT_CLEAN
        if INVISIBLE.search(text) is not None:
            return NOT_CLEAN
    return text
