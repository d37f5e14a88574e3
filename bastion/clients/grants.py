"""What a local MCP server needs from the sandbox, read from how it is started, and the review of what it gets.

A client's configuration says which folders a server works on only in its arguments (the filesystem server's
folders, mcp-server-git's ``--repository``); the sandbox shows those read-only at most. This module turns them
into the grants the server needs to do what it did in the client, and never grants the home directory, its
parents or ``/`` whole without saying so.

Pure: it looks at the file system only to see which named paths exist, and imports neither the gateway, a
transport nor the sandbox.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from bastion.argument_paths import NEVER_SHOWN, argument_binds, granting, home_and_above, home_ancestors, under

# Folders in the home directory that hold credentials: granted when a user listed them, but said out loud.
_CREDENTIAL_DIRS = (".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".password-store",
                    os.path.join(".config", "gcloud"), os.path.join(".config", "gh"))


@dataclass(frozen=True)
class KnownServer:
    """A published server whose needs are known: how it is named, and what its arguments and environment mean."""

    kind: str
    names: frozenset[str]
    network: tuple[str, ...] = ()


KNOWN_SERVERS: tuple[KnownServer, ...] = (
    KnownServer("filesystem", frozenset({"@modelcontextprotocol/server-filesystem", "mcp-server-filesystem"})),
    KnownServer("git", frozenset({"mcp-server-git", "mcp_server_git"})),
    KnownServer("sqlite", frozenset({"mcp-server-sqlite", "mcp_server_sqlite"})),
    KnownServer("memory", frozenset({"@modelcontextprotocol/server-memory", "mcp-server-memory"})),
    KnownServer("github", frozenset({"@modelcontextprotocol/server-github"}), ("api.github.com:443",)),
    KnownServer("brave-search", frozenset({"@modelcontextprotocol/server-brave-search"}),
                ("api.search.brave.com:443",)),
    KnownServer("slack", frozenset({"@modelcontextprotocol/server-slack"}), ("slack.com:443",)),
    KnownServer("google-maps", frozenset({"@modelcontextprotocol/server-google-maps"}), ("maps.googleapis.com:443",)),
    KnownServer("notion", frozenset({"@notionhq/notion-mcp-server"}), ("api.notion.com:443",)),
    KnownServer("gitlab", frozenset({"@modelcontextprotocol/server-gitlab"}), ("gitlab.com:443",)),
    KnownServer("web", frozenset({"mcp-server-fetch", "mcp_server_fetch", "@modelcontextprotocol/server-puppeteer",
                                  "@playwright/mcp"})),
)


@dataclass(frozen=True)
class GrantInference:
    """Grants inferred for one server (``writable``, ``network``), why, and what was deliberately not granted."""

    sandbox: dict[str, list[str]]
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def infer_grants(name: str, entry: Mapping[str, Any], *, home: str | None = None, base_dir: str | None = None,
                 allow_home: bool = False) -> GrantInference:
    """The sandbox grants server ``name`` needs, from its ``command``, ``args`` and ``env``.

    ``base_dir`` resolves relative paths when the entry has no absolute ``cwd`` (the configuration file's
    folder). The home directory is granted whole only with ``allow_home``; ``/`` and the home's parents never.
    """
    home = os.path.normpath(home or os.path.expanduser("~"))
    command = str(entry.get("command") or "")
    args = [str(arg) for arg in entry.get("args") or () if isinstance(arg, (str, int, float))]
    env = entry.get("env") if isinstance(entry.get("env"), dict) else {}
    cwd = entry.get("cwd")
    base = cwd if isinstance(cwd, str) and os.path.isabs(cwd) else base_dir
    identified = identify(command, args)
    grants = _Grants(name, home, base, allow_home)
    if identified is None:
        grants.hidden_arguments(args)
        return grants.result()
    server, server_args = identified
    if server.kind == "filesystem":
        for folder in (arg for arg in server_args if not arg.startswith("-")):
            grants.writable(folder, "a folder given to the filesystem server")
    elif server.kind == "git":
        for repository in _option_values(server_args, ("--repository", "-r")):
            grants.writable(repository, "the repository given to mcp-server-git")
    elif server.kind == "sqlite":
        for database in _option_values(server_args, ("--db-path",)):
            grants.writable(_folder_of(database, home, base), "the folder of its database (--db-path)")
    elif server.kind == "memory":
        memory_file = env.get("MEMORY_FILE_PATH")
        if isinstance(memory_file, str) and memory_file.startswith(("/", "~")):  # relative: beside its program
            grants.writable(_folder_of(memory_file, home, base), "the folder of MEMORY_FILE_PATH")
        else:
            grants.warn(f"server {name!r} keeps its memory beside its own program, which is read-only in the "
                        "sandbox: set MEMORY_FILE_PATH in its env to a file in a folder it may write")
    elif server.kind == "web":
        grants.warn(f"server {name!r} fetches web pages: no network is granted; add the hosts it may reach to "
                    f"its sandbox.network (host:port)")
    for rule in server.network:
        grants.network(rule, f"the service {server.kind} talks to")
    grants.hidden_arguments(args)
    return grants.result()


def identify(command: str, args: list[str]) -> tuple[KnownServer, list[str]] | None:
    """The known server that ``command args`` starts (``npx -y PKG``, ``uvx PKG``, ``python -m MOD``, a path to its
    executable or script), and the arguments that are its own."""
    tokens = [command, *args]
    for index, token in enumerate(tokens):
        package = package_name(token)
        for server in KNOWN_SERVERS:
            if package in server.names:
                return server, tokens[index + 1:]
    return None


def package_name(token: str) -> str:
    """``@scope/name@1.2`` -> ``@scope/name``; ``name==1.2`` -> ``name``; ``…/node_modules/@scope/name/dist/x.js``
    -> ``@scope/name``; ``/usr/bin/name`` -> ``name``."""
    if "node_modules/" in token:
        parts = token.rsplit("node_modules/", 1)[1].split("/")
        if parts[0] == ".bin":
            return parts[1] if len(parts) > 1 else ""
        return "/".join(parts[:2]) if parts[0].startswith("@") else parts[0]
    if token.startswith("@"):
        scope_and_name, _, _version = token[1:].partition("@")
        return "@" + scope_and_name
    if "/" in token:
        token = os.path.basename(token)
    for separator in ("==", "@", ">=", "~="):
        token = token.split(separator, 1)[0]
    return token


def _option_values(args: list[str], names: tuple[str, ...]) -> list[str]:
    values = []
    for index, arg in enumerate(args):
        if arg in names and index + 1 < len(args):
            values.append(args[index + 1])
        for name in names:
            if arg.startswith(name + "="):
                values.append(arg.split("=", 1)[1])
    return values


def _folder_of(path: str, home: str, base: str | None) -> str:
    resolved = _resolve(path, home, base)
    return os.path.dirname(resolved) if resolved else path


def _resolve(path: str, home: str, base: str | None) -> str | None:
    if path == "~" or path.startswith("~/"):
        path = home + path[1:]
    if not os.path.isabs(path):
        if base is None:
            return None
        path = os.path.join(base, path)
    return os.path.normpath(path)


def tilde(path: str, home: str | None = None) -> str:
    """A path as a person writes it: the home directory as ``~``."""
    home = os.path.normpath(home or os.path.expanduser("~"))
    if path == home:
        return "~"
    if path.startswith(home + "/"):
        return "~" + path[len(home):]
    return path


class _Grants:
    """Collects one server's grants, refusing the dangerous ones with a warning that says what to do instead."""

    def __init__(self, name: str, home: str, base: str | None, allow_home: bool) -> None:
        self._name, self._home, self._base, self._allow_home = name, home, base, allow_home
        self._writable: list[str] = []
        self._network: list[str] = []
        self._reasons: list[str] = []
        self._warnings: list[str] = []
        self._considered: set[str | None] = set()  # paths already granted or refused, said once

    def warn(self, message: str) -> None:
        self._warnings.append(message)

    def writable(self, given: str, why: str) -> None:
        path = _resolve(given, self._home, self._base)
        shown = tilde(path, self._home) if path else given
        self._considered.add(path)
        if path is None:
            self.warn(f"server {self._name!r}: {given!r} is a relative path and there is no folder to resolve it "
                      "against; write it as an absolute path")
        elif path in home_ancestors(self._home):
            self.warn(f"server {self._name!r}: not granting {shown} ({why}): it would expose the whole machine or "
                      "every user's home; list the folders it needs instead")
        elif path == self._home and not self._allow_home:
            self.warn(f"server {self._name!r}: not granting your home directory {shown} whole ({why}): it sees an "
                      "empty private home there instead; list the folders it needs (such as ~/Documents), or import "
                      "with --allow-home to grant it anyway")
        elif any(under(path, root) for root in NEVER_SHOWN):
            self.warn(f"server {self._name!r}: not granting {shown}: the sandbox never shows /proc, /sys or /dev")
        elif not os.path.exists(path):
            self.warn(f"server {self._name!r}: {shown} ({why}) does not exist, so it is not granted; create it "
                      "and import again, or add it to sandbox.writable once it exists")
        elif path not in self._writable:
            if path == self._home:
                self.warn(f"server {self._name!r}: your home directory {shown} is granted whole (--allow-home): it "
                          "may read and change every file in it, keys and tokens included")
            elif self._holds_credentials(path):
                self.warn(f"server {self._name!r}: {shown} holds credentials; it is granted because the client "
                          "configuration lists it")
            self._writable.append(path)
            self._reasons.append(f"writes {shown}: {why}")

    def hidden_arguments(self, args: list[str]) -> None:
        """Say so when an argument names the home directory or a parent of it: the sandbox will not show it."""
        for arg in args:
            candidate = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
            if not candidate.startswith(("/", "~")):
                continue
            path = _resolve(candidate, self._home, self._base)
            if path in self._considered or path not in home_and_above(self._home):
                continue
            self._considered.add(path)
            self.warn(f"server {self._name!r}: its arguments name {tilde(path, self._home)}, which the sandbox does "
                      "not show (it would reveal your home or the whole machine); it sees an empty folder there. "
                      "Name the folders it needs instead")

    def network(self, rule: str, why: str) -> None:
        if rule not in self._network:
            self._network.append(rule)
            self._reasons.append(f"reaches {rule}: {why}")

    def _holds_credentials(self, path: str) -> bool:
        for name in _CREDENTIAL_DIRS:
            secret = os.path.join(self._home, name)
            if path == secret or path.startswith(secret + "/"):
                return True
        return False

    def result(self) -> GrantInference:
        sandbox: dict[str, list[str]] = {}
        if self._writable:
            sandbox["writable"] = self._writable
        if self._network:
            sandbox["network"] = self._network
        return GrantInference(sandbox, tuple(self._reasons), tuple(self._warnings))


