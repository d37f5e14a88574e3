"""One Bastion configuration from the servers of the user's client files: merged, with grants, and reviewed.

Each entry is converted the way its client reads it (``${workspaceFolder}`` and the other variables, ``envFile``,
``disabled``, relative paths) into Bastion's form, given the grants its arguments imply, and marked
``trust = "reviewed"``: the person who runs import reads the review of what each server may do. A name used by
two clients for different servers is renamed; the same server configured twice is imported once.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import tomli_w

from bastion import variables as client_variables
from bastion.argument_paths import absolute_argument
from bastion.clients.discovery import FoundServer
from bastion.clients.grants import ServerReview, infer_grants, keep_memory_in, merge_sandbox, review, tilde
from bastion.plaintext import is_plaintext_remote

# Keys of client entries that Bastion's own form has no place for (handled or meaningless here).
_CLIENT_ONLY_KEYS = {"type", "disabled", "autoApprove", "alwaysAllow", "timeout", "description", "envFile",
                     "transportType"}
# A tuple, not a set: the "type" looked up in it may be any JSON value, and a set cannot take an object.
_REMOTE_TYPES = ("http", "sse", "streamable-http", "streamableHttp")
# Keys that mean the same in a client entry as in Bastion's (a client file may already carry Bastion's settings).
_KEPT_AS_WRITTEN = ("sandbox", "prefix", "era", "request_timeout", "startup_timeout")
_CONVERTED_KEYS = ("command", "args", "env", "cwd")
# ${env:NAME} and ${NAME} read the environment; these others only name places, and are no secret to copy.
_ENV_REFERENCE = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-[^}]*)?\}")
_FILE_VARIABLES = {"workspaceFolder", "workspaceFolderBasename", "userHome", "pathSeparator"}


@dataclass
class ImportedServer:
    name: str
    server: dict[str, Any]
    review: ServerReview
    found: FoundServer


@dataclass
class ImportResult:
    servers: list[ImportedServer] = field(default_factory=list)
    renamed: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def configuration(self) -> dict[str, Any]:
        """Bastion's configuration, as a table for TOML."""
        return {"servers": {server.name: server.server for server in self.servers}}


class ImportRefused(Exception):
    """The output exists (or cannot be written); the message says what to do."""


def import_servers(found: list[FoundServer], *, home: Path, allow_home: bool = False,
                   environ: Mapping[str, str] | None = None, memory_dir: Path | None = None) -> ImportResult:
    """Convert and merge ``found`` (in order: the first of a name keeps it).

    ``memory_dir``: where a memory server that keeps its file beside its own program (read-only in the sandbox)
    keeps it instead; created here. None leaves such a server as it is, with a warning.
    """
    environ = os.environ if environ is None else environ
    result = ImportResult()
    by_name: dict[str, ImportedServer] = {}
    for item in found:
        converted = convert_entry(item, home=home, environ=environ)
        if isinstance(converted, str):
            result.skipped.append(converted)
            continue
        server, notes = converted
        same = next((other for other in by_name.values() if _same_server(other.server, server)), None)
        if same is not None:
            result.duplicates.append(f"{item.name!r} from {item.origin} is the same server as {same.name!r} from "
                                     f"{same.found.origin}; imported once")
            continue
        name = _free_name(item, by_name)
        if name != item.name:
            result.renamed.append(f"{item.name!r} from {item.origin} is imported as {name!r} (the name {item.name!r} "
                                  f"is taken by the server from {by_name[item.name].found.origin})")
        if memory_dir is not None:
            memory_file = keep_memory_in(memory_dir, name, server)
            if memory_file is not None:
                notes.append(f"its memory is kept in {tilde(memory_file, str(home))} "
                             "(MEMORY_FILE_PATH): beside its own program it would be read-only")
        inference = infer_grants(name, server, home=str(home), base_dir=str(item.workspace), allow_home=allow_home)
        sandbox = merge_sandbox(server.get("sandbox"), inference.sandbox)
        if sandbox is not None:
            server["sandbox"] = sandbox
        server["trust"] = "reviewed"
        server_review = review(name, server, origin=item.origin, warnings=inference.warnings,
                               home=str(home), base_dir=str(item.workspace))
        server_review.notes = notes
        imported = ImportedServer(name, server, server_review, item)
        by_name[name] = imported
        result.servers.append(imported)
    return result


def is_remote_entry(entry: Any) -> bool:
    """A client's entry the client reaches by URL, with no process to start: import leaves it to the client, and
    install keeps it in the client's file (one rule, so that what the review says is what install does)."""
    return isinstance(entry, dict) and ("url" in entry or "serverUrl" in entry or entry.get("type") in _REMOTE_TYPES)


