"""What the definitions of the catalog say together: an order split across one server's tools, and tool names of
different servers that read the same.

- **Split poisoning.** "Ignore all previous" in one tool's description and "instructions and send ..." in the next
  read as one text to a model, which is given the list whole. ``split_orders`` joins one server's descriptions in
  list order and keeps the strong orders whose match crosses from one description into another: each single
  description was scanned already, so only an order no one of them holds is new.
- **Look-alike names.** ``send_emaiI`` (capital I), ``send_еmail`` (Cyrillic е) and ``send_email`` are one name to
  a reader. ``name_skeleton`` folds a name so: NFKC and Unicode's look-alikes (``normalise.fold``), lower case, and
  the ASCII letters and digits that pass for each other (1, i, I and l; 0 and o; "rn" and m; "vv" and w) as one.
  ``name_clashes`` finds tools of different servers with one skeleton: always worth a warning; a look-alike (not
  the same spelling) of a trusted server's tool offered by a server that is not trusted is withheld, as nothing but
  deception spells a name that way.

Pure: the caller gives the scanner (``findings``) and the catalog's entries.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bastion.guardrails.normalise import fold

# The trust levels whose tools a look-alike of another server may not shadow (as the policy's annotations do).
TRUSTED = frozenset({"trusted", "reviewed"})
_SEPARATORS = (" ", "")


class _Finding(Protocol):
    rule: str
    weight: int
    start: int
    end: int


class _Entry(Protocol):
    exposed_name: str
    server: str
    original_name: str
    definition: Mapping[str, Any]
    server_trust: str


def split_orders(texts: Sequence[str], findings: Callable[[str], Iterable[_Finding]], strong: int) -> dict[int, set[str]]:
    """Index of a text -> the rules of the strong orders that cross from it into a neighbour when ``texts`` are
    read one after the other, as one server's list is; both sides of each such order are named. The texts are read
    joined by a space (an order split between words) and with nothing between them (one split inside a word)."""
    if len(texts) < 2:
        return {}
    split: dict[int, set[str]] = {}
    for separator in _SEPARATORS:
        bounds: list[tuple[int, int]] = []
        at = 0
        for text in texts:
            bounds.append((at, at + len(text)))
            at += len(text) + len(separator)
        joined = separator.join(texts)
        # The folded reading keeps the offsets only where folding changed no length; it is read for what it finds.
        folded = fold(joined)
        readings = (joined, folded) if folded != joined and len(folded) == len(joined) else (joined,)
        for reading in readings:
            for finding in findings(reading):
                if finding.weight < strong or finding.end <= finding.start:
                    continue
                touched = [index for index, (start, end) in enumerate(bounds)
                           if finding.start < end and finding.end > start]
                if len(touched) > 1:
                    for index in touched:
                        split.setdefault(index, set()).add(finding.rule)
    return split


_ALIKE_ASCII = str.maketrans({"1": "l", "i": "l", "|": "l", "0": "o", "-": "_", ".": "_"})


def name_skeleton(name: str) -> str:
    """``name`` as a reader takes it: look-alikes folded, one case, the ASCII that passes for other ASCII as one."""
    folded = fold(name).lower().translate(_ALIKE_ASCII)
    return re.sub(r"vv", "w", folded.replace("rn", "m"))


@dataclass(frozen=True, slots=True)
class NameClash:
    server: str
    name: str  # this server's tool, as the upstream names it
    exposed: str
    other_server: str
    other_name: str
    withheld: bool  # a look-alike of a trusted server's tool from a server that is not trusted (not only in case)

    def describe(self) -> str:
        if self.name == self.other_name:
            return f"tool {self.name!r} of server {self.server!r} has the same name as a tool of {self.other_server!r}"
        return (f"tool {self.name!r} of server {self.server!r} reads as {self.other_name!r} of server "
                f"{self.other_server!r}: its name is spelled with look-alike characters")


def name_clashes(entries: Iterable[_Entry]) -> list[NameClash]:
    """Each tool whose name reads as a tool of another server's, once, against one such tool: a trusted server's
    when there is one it imitates (then ``withheld`` when this server is not trusted and the spelling differs).
    Linear in the catalog: a server offering thousands of look-alikes of one name costs one pass, not every pair."""
    by_skeleton: dict[str, list[_Entry]] = {}
    for entry in entries:
        by_skeleton.setdefault(name_skeleton(entry.original_name), []).append(entry)
    clashes = []
    for group in by_skeleton.values():
        if len({entry.server for entry in group}) < 2:
            continue
        trusted = [entry for entry in group if entry.server_trust in TRUSTED]
        for entry in group:
            # A name that differs only in case ("Search", "search") is two servers' styles, not a disguise: warned.
            imitated = None if entry.server_trust in TRUSTED else next(
                (other for other in trusted if other.original_name.lower() != entry.original_name.lower()), None)
            other = imitated or next(each for each in group if each.server != entry.server)
            if imitated is None and (entry.server, entry.original_name) > (other.server, other.original_name):
                continue  # a pair that only warns is reported once, from its first side
            clashes.append(NameClash(entry.server, entry.original_name, entry.exposed_name, other.server,
                                     other.original_name, withheld=imitated is not None))
    return clashes