def merge_sandbox(explicit: Any, inferred: Mapping[str, list[str]]) -> Any:
    """The entry's own ``sandbox`` with the inferred grants added; what the entry says explicitly wins.

    ``"none"`` stays ``"none"`` (grants without a sandbox are an error); a path the entry grants read-only is
    not made writable; a profile name becomes a table with that profile.
    """
    if not inferred:
        return explicit
    if explicit is None:
        return {key: list(values) for key, values in inferred.items()}
    if isinstance(explicit, str):
        if explicit == "none":
            return explicit
        explicit = {"profile": explicit}
    if not isinstance(explicit, dict) or explicit.get("profile") == "none":
        return explicit  # malformed or unsandboxed: left for validation to explain, or as written
    merged = dict(explicit)
    read_only = set(_strings(explicit.get("read_only")))
    for key, values in inferred.items():
        mine = _strings(explicit.get(key))
        if key == "writable":
            values = [value for value in values if value not in read_only]
        merged[key] = list(dict.fromkeys([*mine, *values]))
        if not merged[key]:
            del merged[key]
    return merged


def _strings(value: Any) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(item) for item in value]
    return []


@dataclass
class ServerReview:
    """What one server may do once it runs through Bastion, in the words a person reviews it in."""

    name: str
    command: str
    origin: str = ""
    reads: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    reaches: list[str] = field(default_factory=list)
    receives: list[str] = field(default_factory=list)
    sandboxed: bool = True
    enabled: bool = True
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how the entry was read: nothing granted or refused

    def lines(self) -> list[str]:
        head = f"{self.name}: {self.command}"
        if self.origin:
            head += f"  (from {self.origin})"
        if not self.enabled:
            head += "  [disabled]"
        if not self.sandboxed:
            return [head, "  NOT SANDBOXED (sandbox = \"none\"): it may read, write and reach whatever you can",
                    f"  receives: {', '.join(self.receives) or 'no variables'}",
                    *(f"  warning: {warning}" for warning in self.warnings),
                    *(f"  note: {note}" for note in self.notes)]
        return [head,
                f"  reads:    {', '.join(self.reads) or 'only its own program files'}",
                f"  writes:   {', '.join(self.writes) or 'nothing that outlives it (a private /tmp and home)'}",
                f"  reaches:  {', '.join(self.reaches) or 'no network'}",
                f"  receives: {', '.join(self.receives) or 'no variables'}",
                *(f"  warning: {warning}" for warning in self.warnings),
                *(f"  note: {note}" for note in self.notes)]

    def summary(self) -> str:
        """One line, for the log."""
        if not self.sandboxed:
            return f"server {self.name!r} is not sandboxed; receives {', '.join(self.receives) or 'no variables'}"
        return (f"server {self.name!r} reads {', '.join(self.reads) or 'only its own program files'}; writes "
                f"{', '.join(self.writes) or 'nothing that outlives it'}; reaches "
                f"{', '.join(self.reaches) or 'no network'}; receives {', '.join(self.receives) or 'no variables'}")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "command": self.command, "origin": self.origin, "enabled": self.enabled,
                "sandboxed": self.sandboxed, "reads": self.reads, "writes": self.writes, "reaches": self.reaches,
                "receives": self.receives, "warnings": self.warnings, "notes": self.notes}


