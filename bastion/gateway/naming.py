"""How upstream names become the names a client sees, and back.

Tools and prompts are exposed as ``<prefix>__<name>``. A name must fit ``[A-Za-z0-9_.-]{1,128}`` and many clients
cap it at 64 characters, so longer names are shortened deterministically (a readable head and a hash of the
full name); the mapping back to the upstream name is exact because it is a lookup, never a parse.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

SEPARATOR = "__"
MAX_NAME_LENGTH = 64
_INVALID = re.compile(r"[^A-Za-z0-9_.-]")


def sanitize(text: str) -> str:
    return _INVALID.sub("_", text)


def shorten(name: str, limit: int = MAX_NAME_LENGTH) -> str:
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9]}_{digest}"


def expose(prefix: str, name: str) -> str:
    joined = f"{sanitize(prefix)}{SEPARATOR}{sanitize(name)}" if prefix else sanitize(name)
    return shorten(joined)


@dataclass(frozen=True, slots=True)
class Named:
    exposed: str
    server: str
    original: str


@dataclass(frozen=True, slots=True)
class Collision:
    exposed: str
    servers: tuple[str, ...]
    resolution: str


def assign_names(entries: Iterable[tuple[str, str, str]], standing: Mapping[str, int] | None = None,
                 ) -> tuple[dict[str, Named], list[Collision]]:
    """Name every ``(server, prefix, original)`` entry uniquely.

    When two entries would be exposed under the same name, the one that clearly owns it keeps it (``owner``): a
    server of higher ``standing`` (its trust), or among equals the one whose name it is under its own prefix (a
    server with no prefix offering ``ev__write`` does not take the name from the server whose prefix is ``ev``). The
    others, or all of them when none clearly owns it, are qualified with their server name instead (and, should that
    still collide, with a hash of server and name), and the collision is reported. No entry ever silently shadows
    another, and no server can take another's name by offering one that looks like it.
    """
    entries = list(entries)
    wanted: dict[str, list[tuple[str, str, str]]] = {}
    for server, prefix, original in entries:
        wanted.setdefault(expose(prefix, original), []).append((server, prefix, original))
    names: dict[str, Named] = {}
    collisions: list[Collision] = []
    kept: dict[str, tuple[str, str, str]] = {}
    for exposed, claimants in wanted.items():
        keeper = claimants[0] if len(claimants) == 1 else owner(claimants, standing or {})
        if keeper is not None:
            server, _, original = keeper
            names[exposed] = Named(exposed, server, original)
            kept[exposed] = keeper
    for exposed, claimants in wanted.items():
        if len(claimants) == 1:
            continue
        keeper = kept.get(exposed)
        renamed = []
        for claimant in claimants:
            if claimant is keeper:
                continue
            server, _, original = claimant
            candidate = expose(server, original)
            attempt = 0
            while candidate in names or candidate in wanted:
                # Never overwrite a name already given out, even one a server chose to look like ours.
                salt = f"{server}/{original}/{attempt}" if attempt else f"{server}/{original}"
                candidate = shorten(f"{expose(server, original)}_{hashlib.sha256(salt.encode()).hexdigest()[:8]}")
                attempt += 1
            names[candidate] = Named(candidate, server, original)
            renamed.append(candidate)
        resolution = "renamed to " + ", ".join(renamed)
        if keeper is not None:
            resolution = f"kept by server {keeper[0]!r}, whose name it is; the other{'s' if len(renamed) > 1 else ''} " \
                         + resolution
        collisions.append(Collision(exposed, tuple(c[0] for c in claimants), resolution))
    return names, collisions


def owner(claimants: list[tuple[str, str, str]], standing: Mapping[str, int]) -> tuple[str, str, str] | None:
    """The one claimant of a contested name that clearly owns it, None when none does: the one of highest standing,
    and among those the only one whose own prefix puts the name in its namespace (a prefix, rather than none)."""
    def rank(claimant: tuple[str, str, str]) -> tuple[int, int]:
        server, prefix, _ = claimant
        return standing.get(server, 0), 1 if prefix else 0

    best = max(rank(claimant) for claimant in claimants)
    leaders = [claimant for claimant in claimants if rank(claimant) == best]
    return leaders[0] if len(leaders) == 1 else None
