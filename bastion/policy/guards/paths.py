"""Path guard: canonicalize a path the way the server may read it, then require it inside the roots.

Every reading of the value is checked (as written, decoded, with backslashes as separators, with the
Tomcat ``;param`` and Windows trailing-dot quirks applied), so a value is admitted only when no
interpretation leaves the allowed roots. The literal reading is then resolved on the real file system so a
symbolic link inside a root cannot lead out of it.

Before any reading, the marks of an encoding are refused outright rather than decoded one scheme at a time:
every percent sign, every ``%u`` escape, lone surrogates (what a lax decoder turns into overlong UTF-8) and
every character that looks like a separator or a dot. A new encoding of those needs no new case here. A guard
may allow percent signs or look-alikes for servers whose names really contain them; every reading is then
checked, with each look-alike also read as the ASCII it imitates.
"""

from __future__ import annotations

import os
import posixpath
import re
import unicodedata
from stat import S_ISLNK
from dataclasses import dataclass, field

from bastion.policy.decision import PASS, GuardResult, refuse
from bastion.policy.guards.decoding import (
    compatibility_form,
    decode_fully,
    decode_hex_literals,
    has_control_characters,
)
from bastion.policy.guards.lookalikes import LOOKALIKE, as_ascii
from bastion.policy.guards.nofollow import NO_LINK, symlink_free

# Characters whose encoded form in a path is an attack, never a file name: a client that means "." writes ".".
_PATH_SYNTAX = "./\\%:;~"
_DRIVE_OR_UNC = re.compile(r"^[A-Za-z]:[\\/]")
_SEGMENT_PARAMS = re.compile(r";[^/]*")
_DOT_RUN = re.compile(r"(?<![^/])\.{3,}(?![^/])")
_TRAILING_DOTS_SPACES = re.compile(r"(?<=[^/.])[. ]+(?=/|$)|(?<=\.\.)[ ]+(?=/|$)")
_PATH_MAX = 4096
_NAME_MAX = 255
_OUTSIDE = "the path is outside the allowed directories"
_THROUGH_A_LINK = "the path leads outside the allowed directories through a symbolic link"
# In printable ASCII, these mark an encoding, an escape or a spelling that only some servers treat as
# traversal: percent and backslash escapes, Tomcat ";" parameters, "~" homes, ":" drives and URLs, hex
# literals, dot runs, and dots or spaces that end a name (Windows drops them).
_NOT_PLAIN = re.compile(r"%|\\|;|~|:|0[xX]|\.\.\.|\./| /")
_NOT_PLAIN_ENDINGS = (".", " ")
_PLACEMENTS_KEPT = 4096
_PERCENT_U = re.compile(r"%u[0-9a-fA-F]{4}")
_HALF_ESCAPE = re.compile(r"%[0-9a-fA-F](?![0-9a-fA-F])")
_ESCAPE_RUN = re.compile(r"(?:%[0-9a-fA-F]{2})+")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class PathRules:
    """Allowed roots (absolute), the directory relative paths are taken from, and symlink policy."""

    roots: tuple[str, ...]
    base: str
    resolved_roots: tuple[str, ...]
    resolve_symlinks: bool = True
    allow_hidden: bool = False
    allow_backslash: bool = False
    # Roots with no symbolic link in their own path: below them, one openat2 call answers for a whole
    # path (``nofollow``), since any link it meets is below the root.
    linkless_roots: frozenset[str] = frozenset()
    # A percent sign, or a character that looks like "/", "\\" or ".", is refused unless these admit it.
    allow_percent: bool = False
    allow_lookalikes: bool = False
    # Where each plain value lands (or why it is refused): a pure function of the value and the rules.
    _placements: dict[str, "tuple[str, str] | GuardResult"] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @staticmethod
    def build(
        roots: list[str] | tuple[str, ...],
        base: str | None = None,
        resolve_symlinks: bool = True,
        allow_hidden: bool = False,
        allow_backslash: bool = False,
        allow_percent: bool = False,
        allow_lookalikes: bool = False,
    ) -> "PathRules":
        lexical = tuple(posixpath.normpath(os.path.abspath(os.path.expanduser(r))) for r in roots)
        if not lexical:
            raise ValueError("a path guard needs at least one root")
        base_dir = posixpath.normpath(os.path.abspath(os.path.expanduser(base))) if base else lexical[0]
        resolved = tuple(os.path.realpath(r) for r in lexical)
        linkless = frozenset(r for r, real in zip(lexical, resolved) if r == real)
        return PathRules(lexical, base_dir, resolved, resolve_symlinks, allow_hidden, allow_backslash, linkless,
                         allow_percent=allow_percent, allow_lookalikes=allow_lookalikes)