def review(name: str, server: Mapping[str, Any], *, origin: str = "", warnings: Iterable[str] = (),
           home: str | None = None, base_dir: str | None = None) -> ServerReview:
    """Describe a server entry in Bastion's form (``command``, ``args``, ``env``, ``cwd``, ``sandbox``)."""
    home = os.path.normpath(home or os.path.expanduser("~"))
    args = [str(arg) for arg in server.get("args") or ()]
    sandbox = server.get("sandbox")
    sandbox = {"profile": sandbox} if isinstance(sandbox, str) else dict(sandbox or {})
    env = server.get("env") if isinstance(server.get("env"), dict) else {}
    receives = [f"{key} (set in the configuration)" for key in env]
    receives += [f"{key} (passed from your environment)" for key in _strings(sandbox.get("env")) if key not in env]
    result = ServerReview(name=name, command=" ".join([str(server.get("command", "")), *args]), origin=origin,
                          receives=receives, enabled=server.get("enabled", True) is not False,
                          sandboxed=sandbox.get("profile") != "none", warnings=list(warnings))
    writes = [_normalised(path, home) for path in _strings(sandbox.get("writable"))]
    read_grants = [_normalised(path, home) for path in _strings(sandbox.get("read_only"))]
    reads = writes + read_grants
    cwd = server.get("cwd")
    base = cwd if isinstance(cwd, str) and os.path.isabs(cwd) else base_dir
    # The sandbox's own rule: a path named in the arguments inside a grant is as the grant shows it.
    binds = argument_binds(args, base=base or os.getcwd(), home=home, writable=writes, read_only=read_grants)
    reads += [path for path in binds.read_only if path not in reads]
    if (isinstance(cwd, str) and os.path.isabs(cwd) and granting(os.path.normpath(cwd), [*writes, *read_grants]) is None
            and cwd not in home_and_above(home)):
        reads.append(os.path.normpath(cwd))
    result.writes = [tilde(path, home) for path in dict.fromkeys(writes)]
    result.reads = [tilde(path, home) for path in dict.fromkeys(reads)]
    result.reaches = _strings(sandbox.get("network"))
    return result