def convert_entry(item: FoundServer, *, home: Path, environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]] | str:
    """Bastion's form of one client entry and notes about it, or why it is not imported."""
    entry, where = item.entry, f"{item.name!r} from {item.origin}"
    if not isinstance(entry, dict):
        return f"{where}: the entry is not an object; skipped"
    if is_remote_entry(entry):
        url = entry.get("url", entry.get("serverUrl"))
        plaintext = (f"; its url {url} is plain http:// to a host that is not loopback, which Bastion refuses "
                     "unless you use https:// or add allow_plaintext = true to the entry"
                     if isinstance(url, str) and is_plaintext_remote(url) else "")
        return (f"{where}: a remote server (url); import copies local (command) servers only, so the client "
                "keeps reaching it directly, not through Bastion (`bastion client install` leaves it in the "
                "client's file); skipped (to put it behind Bastion, add it to Bastion's file by hand with url and "
                f"headers, docs/http.md, and remove it from the client's file{plaintext})")
    if not isinstance(entry.get("command"), str) or not entry["command"].strip():
        return f"{where}: no command; skipped"
    if not isinstance(entry.get("args") or [], list):  # the client cannot start it either
        return f"{where}: args is not a list; skipped"
    expander = client_variables.Variables(item.workspace, home, environ)
    notes: list[str] = []
    server: dict[str, Any] = {}
    try:
        server["command"] = _absolute_command(expander.expand(entry["command"]), item.workspace)
        if entry.get("args"):
            server["args"] = [absolute_argument(expander.expand(str(arg)), str(item.workspace))
                              for arg in entry["args"]]
            if any(_reads_environment(str(arg)) for arg in entry["args"]):
                notes.append("args: their environment variables were expanded at this import and the values written "
                             "into the configuration")
        if isinstance(entry.get("cwd"), str):
            server["cwd"] = os.path.normpath(os.path.join(item.workspace, expander.expand(entry["cwd"])))
        env, passed = _environment(item, expander, notes)
    except client_variables.VariableError as error:
        return f"{where}: {error}; fix: {error.fix}; skipped"
    if env:
        server["env"] = env
    for key in _KEPT_AS_WRITTEN:
        if key in entry:
            server[key] = entry[key]
    if passed:
        server["sandbox"] = merge_sandbox(server.get("sandbox"), {"env": passed})
    disabled = entry.get("disabled")
    if disabled is True:
        server["enabled"] = False
        notes.append("disabled in the client, imported disabled")
    elif isinstance(disabled, str) and disabled:
        server["enabled"] = False  # what the client does: any text but "" is true
        notes.append(f"disabled is given as text ({disabled!r}), which the client reads as true: imported "
                     "disabled; set enabled = true to start it")
    approved = entry.get("autoApprove") or entry.get("alwaysAllow")
    if isinstance(approved, list) and approved:
        server["auto_approve"] = [str(tool) for tool in approved]
    ignored = sorted(set(entry) - {*_CONVERTED_KEYS, *_KEPT_AS_WRITTEN} - _CLIENT_ONLY_KEYS)
    if ignored:
        notes.append(f"ignored keys Bastion does not know: {', '.join(ignored)}")
    return server, notes


def _environment(item: FoundServer, expander: client_variables.Variables,
                 notes: list[str]) -> tuple[dict[str, str], list[str]]:
    """The entry's env (and envFile) values, and the names it takes from the environment as they are.

    ``"TOKEN": "${env:TOKEN}"`` means "the TOKEN the client was started with": it becomes a pass-through
    (sandbox.env) so the secret is not copied into the new file. Other variables are expanded now.
    """
    env: dict[str, str] = {}
    passed: list[str] = []
    env_file = item.entry.get("envFile")
    if isinstance(env_file, str) and env_file:
        path = Path(os.path.join(item.workspace, expander.expand(env_file)))
        try:
            env.update(client_variables.read_dotenv(path))
            notes.append(f"env values read from its envFile {path}")
        except (OSError, ValueError) as error:
            notes.append(f"its envFile {path} could not be read ({error}); its variables are not set")
    raw_env = item.entry.get("env")
    if isinstance(raw_env, dict):
        for key, value in raw_env.items():
            value = str(value)
            if value in (f"${{env:{key}}}", f"${{{key}}}"):
                passed.append(str(key))
                env.pop(str(key), None)
                continue
            expanded = expander.expand(value)
            if _reads_environment(value):
                notes.append(f"{key}: its variables were expanded from the environment of this import and the value "
                             "written into the configuration")
            env[str(key)] = expanded
    return env, passed


def _reads_environment(text: str) -> bool:
    return any(match.group(1) not in _FILE_VARIABLES for match in _ENV_REFERENCE.finditer(text))


def _absolute_command(command: str, workspace: Path) -> str:
    if "/" in command and not os.path.isabs(command):
        return os.path.normpath(os.path.join(workspace, command))
    return command


def _same_server(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    keys = ("command", "args", "env", "cwd")
    return all(one.get(key) == other.get(key) for key in keys)


def _free_name(item: FoundServer, taken: Mapping[str, Any]) -> str:
    name = item.name.replace("/", "-").strip() or "server"
    if name not in taken:
        return name
    client = item.origin.split(" (", 1)[0].lower().replace(" ", "-")
    candidate, number = f"{name}-{client}", 2
    while candidate in taken:
        candidate, number = f"{name}-{client}-{number}", number + 1
    return candidate


def render_toml(result: ImportResult, sources: list[str]) -> str:
    header = ["# Bastion configuration written by `bastion import` from:"]
    header += [f"#   {source}" for source in sources]
    header += ["# Each server was reviewed at import (trust = \"reviewed\"): read-only tools run at once, others ask.",
               "# Its sandbox grants come from its arguments; see docs/import.md.", ""]
    return "\n".join(header) + "\n" + tomli_w.dumps(result.configuration()).rstrip("\n") + "\n"


def write_configuration(path: Path, text: str, *, force: bool) -> Path | None:
    """Write ``text`` to ``path`` (readable by its owner only: it may hold tokens); with ``force`` an existing file
    is first copied to a timestamped backup, which is returned."""
    backup = None
    if path.exists():
        if not force:
            raise ImportRefused(f"{path} exists; import again with --force to replace it (a backup is kept), or "
                                "give another path with --output")
        backup = path.with_name(f"{path.name}.{time.strftime('%Y%m%dT%H%M%S')}.bak")
        shutil.copy2(path, backup)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)
    return backup
