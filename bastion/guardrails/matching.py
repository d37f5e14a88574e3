"""Many detectors over one text in one pass: Hyperscan finds where any of them may match, RE2 confirms each hit.

Running two hundred regular expressions one after another over a 1 MB result costs hundreds of milliseconds in
Python's ``re``; Hyperscan runs them all as one automaton, at about 2 ms a megabyte here, and reports only where a
match ends. Each hit is then confirmed and cut out by the same expression in RE2 (the syntax the gitleaks rules are
written in) on a small window before that end, and passed to the detector's own check (entropy, checksum,
allowlist). The text is encoded to UTF-8 once and every detector reads that one buffer.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import os
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import hyperscan
import re2

# (value, whole match, the line around it) -> whether this is a finding
Check = Callable[[bytes, bytes, bytes], bool]

# How far before a reported end a match may begin: every single-line rule's longest match fits in it; a rule whose
# match spans lines (a PEM private key) says so with its own lookback.
DEFAULT_LOOKBACK = 512
# Context after a match's end that its trailing boundary (``\b``, ``$``, a quote) is checked against.
_LOOKAHEAD = 64


@dataclass(frozen=True, slots=True)
class Detector:
    guardrail: str  # "secrets" or "pii"
    kind: str  # what the marker names: "aws-access-key", "email", ...
    rule: str  # where the expression comes from: a gitleaks rule id, or "bastion:<name>"
    pattern: str  # RE2 syntax (Hyperscan reads the same)
    group: int = 0  # the capture group that is the value itself (0: the whole match)
    check: Check | None = None
    # (the whole text, the value's start and end) -> whether the value stands alone there; for tests of the context
    # that would make the expression itself slow in Hyperscan (a lookbehind written as a class matching most text).
    context: Callable[[bytes, int, int], bool] | None = None
    lookback: int = DEFAULT_LOOKBACK
    generic: bool = False  # a specific detector's finding wins over a generic one's on the same value
    # As in gitleaks: when given, the detector applies only to a text that holds one of these (any case), which is
    # what keeps a rule such as "any 40 hex digits, near the word sourcegraph" from matching every commit id.
    keywords: tuple[str, ...] = ()
    # Detectors of one shard are compiled into one Hyperscan database (by default, one per guardrail). Measured on
    # 1 MB of source code: the secret rules alone scan in 1.6 ms and the personal-data ones in 1.7 ms when e-mail has
    # its own shard, but all of them in one database take 8.7 ms.
    shard: str = ""


@dataclass(frozen=True, slots=True)
class Finding:
    detector: Detector
    start: int  # byte offsets of the value in the UTF-8 text
    end: int


@dataclass(slots=True)
class _Hits:
    ends: list[int] = field(default_factory=list)


class Matcher:
    """The compiled form of a set of detectors; ``find`` is safe to call from several threads at once."""

    def __init__(self, detectors: Sequence[Detector], cache: Path | None = None) -> None:
        self.detectors = tuple(detectors)
        self._confirm = tuple(re2.compile(detector.pattern.encode()) for detector in self.detectors)
        self._keywords = tuple(sorted({word.lower() for detector in self.detectors for word in detector.keywords}))
        keyword_ids = {word: len(self.detectors) + index for index, word in enumerate(self._keywords)}
        self._needs = tuple(frozenset(keyword_ids[word.lower()] for word in detector.keywords)
                            for detector in self.detectors)
        self._databases = _databases(self.detectors, self._keywords, cache)
        # A shard whose every detector needs a keyword is not scanned when none of them is in the text: most short
        # answers hold no key-like word, no "@" and no digit, and are then read by the keyword pass alone.
        self._shard_needs = [_shard_needs([self._needs[index] for index in indexes]) for indexes, _ in self._databases]
        # Hyperscan's scratch space may serve one scan at a time: one per thread that scans.
        self._scratch = threading.local()

    def find(self, data: bytes) -> list[Finding]:
        """The findings in ``data``, in order, none overlapping another."""
        if not self.detectors or not data:
            return []
        hits: dict[int, _Hits] = {}

        def on_match(index: int, _start: int, end: int, _flags: int, _context: object) -> None:
            hits.setdefault(index, _Hits()).ends.append(end)

        for (_, database), needs, scratch in zip(self._databases, self._shard_needs, self._scratches_for_thread()):
            if needs is not None and needs.isdisjoint(hits):
                continue
            database.scan(data, match_event_handler=on_match, scratch=scratch)
        candidates: list[Finding] = []
        for index, found in hits.items():
            if index >= len(self.detectors):
                continue  # a keyword
            needs = self._needs[index]
            if needs and needs.isdisjoint(hits):
                continue
            candidates.extend(self._confirmed(index, found.ends, data))
        return _without_overlaps(candidates) if len(candidates) > 1 else candidates

    def _scratches_for_thread(self) -> list[hyperscan.Scratch]:
        scratches = getattr(self._scratch, "spaces", None)
        if scratches is None:
            scratches = self._scratch.spaces = [hyperscan.Scratch(database) for _, database in self._databases]
        return scratches

    def _confirmed(self, index: int, ends: list[int], data: bytes) -> Iterable[Finding]:
        detector = self.detectors[index]
        expression = self._confirm[index]
        seen: set[tuple[int, int]] = set()
        for window_start, window_end in _windows(ends, detector.lookback, len(data), data):
            # A copy of the window, not pos/endpos on the whole text: RE2's binding costs time in proportion to the
            # whole text on every call that way (90 µs against 11 µs for a window of a 1 MB text).
            window = data[window_start:window_end]
            for match in expression.finditer(window):
                start, end = match.span(detector.group)
                if start < 0 or start == end:
                    continue
                start, end = start + window_start, end + window_start
                if (start, end) in seen:
                    continue
                seen.add((start, end))
                if detector.context is not None and not detector.context(data, start, end):
                    continue
                if detector.check is not None:
                    line = _line_around(data, match.start() + window_start, match.end() + window_start)
                    if not detector.check(data[start:end], match.group(0), line):
                        continue
                yield Finding(detector, start, end)


def _databases(detectors: tuple[Detector, ...], keywords: tuple[str, ...],
               cache: Path | None) -> list[tuple[list[int], hyperscan.Database]]:
    """The keywords as one Hyperscan database, scanned first, then the detectors' expressions, one database per
    shard, each with the indexes of its detectors. Each expression's id is its detector's index (a keyword's: after
    the last detector)."""
    shards: dict[str, list[tuple[int, bytes, int]]] = {}
    literal = hyperscan.HS_FLAG_CASELESS | hyperscan.HS_FLAG_SINGLEMATCH
    if keywords:
        shards["\0keywords"] = [(len(detectors) + index, _literal(word), literal) for index, word in enumerate(keywords)]
    for index, detector in enumerate(detectors):
        shards.setdefault(detector.shard or detector.guardrail, []).append((index, detector.pattern.encode(), 0))
    return [([index for index, _, _ in entries if index < len(detectors)], _database(entries, cache))
            for entries in shards.values()]


def _shard_needs(needs: list[frozenset[int]]) -> frozenset[int] | None:
    """The keywords one of which must be in a text for a shard to be worth scanning; None when it always is."""
    if not needs or not all(needs):
        return None
    return frozenset().union(*needs)


def _database(entries: list[tuple[int, bytes, int]], cache: Path | None) -> hyperscan.Database:
    """One Hyperscan database; compiling two hundred expressions takes about a second, so the compiled form is kept
    in ``cache`` (a folder) under a name that changes with them."""
    digest = hashlib.sha256(repr((hyperscan.__version__, entries)).encode()).hexdigest()[:24]
    cached = cache / f"hyperscan-{digest}.db" if cache is not None else None
    if cached is not None:
        try:
            return hyperscan.loadb(cached.read_bytes(), hyperscan.HS_MODE_BLOCK)
        except (OSError, hyperscan.HyperscanError):
            pass  # absent, or built by another Hyperscan or CPU: compile it again
    database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    database.compile(expressions=[expression for _, expression, _ in entries], ids=[index for index, _, _ in entries],
                     elements=len(entries), flags=[flags for _, _, flags in entries])
    if cached is not None:
        _write_atomically(cached, hyperscan.dumpb(database))
    return database


def _literal(word: str) -> bytes:
    return b"".join(bytes((byte,)) if byte < 128 and chr(byte).isalnum() else b"\\x%02x" % byte for byte in word.encode())


def _write_atomically(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as out:
            out.write(data)
        os.replace(out.name, path)
    except OSError:
        pass  # a cache only: without it the next start compiles again


def _windows(ends: list[int], lookback: int, size: int, data: bytes) -> list[tuple[int, int]]:
    """Where to look for the matches ending at ``ends``: overlapping windows merged, each starting at a line start
    when one is near, so an anchored expression sees its real context."""
    merged: list[tuple[int, int]] = []
    for end in sorted(set(ends)):
        start = max(0, end - lookback)
        line_start = data.rfind(b"\n", max(0, start - 256), start) + 1
        if line_start > 0:
            start = line_start
        stop = min(size, end + _LOOKAHEAD)
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def _line_around(data: bytes, start: int, end: int) -> bytes:
    line_start = data.rfind(b"\n", max(0, start - 1024), start) + 1
    line_end = data.find(b"\n", end, end + 1024)
    return data[line_start if line_start > 0 else max(0, start - 1024):line_end if line_end >= 0 else end + 1024]


def _without_overlaps(findings: list[Finding]) -> list[Finding]:
    # Where findings overlap, a specific secret rule wins over personal data (the password of a connection string
    # also reads as the start of an e-mail address), and both over a generic rule (whose value may take in a trailing
    # dot and so be longer); within a tier, the earliest, then the longest.
    findings.sort(key=lambda found: (found.start, found.start - found.end))
    kept: list[Finding] = []
    starts: list[int] = []
    for tier in (_SPECIFIC_SECRET, _PERSONAL, _GENERIC):
        for found in _greedy([found for found in findings if _tier(found.detector) == tier]):
            after = bisect.bisect_left(starts, found.end)  # the kept ones starting before this one ends
            if after and kept[after - 1].end > found.start:
                continue
            kept.insert(after, found)
            starts.insert(after, found.start)
    return kept


_SPECIFIC_SECRET, _PERSONAL, _GENERIC = range(3)


def _tier(detector: Detector) -> int:
    if detector.generic:
        return _GENERIC
    return _SPECIFIC_SECRET if detector.guardrail == "secrets" else _PERSONAL


def _greedy(findings: list[Finding]) -> list[Finding]:
    kept: list[Finding] = []
    for found in findings:
        if kept and found.start < kept[-1].end:
            continue
        kept.append(found)
    return kept


def shannon_entropy(value: bytes) -> float:
    """Bits per character of ``value``, as gitleaks computes it for its ``entropy`` thresholds."""
    if not value:
        return 0.0
    size = len(value)
    return -sum(count / size * math.log2(count / size) for count in Counter(value).values())