def _normalised(path: str, home: str) -> str:
    return os.path.normpath(home + path[1:] if path == "~" or path.startswith("~/") else path)


def keep_memory_in(memory_dir: Path, name: str, server: dict[str, Any]) -> str | None:
    """Give a memory server that would keep its file beside its own program (read-only in the sandbox) a file in
    ``memory_dir`` instead, through MEMORY_FILE_PATH in its ``env``; the file's path, or None when it has one."""
    identified = identify(str(server.get("command", "")), [str(arg) for arg in server.get("args", [])])
    if identified is None or identified[0].kind != "memory" or "MEMORY_FILE_PATH" in server.get("env", {}):
        return None
    memory_dir.mkdir(parents=True, exist_ok=True)
    memory_file = str(memory_dir / f"{name}.json")
    server["env"] = {**server.get("env", {}), "MEMORY_FILE_PATH": memory_file}
    return memory_file


def with_inferred_grants(name: str, entry: Mapping[str, Any], *, base_dir: str | None = None,
                         memory_dir: Path | None = None, logger: logging.Logger | None = None) -> dict[str, Any]:
    """``entry`` (Bastion's form) with the grants its arguments imply merged into its ``sandbox``; the review is
    logged at INFO and what was not granted at WARNING. For configurations read straight from a client's file,
    where a memory server without a file of its own gets one in ``memory_dir``, as ``bastion import`` does."""
    logger = logger or logging.getLogger("bastion.clients")
    converted = dict(entry)
    if memory_dir is not None:
        memory_file = keep_memory_in(memory_dir, name, converted)
        if memory_file is not None:
            logger.info("server %r keeps its memory in %s (MEMORY_FILE_PATH): beside its own program it would be "
                        "read-only", name, memory_file)
    inference = infer_grants(name, converted, base_dir=base_dir)
    sandbox = merge_sandbox(entry.get("sandbox"), inference.sandbox)
    if sandbox is not None:
        converted["sandbox"] = sandbox
    for warning in inference.warnings:
        logger.warning("%s", warning)
    logger.info("%s", review(name, converted, base_dir=base_dir).summary())
    return converted
