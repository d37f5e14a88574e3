"""The readings of a definition's text that its author hid from a person but a model still reads.

A rule written for "ignore previous instructions" does not match "іgnore prevіous іnstructіons" (Cyrillic і),
"ｉｇｎｏｒｅ" (full-width), "i g n o r e  p r e v i o u s", "aWdub3JlIHByZXZpb3Vz" (base64) or a sentence inside
``<!-- -->`` that a rendered description never shows. ``readings(text)`` gives the other ways to read ``text``:

- ``folded``: NFKC, then every look-alike of an ASCII letter or digit as that letter (Unicode's confusables,
  ``bastion.guardrails.confusables``), invisible and format characters (category Cf) and combining marks on ASCII
  letters dropped, and runs of spaced-out letters joined into words (two or more separators between letters end a
  word). None when it reads as ``text`` does.
- ``decoded``: what base64, hex and percent-encoded runs spell, when it is mostly printable text.
- ``comments``: the text of each HTML comment, and of each Markdown comment (``[//]: # (text)``).
- ``spelled``: the letters of each spaced-out run, all together, for words spaced with single gaps.

Pure and bounded (the text is read up to ``MAX_TEXT`` characters; at most ``MAX_RUNS`` runs are decoded): it is run on
definitions only, which are scanned once per catalog change and cached, never on a call.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from dataclasses import dataclass
from urllib.parse import unquote

from bastion.guardrails.confusables import ASCII_LOOKALIKES

MAX_TEXT = 64 * 1024  # characters of one text read for other readings: a description is far shorter
MAX_RUNS = 16  # encoded runs decoded per text
MIN_PRINTABLE = 0.9  # share of a decoded run's characters that must be printable for it to count as text

_LOOKALIKES = str.maketrans(ASCII_LOOKALIKES)
# Four letters or more, each standing alone, one to three separators apart: "i g n o r e", "i.g.n.o.r.e",
# "i-g-n-o-r-e" ("a b c dog" has three). Possessive, and each letter's own check looks one character ahead, so a
# failed start costs at most four letters and a run is read once: linear, also on "a a a ... a bc".
_SPACED = re.compile(r"(?<![A-Za-z0-9])[A-Za-z](?:[ .\-_*·]{1,3}+[A-Za-z](?![A-Za-z0-9])){3,}+")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_WORD_GAP = re.compile(r"[ .\-_*·]{2,}")
_BASE64 = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{16,}={0,2}")
_HEX = re.compile(r"(?<![0-9A-Fa-f])(?:[0-9A-Fa-f]{2}){8,}(?![0-9A-Fa-f])")
_COMMENT = re.compile(r"<!--(.*?)(?:-->|$)", re.DOTALL)
# Markdown's comment: a link reference to "#" that no renderer shows ("[//]: # (text)").
_MARKDOWN_COMMENT = re.compile(r"^[ \t]{0,3}\[[^\]\n]*\]:[ \t]*#[ \t]*[(\"'](.*)[)\"'][ \t]*$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Readings:
    folded: str | None
    decoded: tuple[str, ...]
    comments: tuple[str, ...]
    spelled: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return self.folded is None and not self.decoded and not self.comments and not self.spelled


NONE = Readings(None, (), (), ())


def readings(text: str) -> Readings:
    """Every other reading of ``text`` (see the module's docstring); ``NONE`` for plain ASCII prose."""
    text = text[:MAX_TEXT]
    folded = unjoined = fold(text)
    spaced = _spaced_runs(folded)
    if spaced:
        parts, at = [], 0
        for start, end in spaced:
            parts += [folded[at:start], _joined(folded[start:end])]
            at = end
        folded = "".join(parts) + folded[at:]
    comments = tuple(fold(match.group(1)) for pattern, opening in ((_COMMENT, "<!--"), (_MARKDOWN_COMMENT, "]:"))
                     if opening in text for match in pattern.finditer(text) if match.group(1).strip())
    found = Readings(folded if folded != text else None, decoded_runs(folded), comments,
                     tuple(re.sub(r"[^A-Za-z]", "", unjoined[start:end]).lower() for start, end in spaced))
    return NONE if found.empty else found


def fold(text: str) -> str:
    """``text`` as ASCII where it only looks otherwise: NFKC, look-alikes folded, invisible characters dropped."""
    if text.isascii():
        return text
    text = unicodedata.normalize("NFKC", text).translate(_LOOKALIKES)
    kept = []
    for index, char in enumerate(text):
        category = unicodedata.category(char)
        if category == "Cf":
            continue  # zero-width, bidi and tag characters: invisible to a person
        if category == "Mn" and index and text[index - 1].isascii():
            continue  # a combining mark stacked on an ASCII letter ("i̇gnore", zalgo text)
        kept.append(char)
    return "".join(kept)


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def as_words(identifier: str) -> str:
    """A name or key read as words: "ignoreAll_previous-instructions" -> "ignore All previous instructions"."""
    return re.sub(r"[_\-.]+", " ", _CAMEL.sub(" ", identifier)).strip()


def _spaced_runs(text: str) -> list[tuple[int, int]]:
    return [match.span() for match in _SPACED.finditer(text)]


def _joined(run: str) -> str:
    return " ".join(re.sub(r"[^A-Za-z]", "", word) for word in _WORD_GAP.split(run))


def decoded_runs(text: str) -> tuple[str, ...]:
    """What the base64, hex and percent-encoded runs of ``text`` spell, each when it is mostly printable text."""
    found: list[str] = []
    candidates = [(match.group(), decode) for pattern, decode in ((_BASE64, _from_base64), (_HEX, _from_hex))
                  for match in pattern.finditer(text)]
    if "%" in text:
        # A token with three escapes or more, read whole ("ignore%20all%20previous..."); split on spaces, so each
        # character is looked at once.
        candidates.extend((token, _from_percent) for token in text.split() if len(_ESCAPE.findall(token)) >= 3)
    for run, decode in candidates:
        if len(found) >= MAX_RUNS:
            break
        spelled = decode(run)
        if spelled is not None and not _textual(spelled) and _BASE64.fullmatch(spelled):
            spelled = _from_base64(spelled)  # base64 of base64: one layer more, no deeper
        if spelled is not None and _textual(spelled):
            found.append(spelled)
    return tuple(found)


def _from_base64(run: str) -> str | None:
    compact = run.rstrip("=")
    alphabet = "-_" if ("-" in compact or "_" in compact) else "+/"
    if alphabet == "-_" and ("+" in compact or "/" in compact):
        return None
    padded = compact + "=" * (-len(compact) % 4)
    try:
        raw = base64.b64decode(padded, altchars=alphabet.encode(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return _utf8(raw)


def _from_hex(run: str) -> str | None:
    try:
        return _utf8(bytes.fromhex(run))
    except ValueError:
        return None


def _from_percent(run: str) -> str | None:
    try:
        spelled = unquote(run, errors="strict")
    except UnicodeDecodeError:
        return None
    return spelled if spelled != run else None


def _utf8(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _textual(spelled: str) -> bool:
    """Mostly printable characters, and words: what reads as text rather than an identifier's bytes."""
    if len(spelled) < 4 or " " not in spelled.strip():
        return False
    printable = sum(1 for char in spelled if char.isprintable() or char in "\n\t")
    return printable / len(spelled) >= MIN_PRINTABLE
