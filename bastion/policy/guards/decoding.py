"""Decoders that undo the encodings attackers use to smuggle path and shell syntax past filters.

Servers differ in how much they decode, so guards check every plausible reading of a value rather than
guessing one: percent-encoding (repeated, for double encoding), IIS ``%uXXXX``, overlong UTF-8 forms
(``%c0%ae`` is ".") and Unicode compatibility forms (fullwidth "．" is ".").
"""

from __future__ import annotations

import re
import unicodedata

_ESCAPES = re.compile(r"%u([0-9a-fA-F]{4})|((?:%[0-9a-fA-F]{2})+)")
_HEX_LITERAL = re.compile(r"0x([0-9a-fA-F]{2})")
_MAX_ROUNDS = 6


def decode_utf8_lenient(data: bytes) -> str:
    """Decode UTF-8 the way a careless decoder does: overlong forms map to the character they spell."""
    out: list[str] = []
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        if b < 0x80:
            out.append(chr(b))
            i += 1
            continue
        if 0xC0 <= b < 0xE0:
            width, cp = 2, b & 0x1F
        elif 0xE0 <= b < 0xF0:
            width, cp = 3, b & 0x0F
        elif 0xF0 <= b < 0xF8:
            width, cp = 4, b & 0x07
        else:
            out.append("\ufffd")
            i += 1
            continue
        tail = data[i + 1 : i + width]
        if len(tail) != width - 1 or any(c & 0xC0 != 0x80 for c in tail):
            out.append("\ufffd")
            i += 1
            continue
        for c in tail:
            cp = (cp << 6) | (c & 0x3F)
        out.append(chr(cp) if cp <= 0x10FFFF and not 0xD800 <= cp <= 0xDFFF else "\ufffd")
        i += width
    return "".join(out)


def _decode_escapes_once(value: str) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(1):
            return chr(int(match.group(1), 16))
        return decode_utf8_lenient(bytes.fromhex(match.group(2).replace("%", "")))

    return _ESCAPES.sub(replace, value)


def decode_fully(value: str) -> str:
    """Percent-, ``%u``- and overlong-decode until nothing changes (double and triple encodings)."""
    for _ in range(_MAX_ROUNDS):
        if "%" not in value:
            return value
        decoded = _decode_escapes_once(value)
        if decoded == value:
            return value
        value = decoded
    return value


def decode_hex_literals(value: str) -> str:
    """``0x2e`` → "." — some filters and servers read C-style hex escapes."""
    return _HEX_LITERAL.sub(lambda m: chr(int(m.group(1), 16)), value)


def compatibility_form(value: str) -> str:
    """NFKC folds fullwidth and look-alike characters ("．", "／", "…") onto the ASCII they imitate."""
    return unicodedata.normalize("NFKC", value)


def has_control_characters(value: str) -> bool:
    return any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in value)
