"""What the paths named in a local server's arguments add to its sandbox: the one rule both the sandbox's binds
and the review a person reads (``bastion import``, the log of a client file run directly) are decided by.

A server's arguments often name its own files (``--db-path DATA/shop.db``, a filesystem server's folders). A path
that a grant already shows is left to that grant: bound again read-only on top, a database in a writable folder
became read-only ("attempt to write a readonly database"). Only a path no grant shows is bound, read-only, and
only when it exists and is not the machine's or the user's whole tree.

Pure: it looks at the file system only to see which named paths exist, and imports nothing of Bastion, so the
sandbox and the pure deciders that describe it can both use it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

# Kernel interfaces: the sandbox mounts its own, never the host's because an argument names them.
NEVER_SHOWN = ("/proc", "/sys", "/dev")


@dataclass(frozen=True)
class ArgumentBinds:
    """What a server's arguments add to its view: paths bound read-only, and the named paths refused because
    showing them would reveal the user's home or the whole machine (said out loud by the callers)."""

    read_only: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()


def under(path: str, root: str) -> bool:
    """``path`` is ``root`` or inside it (by name: ``/data2`` is not inside ``/data``)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def home_ancestors(home: str) -> list[str]:
    """``/`` and every folder above the home directory: granting one would show every user's files."""
    found, directory = [], home
    while directory not in ("/", ""):
        directory = os.path.dirname(directory)
        found.append(directory)
    return found


def home_and_above(home: str) -> list[str]:
    """The user's home, ``/`` and every folder between: never shown because an argument names them."""
    return [home, *home_ancestors(home)]


def absolute_argument(arg: str, folder: str) -> str:
    """``.``, ``./x`` and ``../x``, alone or as an option's value (``--db-path=./shop.db``), made absolute against
    ``folder``, where the client would run the server: a sandboxed server's working folder is ``/``, so left
    relative they would name other files there than the review and the sandbox's binds were decided for."""
    if arg.startswith("-") and "=" in arg:
        option, value = arg.split("=", 1)
        return f"{option}={absolute_argument(value, folder)}" if value else arg
    if arg in (".", "..") or arg.startswith(("./", "../")):
        return os.path.normpath(os.path.join(folder, arg))
    return arg


def named_paths(args: Iterable[str], base: str, home: str) -> list[str]:
    """The absolute paths ``args`` name (``/data``, ``~/notes``, ``./x``, ``--root=/srv``), normalised: a word
    that does not look like a path is not one."""
    found: list[str] = []
    for arg in args:
        candidates = [arg]
        if arg.startswith("-") and "=" in arg:
            candidates.append(arg.split("=", 1)[1])
        for candidate in candidates:
            if not candidate.startswith(("/", "~", "./", "../")):
                continue
            if candidate == "~" or candidate.startswith("~/"):
                candidate = home + candidate[1:]
            found.append(os.path.normpath(os.path.join(base, candidate)))
    return found


def granting(path: str, grants: Iterable[str]) -> str | None:
    """The innermost grant that shows ``path`` (its mount is the one on top there), or None.

    Decided by name, not by where a symlink leads: inside a grant the server sees the grant's own files, so a
    symlink there (which a server with a writable grant may have made itself) leads only to what the sandbox
    shows anyway, and is never bound on its own, which would reveal its target."""
    holding = [grant for grant in grants if under(path, grant)]
    return max(holding, key=len) if holding else None


def argument_binds(args: Iterable[str], *, base: str, home: str, writable: Iterable[str] = (),
                   read_only: Iterable[str] = ()) -> ArgumentBinds:
    """What ``args`` add to a sandbox that already shows the ``writable`` and ``read_only`` grants.

    A named path inside a grant adds nothing: it stays as the grant shows it (writable where its folder is), and
    so may not exist yet (a database its server creates, with its ``-journal`` beside it). A named path in no
    grant is bound read-only when it exists; ``/proc``, ``/sys`` and ``/dev`` never, and the home directory, ``/``
    and the folders between are refused. ``base`` resolves relative paths (the server's working directory);
    ``home`` is the user's, ``~`` in an argument."""
    grants = [os.path.normpath(grant) for grant in [*writable, *read_only]]
    hidden = home_and_above(os.path.normpath(home))
    bound: list[str] = []
    refused: list[str] = []
    for path in named_paths(args, base, home):
        if granting(path, grants) is not None or any(under(path, root) for root in NEVER_SHOWN):
            continue
        if not os.path.exists(path):
            continue
        if path in hidden:
            refused.append(path)
        elif path not in bound:
            bound.append(path)
    return ArgumentBinds(tuple(bound), tuple(dict.fromkeys(refused)))
