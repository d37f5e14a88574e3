"""Pointing a client at Bastion, and back: ``bastion client install|uninstall CLIENT``.

Install keeps a timestamped copy of the client's file beside it, then replaces the file's server table by one
``bastion`` entry that runs ``bastion run <configuration>`` and the remote (url) entries the table had, which import
leaves to the client (``importer.is_remote_entry``); every other key of the file is kept. What was done
is recorded in Bastion's state folder (the backup, and a hash of the file as install wrote it), so uninstall
puts the backup back only while the file is as install left it: a change made since would be lost.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bastion.clients.discovery import ClientSpec
from bastion.clients.importer import is_remote_entry
from bastion.jsonc import parse_jsonc

ENTRY_NAME = "bastion"


class InstallError(Exception):
    """Install or uninstall cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class Installed:
    client_file: Path
    backup: Path | None   # None: the client had no file before
    command: list[str]
    remote: tuple[str, ...] = ()  # the remote servers kept in the client's file, which it reaches directly


def bastion_command() -> list[str]:
    """How a client starts this Bastion: its absolute executable, or this Python running the package."""
    launched = Path(sys.argv[0])
    if launched.name == "bastion" and launched.is_file():
        return [str(launched.absolute())]
    return [sys.executable, "-m", "bastion"]


def record_path(state_dir: Path, spec: ClientSpec) -> Path:
    return state_dir / "clients" / f"{spec.key}.json"


def install(spec: ClientSpec, client_file: Path, configuration: Path, state_dir: Path) -> Installed:
    record = record_path(state_dir, spec)
    if record.exists():
        raise InstallError(f"{spec.label} is already pointed at Bastion (see {record}); run `bastion client "
                           f"uninstall {spec.key}` first")
    original = client_file.read_bytes() if client_file.exists() else None
    data: dict[str, Any] = {}
    if original is not None:
        try:
            data = parse_jsonc(original.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise InstallError(f"{client_file}: not valid JSON ({error}); fix the file first, nothing was changed") \
                from None
        if not isinstance(data, dict):
            raise InstallError(f"{client_file}: the top level is not an object; nothing was changed")
    table = data.get(spec.servers_key)
    remote = {name: entry for name, entry in table.items() if is_remote_entry(entry)} if isinstance(table, dict) else {}
    if ENTRY_NAME in remote:
        raise InstallError(f"{client_file}: a remote server is named {ENTRY_NAME!r}, the name install gives its entry; "
                           "rename it in the file first, nothing was changed")
    backup = None
    if original is not None:
        backup = client_file.with_name(f"{client_file.name}.bastion-backup-{time.strftime('%Y%m%dT%H%M%S')}")
        shutil.copy2(client_file, backup)
    command = [*bastion_command(), "run", str(configuration.absolute())]
    entry: dict[str, Any] = {"command": command[0], "args": command[1:]}
    if spec.servers_key == "servers":
        entry = {"type": "stdio", **entry}
    written = {**data, spec.servers_key: {ENTRY_NAME: entry, **remote}}
    text = (json.dumps(written, indent=2) + "\n").encode("utf-8")
    client_file.parent.mkdir(parents=True, exist_ok=True)
    _write(client_file, text)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"client": spec.key, "file": str(client_file.absolute()),
                                  "backup": str(backup) if backup else None,
                                  "installed_sha256": hashlib.sha256(text).hexdigest(),
                                  "installed_servers": written[spec.servers_key],
                                  "configuration": str(configuration.absolute())}, indent=2) + "\n")
    return Installed(client_file, backup, command, tuple(remote))


@dataclass(frozen=True)
class Uninstalled:
    client_file: Path
    backup: Path | None
    how: str  # "restored", "servers restored" (the rest of the file kept as the client changed it), "removed"


def uninstall(spec: ClientSpec, state_dir: Path, *, force: bool = False) -> Uninstalled:
    """Put the client's file back as it was before install.

    Unchanged since install: the backup is copied back byte for byte. Changed only outside its server table (Claude
    Code rewrites ~/.claude.json as it runs): the backup's server table is put back and the rest kept as it is now.
    Its server table changed: refused unless ``force``, which copies the backup back.
    """
    record_file = record_path(state_dir, spec)
    try:
        record = json.loads(record_file.read_text())
    except FileNotFoundError:
        raise InstallError(f"{spec.label} was not pointed at Bastion by `bastion client install` (no record at "
                           f"{record_file}); nothing to undo") from None
    client_file = Path(record["file"])
    backup = Path(record["backup"]) if record.get("backup") else None
    if backup is not None and not backup.exists():
        raise InstallError(f"the backup {backup} of {client_file} is gone; restore the file by hand (remove the "
                           f"{ENTRY_NAME!r} entry), then delete {record_file}")
    current = client_file.read_bytes() if client_file.exists() else None
    unchanged = current is not None and hashlib.sha256(current).hexdigest() == record["installed_sha256"]
    how = "removed" if backup is None else "restored"
    if not unchanged and not force:
        merged = _servers_put_back(current, backup, spec.servers_key, record.get("installed_servers"))
        if merged is None:
            raise InstallError(f"{client_file}: its {spec.servers_key} changed since install (or the file is gone); "
                               f"restoring {backup or 'nothing'} would lose that change. Run `bastion client "
                               f"uninstall {spec.key} --force` to restore it anyway")
        _write(client_file, merged)
        how = "servers restored"
    elif backup is None:
        if client_file.exists():
            client_file.unlink()  # install created it
    else:
        shutil.copy2(backup, client_file)  # the backup stays: a second copy of the user's file costs nothing
    record_file.unlink()
    return Uninstalled(client_file, backup, how)


def _servers_put_back(current: bytes | None, backup: Path | None, key: str, installed: Any) -> bytes | None:
    """The current file with the server table it had before install, if only other keys changed since; else None."""
    if current is None or installed is None:
        return None
    try:
        now = parse_jsonc(current.decode("utf-8"))
        before = parse_jsonc(backup.read_text(encoding="utf-8")) if backup is not None else {}
    except (ValueError, UnicodeDecodeError, OSError):
        return None
    if not isinstance(now, dict) or not isinstance(before, dict) or now.get(key) != installed:
        return None
    restored = {k: v for k, v in now.items() if k != key}
    if key in before:
        restored[key] = before[key]
    return (json.dumps(restored, indent=2) + "\n").encode("utf-8")


def _write(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o600
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)
