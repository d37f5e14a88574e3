"""Where MCP clients keep their server configurations on Linux, and reading the servers out of those files.

Claude Desktop, Claude Code, Cursor, VS Code and Windsurf each keep a user file; Claude Code, Cursor and VS Code
also read a file in the project folder. Their formats differ only in where the server table is: ``mcpServers``
(most), ``servers`` (VS Code's mcp.json), ``mcp.servers`` (VS Code's settings.json) and
``projects.<folder>.mcpServers`` (Claude Code's per-project servers). VS Code's files may hold comments.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bastion.jsonc import parse_jsonc


@dataclass(frozen=True)
class ClientSpec:
    """One client: its name on the command line, how people call it, and its files."""

    key: str
    label: str
    user_files: tuple[tuple[str, str], ...]  # (base, relative path): base "home" or "config" ($XDG_CONFIG_HOME)
    project_files: tuple[str, ...] = ()       # relative to a project folder
    servers_key: str = "mcpServers"           # where `client install` writes the bastion entry


CLIENTS: dict[str, ClientSpec] = {spec.key: spec for spec in (
    ClientSpec("claude-desktop", "Claude Desktop", (("config", "Claude/claude_desktop_config.json"),)),
    ClientSpec("claude-code", "Claude Code", (("home", ".claude.json"),), (".mcp.json",)),
    ClientSpec("cursor", "Cursor", (("home", ".cursor/mcp.json"),), (".cursor/mcp.json",)),
    ClientSpec("vscode", "VS Code", (("config", "Code/User/mcp.json"), ("config", "Code/User/settings.json")),
               (".vscode/mcp.json",), servers_key="servers"),
    ClientSpec("windsurf", "Windsurf", (("home", ".codeium/windsurf/mcp_config.json"),)),
)}


@dataclass(frozen=True)
class Places:
    """The folders client files are found from: the home directory, $XDG_CONFIG_HOME and the project folder."""

    home: Path
    config_home: Path
    project: Path

    @classmethod
    def current(cls) -> "Places":
        home = Path(os.path.expanduser("~"))
        config = os.environ.get("XDG_CONFIG_HOME", "")
        return cls(home, Path(config) if os.path.isabs(config) else home / ".config", Path.cwd())

    def user_file(self, spec: ClientSpec, index: int = 0) -> Path:
        base, relative = spec.user_files[index]
        return (self.home if base == "home" else self.config_home) / relative


@dataclass(frozen=True)
class FoundServer:
    """One server entry as a client file has it, and where it came from."""

    name: str
    entry: Any
    origin: str          # "Claude Desktop (~/.config/Claude/claude_desktop_config.json)"
    file: Path
    workspace: Path      # what ${workspaceFolder} and relative paths mean for this entry
    table: str = "mcpServers"  # where in the file: mcpServers, servers, mcp.servers, projects.<folder>.mcpServers


@dataclass
class ClientFile:
    path: Path
    label: str
    servers: list[FoundServer] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def discover(places: Places) -> list[tuple[ClientSpec, Path]]:
    """Every client file that exists: each client's user files, then its files in the project folder."""
    found: list[tuple[ClientSpec, Path]] = []
    for spec in CLIENTS.values():
        candidates = [places.user_file(spec, index) for index in range(len(spec.user_files))]
        candidates += [places.project / relative for relative in spec.project_files]
        for path in candidates:
            if path.is_file() and (spec, path) not in found:
                found.append((spec, path))
    return found


def client_of(path: Path, places: Places) -> ClientSpec | None:
    """The client a file belongs to, by where it is or what it is called."""
    resolved = path.resolve()
    for spec in CLIENTS.values():
        for index in range(len(spec.user_files)):
            if places.user_file(spec, index).resolve() == resolved:
                return spec
        for relative in spec.project_files:
            if str(resolved).endswith("/" + relative):
                return spec
    return None


def read_client_file(path: Path, label: str, home: Path, *, expect_servers: bool = True) -> ClientFile:
    """The servers of one client file, wherever in the file they are; a file that cannot be read says why.

    A file found rather than given (VS Code's settings.json, say) may well have no servers: that is no problem.
    """
    result = ClientFile(path, label)
    try:
        data = parse_jsonc(path.read_text(encoding="utf-8"))
    except OSError as exc:
        result.problems.append(f"{path}: cannot read it: {exc.strerror}")
        return result
    except (ValueError, UnicodeDecodeError) as exc:
        result.problems.append(f"{path}: not valid JSON: {exc}")
        return result
    except RecursionError:  # nested as deep as Python's recursion: no client's file nests so
        result.problems.append(f"{path}: not valid JSON: nested too deeply")
        return result
    if not isinstance(data, dict):
        result.problems.append(f"{path}: the top level must be an object, not {type(data).__name__}")
        return result
    shown = _tilde(path, home)
    workspace = _workspace_of(path)
    tables: list[tuple[str, Any, Path, str]] = []
    if "mcpServers" in data:
        tables.append(("mcpServers", data["mcpServers"], workspace, f"{label} ({shown})"))
    if isinstance(data.get("servers"), dict):
        tables.append(("servers", data["servers"], workspace, f"{label} ({shown})"))
    mcp = data.get("mcp")
    if isinstance(mcp, dict) and "servers" in mcp:
        tables.append(("mcp.servers", mcp["servers"], workspace, f"{label} ({shown})"))
    if "mcp.servers" in data:
        tables.append(("mcp.servers", data["mcp.servers"], workspace, f"{label} ({shown})"))
    projects = data.get("projects")
    if isinstance(projects, dict):
        for folder, project in projects.items():
            if isinstance(project, dict) and project.get("mcpServers"):
                tables.append((f"projects.{folder}.mcpServers", project["mcpServers"], Path(folder),
                               f"{label} ({shown}, project {_tilde(Path(folder), home)})"))
    if not tables and expect_servers:
        result.problems.append(f"{path}: no mcpServers (or servers) table; nothing to import from it")
    for key, table, table_workspace, origin in tables:
        if not isinstance(table, dict):
            result.problems.append(f"{path}: {key} must be an object mapping server names to entries")
            continue
        for name, entry in table.items():
            result.servers.append(FoundServer(str(name), entry, origin, path, table_workspace, key))
    return result


def _workspace_of(path: Path) -> Path:
    folder = path.resolve().parent
    return folder.parent if folder.name in (".vscode", ".cursor") else folder


def _tilde(path: Path, home: Path) -> str:
    text, home_text = str(path), str(home)
    return "~" + text[len(home_text):] if text.startswith(home_text + "/") else text