def _root_of(path: str, roots: tuple[str, ...]) -> str | None:
    # Compare whole segments: "/data" admits "/data/x" but never "/data-evil".
    for root in roots:
        if root == "/" or path == root or path.startswith(root + "/"):
            return root
    return None


def _absolute(path: str, base: str) -> str:
    if path.startswith("~"):
        expanded = os.path.expanduser(path)
        path = expanded
    joined = path if path.startswith("/") else base + "/" + path
    if "//" not in joined and "/." not in joined and not joined.endswith("/"):
        # No empty, "." or ".." component and no trailing slash: normpath would return it unchanged.
        return joined
    normal = posixpath.normpath(joined)
    # POSIX keeps a leading "//" as implementation-defined; Linux treats it as "/".
    return "/" + normal.lstrip("/")


def _readings(value: str) -> set[str]:
    """Every way a server might interpret ``value`` as a path."""
    decoded = decode_fully(value)
    readings = {value, decoded}
    for text in (value, decoded):
        folded = compatibility_form(text)
        hexed = decode_fully(decode_hex_literals(folded))
        if hexed.lower().startswith("file:"):
            hexed = re.sub(r"^file:(//[^/]*)?", "", hexed, flags=re.IGNORECASE)
        unescaped = re.sub(r"\\(.)", r"\1", hexed)
        readings.add(unescaped)
        slashed = hexed.replace("\\", "/")
        quirks = _SEGMENT_PARAMS.sub("", slashed)
        quirks = _TRAILING_DOTS_SPACES.sub("", quirks)
        quirks = _DOT_RUN.sub("..", quirks)
        readings.update((folded, hexed, slashed, quirks))
    # The laxest server reads each look-alike as the ASCII it imitates (only reached when a guard allows them).
    readings.update([as_ascii(reading) for reading in readings if LOOKALIKE.search(reading)])
    return readings


def _encoded_syntax(value: str) -> bool:
    decoded = compatibility_form(decode_fully(value))
    return any(decoded.count(c) > value.count(c) for c in _PATH_SYNTAX)


def _hidden(absolute: str, root: str) -> bool:
    inside = absolute[len(root) :] if root != "/" else absolute
    return "/." in inside


def _too_long(value: str) -> bool:
    # Over-long names are truncated or rejected differently by each layer: a classic filter bypass.
    if len(value) <= _NAME_MAX // 4:
        return False  # even four UTF-8 bytes a character cannot make it too long
    encoded = value.encode("utf-8", "surrogatepass")
    return len(encoded) > _PATH_MAX or any(len(seg) > _NAME_MAX for seg in encoded.split(b"/"))


def check_path(value: object, rules: PathRules) -> GuardResult:
    if not isinstance(value, str):
        return refuse("a path must be a string")
    if len(value) > _NAME_MAX // 4 and _too_long(value):
        return refuse("the path or one of its names is too long")
    if not rules.allow_backslash and "\\" in value:
        return refuse("the path contains a backslash")
    return _check_plain(value, rules) if _plain(value) else _check_readings(value, rules)


def _check_plain(value: str, rules: PathRules) -> GuardResult:
    """A value without encodings, escapes, quirks or drive letters: it is its only reading."""
    placements = rules._placements
    placed = placements.get(value)
    if placed is None:
        placed = _place(value, rules)
        if len(placements) >= _PLACEMENTS_KEPT:
            placements.clear()
        placements[value] = placed
    if type(placed) is GuardResult:
        return placed
    if rules.resolve_symlinks and not _resolves_inside(placed[0], placed[1], rules):
        return refuse(_THROUGH_A_LINK)
    return PASS


