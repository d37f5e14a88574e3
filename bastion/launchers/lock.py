"""The lock file of a configuration: for each launcher server, the exact package version and its hash.

A Bastion configuration of the user's own (``bastion.toml``) is locked by ``bastion.toml.lock.json`` beside it. A
client's file (``mcpServers``, or VS Code's ``servers``) is not written beside: its lock lives in Bastion's state
directory, ``locks/<name>-<digest of its path>.lock.json``, so nothing is left in ``~/.cursor/`` or a client's
folder. Either holds::

    {"version": 1, "servers": {"memory": {"ecosystem": "npm", "package": "@modelcontextprotocol/server-memory",
     "requested": "@modelcontextprotocol/server-memory", "version": "2026.8.31", "integrity": "sha512-…"}}}

An entry is used while the configuration still asks for the same thing (``requested``); a server whose command
line changed is resolved again. Writes take an exclusive lock on ``.lck`` beside the file and replace it whole,
so two Bastion processes starting together both leave a complete file. The functions block: callers on the
event loop run them on a thread.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

FORMAT_VERSION = 1


@dataclass(frozen=True)
class LockEntry:
    ecosystem: str
    package: str
    requested: str
    version: str
    integrity: str
    # Every package installed with it (npm's lock-file entries, or {name: {version, integrity}} for Python), so a
    # later install reproduces the same tree with every file checked; empty in a file written without it.
    tree: Mapping[str, Any] = field(default_factory=dict)


_TEXT_FIELDS = ("ecosystem", "package", "requested", "version", "integrity")


class LockFileError(Exception):
    """A lock file that cannot be read or written; the message names the file and the fix."""


def lock_path(config_file: Path | None, client_file: bool = False, state: Path | None = None) -> Path | None:
    """Where the lock file of ``config_file`` lives; None for a configuration not read from a file.

    ``client_file``: the file is a client's, kept in ``state``'s ``locks`` folder under a name made of its path."""
    if config_file is None:
        return None
    if not client_file:
        return config_file.with_name(config_file.name + ".lock.json")
    if state is None:
        raise ValueError("a client file's lock lives in the state directory, which was not given")
    digest = hashlib.sha256(str(config_file).encode()).hexdigest()[:16]
    return state / "locks" / f"{config_file.name[:64]}-{digest}.lock.json"  # a file name has at most 255 bytes


def legacy_lock_path(config_file: Path) -> Path:
    """Where Bastion kept a client file's lock before it moved to the state directory: read, never written."""
    return config_file.with_name(config_file.name + ".lock.json")


def user_index_path(state: Path) -> Path:
    """The user-wide index: every request any configuration locked, so another asking the same is not resolved
    again."""
    return state / "locks" / "requests.lock.json"


def request_id(ecosystem: str, key: str) -> str:
    return f"{ecosystem}: {key}"


def read_lock(path: Path) -> dict[str, LockEntry]:
    """Every entry of the lock file at ``path``; an absent file has none."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise LockFileError(f"{path}: cannot read the launcher lock file: {exc.strerror}") from None
    fix = "delete it (the next start installs and locks the newest versions) or restore it from a backup"
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise LockFileError(f"{path}: not valid JSON ({exc}); {fix}") from None
    servers = data.get("servers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise LockFileError(f"{path}: no \"servers\" object; {fix}")
    entries: dict[str, LockEntry] = {}
    for name, entry in servers.items():
        try:
            tree = entry.get("tree") or {}
            if not isinstance(tree, dict):
                raise LockFileError(f"{path}: servers.{name}.tree must be an object; {fix}")
            entries[name] = LockEntry(**{key: str(entry[key]) for key in _TEXT_FIELDS}, tree=tree)
        except (TypeError, KeyError, AttributeError) as exc:
            raise LockFileError(f"{path}: servers.{name} lacks {exc}; {fix}") from None
    return entries


def record(path: Path, updates: dict[str, LockEntry]) -> None:
    """Write ``updates`` into the lock file, keeping every other server's entry as it is."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lck"), "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)  # released when the guard is closed
            entries = read_lock(path)
            entries.update(updates)
            body = {"version": FORMAT_VERSION,
                    "servers": {name: asdict(entries[name]) for name in sorted(entries)}}
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            partial.write_text(json.dumps(body, indent=2) + "\n")
            os.replace(partial, path)
    except OSError as exc:
        raise LockFileError(f"{path}: cannot write the launcher lock file: {exc.strerror}; make its folder "
                            "writable, or versions are resolved again at every start") from None
