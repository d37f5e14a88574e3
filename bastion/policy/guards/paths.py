"""Path guard: canonicalize a path the way the server may read it, then require it inside the roots.

Every reading of the value is checked (as written, decoded, with backslashes as separators, with the
Tomcat ``;param`` and Windows trailing-dot quirks applied), so a value is admitted only when no
interpretation leaves the allowed roots. Each reading is then resolved on the real file system the way the
kernel resolves it, component by component (a ".." after a symbolic link climbs from the link's target, not
from the name as written), so a symbolic link inside a root cannot lead out of it.

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
from stat import S_ISDIR, S_ISLNK
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
_LINK_LOOP = "the path goes through more than 40 symbolic links (a loop)"
_UP_FROM_MISSING = "the path has '..' after a name that does not exist or is not a directory"
# The kernel's MAXSYMLINKS: one lookup that meets a 41st symbolic link fails with ELOOP.
_MAX_LINKS = 40
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
    _placements: dict[str, "_Placed | GuardResult"] = field(
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
        # Resolved as the paths checked against them are; a root the kernel cannot resolve (a loop) stays as written.
        resolved = tuple(real if isinstance(real := _kernel_walk(r), str) else r for r in lexical)
        linkless = frozenset(r for r, real in zip(lexical, resolved) if r == real)
        return PathRules(lexical, base_dir, resolved, resolve_symlinks, allow_hidden, allow_backslash, linkless,
                         allow_percent=allow_percent, allow_lookalikes=allow_lookalikes)


def _root_of(path: str, roots: tuple[str, ...]) -> str | None:
    # Compare whole segments: "/data" admits "/data/x" but never "/data-evil".
    for root in roots:
        if root == "/" or path == root or path.startswith(root + "/"):
            return root
    return None


# Where a value lands: its normal absolute path, the root that holds it, and the path as written (made
# absolute) when that has a ".." component, which the kernel resolves differently when a link precedes it.
_Placed = tuple[str, str, "str | None"]


def _joined(path: str, base: str) -> str:
    """``path`` made absolute the way the server would: "~" expanded, a relative path taken from ``base``."""
    if path.startswith("~"):
        path = os.path.expanduser(path)
    return path if path.startswith("/") else base + "/" + path


def _climbs(joined: str) -> bool:
    return ".." in joined and ".." in joined.split("/")


def _absolute(path: str, base: str) -> str:
    return _normal(_joined(path, base))


def _normal(joined: str) -> str:
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
    return _resolved_inside(placed, rules) if rules.resolve_symlinks else PASS


def _check_readings(value: str, rules: PathRules) -> GuardResult:
    """Any value: admitted only when every way a server might read it stays inside the roots."""
    if "\x00" in value or has_control_characters(value) or has_control_characters(decode_fully(value)):
        return refuse("the path contains NUL or control characters")
    marked = _encoding_marks(value, rules)
    if marked is not None:
        return marked
    if _encoded_syntax(value):
        return refuse("the path contains encoded path syntax")
    every: list[_Placed] = []
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
        for placed in every:
            verdict = _resolved_inside(placed, rules)
            if verdict is not PASS:
                return verdict
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


def _place(reading: str, rules: PathRules) -> _Placed | GuardResult:
    """Where ``reading`` lands lexically and the root it lies in, or why it is refused."""
    joined = _joined(reading, rules.base)
    absolute = _normal(joined)
    root = _root_of(absolute, rules.roots)
    if root is None:
        return refuse(_OUTSIDE)
    if not rules.allow_hidden and _hidden(absolute, root):
        return refuse("the path names a hidden file or directory")
    return absolute, root, (joined if _climbs(joined) else None)


def _resolved_inside(placed: _Placed, rules: PathRules) -> GuardResult:
    """Whether the kernel's resolution of the path keeps it inside the resolved roots.

    Both spellings are resolved: the normal one (a server may normalise before it opens) and, when it has a
    ".." component, the one as written (a server may pass it to the kernel unchanged). Without "..", the two
    walk the same components.
    """
    absolute, root, joined = placed
    verdict = _resolves_inside(absolute, root, rules)
    if verdict is PASS and joined is not None:
        verdict = _lands_inside(joined, rules)
    return verdict


def _resolves_inside(absolute: str, root: str, rules: PathRules) -> GuardResult:
    """Walk the components below the root with lstat; only a symbolic link needs a full resolution.

    Much cheaper than resolving every call: the root itself was resolved once, at start, and a component
    that does not exist yet cannot be a link (the server would create a plain entry). ``absolute`` is
    normal (no empty, "." or ".." component), so each prefix ending before a "/" is a component's path, and
    with no link on it the kernel lands where the path says.
    """
    if symlink_free is not None and root in rules.linkless_roots and symlink_free(absolute) is NO_LINK:
        return PASS
    end, size = (len(root) if root != "/" else 0), len(absolute)
    while end < size:
        end = absolute.find("/", end + 1)
        if end < 0:
            end = size
        try:
            mode = os.lstat(absolute[:end]).st_mode
        except OSError:
            return PASS
        if S_ISLNK(mode):
            return _lands_inside(absolute, rules)
    return PASS


def _lands_inside(path: str, rules: PathRules) -> GuardResult:
    landed = _kernel_walk(path)
    if type(landed) is GuardResult:
        return landed
    return PASS if _root_of(landed, rules.resolved_roots) is not None else refuse(_THROUGH_A_LINK)


def _kernel_walk(path: str) -> str | GuardResult:
    """Where the kernel's lookup of the absolute ``path`` lands, or why the path is refused.

    Component by component, as Linux walks a path: an empty name and "." stay where they are; ".." goes to
    the parent of the directory reached so far (which is real: no link, existing), and never above "/"; a
    symbolic link is replaced by its target, read from "/" when the target is absolute and from the link's
    own directory otherwise, ahead of the rest of the path, so a ".." after a link climbs from where the link
    leads and links in a target are followed in turn. Every link is followed, the last one too: open()
    follows it, and open(O_CREAT) creates a dangling link's target. Meeting a 41st link is refused (the
    kernel's ELOOP), which bounds the walk.

    From the first name that does not exist, or that follows a file (the kernel's ENOENT and ENOTDIR), the
    rest names entries still to be made (a file to create, directories a server makes on the way) and is
    appended as written; a ".." there is refused, since no lookup climbs out of a directory that is not
    there. A name the guard may not look at (EACCES) counts as missing.
    """
    pending = path.split("/")
    pending.reverse()
    here = ""  # the directory reached, "" for "/"; every component of it exists and is no link
    missing = False
    links = 0
    while pending:
        name = pending.pop()
        if not name or name == ".":
            continue
        if name == "..":
            if missing:
                return refuse(_UP_FROM_MISSING)
            here = here[: here.rfind("/")]
            continue
        parent, here = here, here + "/" + name
        if missing:
            continue
        try:
            mode = os.lstat(here).st_mode
        except OSError:
            missing = True
            continue
        if S_ISLNK(mode):
            links += 1
            if links > _MAX_LINKS:
                return refuse(_LINK_LOOP)
            try:
                target = os.readlink(here)
            except OSError:  # replaced since the lstat: refuse rather than guess
                return refuse(_THROUGH_A_LINK)
            here = "" if target.startswith("/") else parent
            pending.extend(reversed(target.split("/")))
        elif not S_ISDIR(mode):
            missing = True  # a file: nothing is found below it
    return here or "/"