def _check_readings(value: str, rules: PathRules) -> GuardResult:
    """Any value: admitted only when every way a server might read it stays inside the roots."""
    if "\x00" in value or has_control_characters(value) or has_control_characters(decode_fully(value)):
        return refuse("the path contains NUL or control characters")
    marked = _encoding_marks(value, rules)
    if marked is not None:
        return marked
    if _encoded_syntax(value):
        return refuse("the path contains encoded path syntax")
    every: list[tuple[str, str]] = []
    for reading in _readings(value):
        if not rules.allow_backslash and "\\" in reading:
            return refuse("the path contains a backslash")
        if _DRIVE_OR_UNC.match(reading) or ("..." in reading and _DOT_RUN.search(reading.replace("\\", "/"))):
            return refuse(_OUTSIDE)
        placed = _place(reading, rules)
        if type(placed) is GuardResult:
            return placed
        every.append(placed)
    if rules.resolve_symlinks:
        for absolute, root in every:
            if not _resolves_inside(absolute, root, rules):
                return refuse(_THROUGH_A_LINK)
    return PASS


def _encoding_marks(value: str, rules: PathRules) -> GuardResult | None:
    """Why ``value`` is refused for carrying the mark of an encoding, whatever scheme it uses; None: it carries none."""
    if _LONE_SURROGATE.search(value):
        return refuse("the path contains a lone surrogate, which is not text (lax decoders read such bytes as "
                      "overlong UTF-8)")
    if "%" in value:
        if not rules.allow_percent:
            return refuse("the path contains a percent sign: path arguments are never percent-encoded "
                          "(set allow_percent = true on the guard if the server's names contain %)")
        if _PERCENT_U.search(value):
            return refuse("the path contains a %u escape, an encoding no file name needs")
        if not _escapes_are_utf8(value):
            # Lax decoders read broken and overlong escapes by their low bits: %c0%9v, %c0%2e and %c0%ae become
            # separators and dots.
            return refuse("the path contains a percent escape that is not valid UTF-8")
    for reading in (value, decode_fully(value)) if rules.allow_percent else (value,):
        lookalike = None if rules.allow_lookalikes else LOOKALIKE.search(reading)
        if lookalike is not None:
            character = lookalike.group()
            return refuse(f"the path contains U+{ord(character):04X} {unicodedata.name(character, '')}, which looks "
                          "like a separator or a dot (set allow_lookalikes = true on the guard if names need it)")
        if _LONE_SURROGATE.search(reading):
            return refuse("the path contains an encoded lone surrogate, which is not text")
    return None


def _escapes_are_utf8(value: str) -> bool:
    """Whether every percent escape, at every round of decoding, is complete and spells strict UTF-8."""
    for _ in range(8):
        if _HALF_ESCAPE.search(value):
            return False
        for run in _ESCAPE_RUN.findall(value):
            try:
                bytes.fromhex(run.replace("%", "")).decode("utf-8")
            except UnicodeDecodeError:
                return False
        decoded = _ESCAPE_RUN.sub(lambda m: bytes.fromhex(m.group().replace("%", "")).decode("utf-8"), value)
        if decoded == value:
            return True
        value = decoded
    return False  # still decoding after eight rounds: no file name is encoded that deep


def _plain(value: str) -> bool:
    """Printable ASCII with none of the marks of another reading."""
    return (
        value.isascii()
        and value.isprintable()
        and not value.endswith(_NOT_PLAIN_ENDINGS)
        and _NOT_PLAIN.search(value) is None
    )


def _place(reading: str, rules: PathRules) -> tuple[str, str] | GuardResult:
    """The absolute path ``reading`` names and the root it lies in, or why it is refused."""
    absolute = _absolute(reading, rules.base)
    root = _root_of(absolute, rules.roots)
    if root is None:
        return refuse(_OUTSIDE)
    if not rules.allow_hidden and _hidden(absolute, root):
        return refuse("the path names a hidden file or directory")
    return absolute, root


def _resolves_inside(absolute: str, root: str, rules: PathRules) -> bool:
    """Walk the components below the root with lstat; only a symbolic link needs a full resolution.

    Much cheaper than ``realpath`` for every call: the root itself was resolved once, at start, and a
    component that does not exist yet cannot be a link (the server would create a plain entry).
    ``absolute`` is normal (no empty, "." or ".." component), so each prefix ending before a "/" is a
    component's path.
    """
    if symlink_free is not None and root in rules.linkless_roots and symlink_free(absolute) is NO_LINK:
        return True
    end, size = (len(root) if root != "/" else 0), len(absolute)
    while end < size:
        end = absolute.find("/", end + 1)
        if end < 0:
            end = size
        try:
            mode = os.lstat(absolute[:end]).st_mode
        except OSError:
            return True
        if S_ISLNK(mode):
            return _root_of(os.path.realpath(absolute), rules.resolved_roots) is not None
    return True
