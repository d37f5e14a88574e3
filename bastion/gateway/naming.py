"""How upstream names become the names a client sees, and back.

Tools and prompts are exposed as ``<prefix>__<name>``. A name must fit ``[A-Za-z0-9_.-]{1,128}`` and many clients
cap it at 64 characters, so longer names are shortened deterministically (a readable head and a hash of the
full name); the mapping back to the upstream name is exact because it is a lookup, never a parse.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Iterable

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


def assign_names(entries: Iterable[tuple[str, str, str]]) -> tuple[dict[str, Named], list[Collision]]:
    """Name every ``(server, prefix, original)`` entry uniquely.

    When two entries would be exposed under the same name, neither keeps it: each is qualified with its server
    name instead (and, should that still collide, with a hash of server and name), and the collision is
    reported. No entry ever silently shadows another.
    """
    entries = list(entries)
    wanted: dict[str, list[tuple[str, str, str]]] = {}
    for server, prefix, original in entries:
        wanted.setdefault(expose(prefix, original), []).append((server, prefix, original))
    names: dict[str, Named] = {}
    collisions: list[Collision] = []
    for exposed, claimants in wanted.items():
        if len(claimants) == 1:
            server, _, original = claimants[0]
            names[exposed] = Named(exposed, server, original)
    for exposed, claimants in wanted.items():
        if len(claimants) == 1:
            continue
        renamed = []
        for server, _, original in claimants:
            candidate = expose(server, original)
            attempt = 0
            while candidate in names or candidate in wanted:
                # Never overwrite a name already given out, even one a server chose to look like ours.
                salt = f"{server}/{original}/{attempt}" if attempt else f"{server}/{original}"
                candidate = shorten(f"{expose(server, original)}_{hashlib.sha256(salt.encode()).hexdigest()[:8]}")
                attempt += 1
            names[candidate] = Named(candidate, server, original)
            renamed.append(candidate)
        collisions.append(
            Collision(exposed, tuple(c[0] for c in claimants), "renamed to " + ", ".join(renamed))
        )
    return names, collisions
