"""Bastion's configuration: the typed model, the file formats it is read from, and the built-in default.

Two formats are read: Bastion's own file (TOML or JSON, a ``servers`` table) and the ``mcpServers`` JSON that
Claude Desktop, Cursor and VS Code (``servers``) already use. Every error names the file, the key and the fix.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from bastion import paths
from bastion.diagnostics import Finding
from bastion.protocol.jsonrpc import DEFAULT_MAX_MESSAGE_BYTES
from bastion.policy.config import PolicyConfig
from bastion.sandbox import SandboxConfig

log = logging.getLogger("bastion.config")

# Keys that other clients put in mcpServers entries; they mean nothing to Bastion and are dropped.
_FOREIGN_ENTRY_KEYS = {"type", "disabled", "autoApprove", "alwaysAllow", "timeout", "description", "envFile", "transportType"}


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1, description="the executable to start")
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="variables set for this server only")
    cwd: str | None = None
    prefix: str | None = Field(
        default=None, description='prefix for tool and prompt names; default: the server name; "" for none'
    )
    trust: Literal["untrusted", "trusted"] = "untrusted"
    era: Literal["auto", "legacy", "modern"] = Field(
        default="auto", description="protocol era; auto probes server/discover and falls back to initialize"
    )
    request_timeout: float = Field(default=120.0, gt=0, description="seconds before an unanswered request fails")
    startup_timeout: float = Field(default=30.0, gt=0)
    enabled: bool = True
    auto_approve: list[str] = Field(
        default_factory=list,
        description="tools (as the server names them) approved in advance, from a client's autoApprove/alwaysAllow",
    )
    sandbox: SandboxConfig = Field(
        default_factory=SandboxConfig, description='OS sandbox profile and grants; "none" only when written explicitly'
    )
    # The configuration file the server was read from (None: built in); its launcher lock file lives beside it.
    _config_file: Path | None = PrivateAttr(default=None)

    @property
    def config_file(self) -> Path | None:
        return self._config_file

    @field_validator("command")
    @classmethod
    def _no_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("command must not be blank")
        return value


class ToolsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exposure: Literal["all", "search"] = Field(
        default="all", description="all: list every permitted tool; search: list search_tools and call_tool"
    )
    always_list: list[str] = Field(default_factory=list, description="tools listed in search mode too (exposed names)")
    # MiniLM's cost per tool grows with its text: 128 word pieces keep the parameters (the best
    # recall), 32 about the name and the description's first sentence (a 10,000-tool catalog
    # embedded about three times faster, for about 1.5 points of Recall@5 on BFCL).
    embedding_tokens: int = Field(
        default=128, ge=16, le=256, description="word pieces of each tool's text the sentence model reads in search mode"
    )


class GatewayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    servers: dict[str, ServerConfig] = Field(default_factory=dict)
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, ge=1024)
    page_size: int = Field(default=0, ge=0, description="items per list page sent to clients; 0 sends one page")
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    policy: PolicyConfig | None = Field(
        default=None, description="authorization, guards, approval, rate limits and audit; absent: every call is allowed"
    )
    ready_timeout: float = Field(default=30.0, gt=0, description="how long a client's first request waits for servers")
    # The file this configuration was read from (None: built in); what lives beside it, such as the launcher lock
    # file, is found from here.
    _source: Path | None = PrivateAttr(default=None)
    # What loading noticed and let through (a remote entry skipped, a client key ignored); `bastion check` reports it.
    _notes: tuple[Finding, ...] = PrivateAttr(default=())

    @property
    def source(self) -> Path | None:
        return self._source

    def with_source(self, source: Path | None) -> "GatewayConfig":
        self._source = source
        for server in self.servers.values():
            server._config_file = source
        return self

    @property
    def load_notes(self) -> tuple[Finding, ...]:
        return self._notes

    def with_notes(self, notes: "list[Finding] | tuple[Finding, ...]") -> "GatewayConfig":
        self._notes = tuple(notes)
        return self

    @field_validator("servers")
    @classmethod
    def _valid_names(cls, servers: dict[str, ServerConfig]) -> dict[str, ServerConfig]:
        for name in servers:
            if not name or "/" in name or name != name.strip():
                raise ValueError(f"server name {name!r} must be non-empty, without '/' or surrounding spaces")
        return servers


class ConfigError(Exception):
    """A configuration that cannot be used; the message says where and how to fix it."""


def load_config(path: str | os.PathLike[str] | None) -> GatewayConfig:
    """Read a configuration file, or the built-in default when ``path`` is None."""
    if path is None:
        return default_config()
    file = Path(path)
    try:
        text = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the configuration: {exc.strerror}") from None
    data = _parse(file, text)
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: the top level must be an object/table, not {type(data).__name__}")
    data = _normalize(file, data)
    policy = data.get("policy")
    if isinstance(policy, dict) and "base_dir" not in policy:
        # Policy files named relative to the configuration are read from beside it.
        data = {**data, "policy": {**policy, "base_dir": str(file.resolve().parent)}}
    try:
        return GatewayConfig.model_validate(data).with_source(file.resolve())
    except ValidationError as exc:
        raise ConfigError(_explain(file, exc)) from None


def _parse(file: Path, text: bytes) -> Any:
    if file.suffix == ".toml":
        try:
            return tomllib.loads(text.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        hint = " (a .toml file name selects TOML)" if file.suffix != ".json" else ""
        raise ConfigError(f"{file}: not valid JSON: {exc}{hint}") from None


def _normalize(file: Path, data: dict[str, Any]) -> dict[str, Any]:
    """Turn the clients' ``mcpServers`` (or VS Code's ``servers`` with ``type``) format into Bastion's."""
    if "mcpServers" in data:
        key = "mcpServers"
    elif isinstance(data.get("servers"), dict) and any(
        isinstance(v, dict) and "type" in v for v in data["servers"].values()
    ):
        key = "servers"
    else:
        return data
    entries = data[key]
    if not isinstance(entries, dict):
        raise ConfigError(f"{file}: {key} must be an object mapping server names to entries")
    servers: dict[str, Any] = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"{file}: {key}.{name} must be an object with at least a command")
        if "url" in entry or entry.get("type") in ("http", "sse", "streamable-http"):
            log.warning("%s: %s.%s is a remote server (url); only local (command) servers are federated, skipping it",
                        file, key, name)
            continue
        converted = {k: v for k, v in entry.items() if k not in _FOREIGN_ENTRY_KEYS}
        if entry.get("disabled") is True:
            converted["enabled"] = False
        servers[name] = converted
    rest = {k: v for k, v in data.items() if k not in (key, "inputs")}
    return {**rest, "servers": servers}


def _explain(file: Path, exc: ValidationError) -> str:
    lines = [f"{file}: invalid configuration"]
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"]) or "(top level)"
        kind = err["type"]
        if kind == "extra_forbidden":
            fix = "remove it, or check its spelling against docs/configuration.md"
        elif kind == "missing":
            fix = "add it"
        else:
            fix = f"got {err.get('input')!r}"
        lines.append(f"  {where}: {err['msg']} — fix: {fix}")
    return "\n".join(lines)


def state_dir() -> Path:
    return paths.state_dir()


def default_config() -> GatewayConfig:
    """Federate the reference servers the set-up installs, on scratch data, so a newcomer sees Bastion work."""
    scratch = state_dir() / "scratch"
    repo = scratch / "repo"
    files = scratch / "files"
    _prepare_scratch(repo, files)
    bindir = Path(sys.executable).parent
    servers: dict[str, ServerConfig] = {}
    time_server = _find_executable("mcp-server-time", bindir)
    if time_server:
        servers["time"] = ServerConfig(command=time_server, args=["--local-timezone", "UTC"], trust="trusted")
    git_server = _find_executable("mcp-server-git", bindir)
    if git_server:
        servers["git"] = ServerConfig(command=git_server, args=["--repository", str(repo)], trust="trusted",
                                      sandbox=SandboxConfig(writable=(str(repo),)))
    fs_server = _find_executable("mcp-server-filesystem", Path.cwd() / "node_modules" / ".bin")
    if fs_server:
        servers["files"] = ServerConfig(command=fs_server, args=[str(files)], trust="trusted",
                                        sandbox=SandboxConfig(writable=(str(files),)))
    if not servers:
        log.warning("none of the default servers (mcp-server-time, mcp-server-git, mcp-server-filesystem) is "
                    "installed; run the set-up command from the README")
    # The reference servers are trusted for their annotations, so read-only tools run at once and anything that
    # writes waits in the approval queue (`bastion approvals`, `bastion approve ID`) unless the client can ask.
    policy = PolicyConfig.model_validate({"approval": {"fallback": "queue"}})
    return GatewayConfig(servers=servers, policy=policy)


def _find_executable(name: str, preferred_dir: Path) -> str | None:
    candidate = preferred_dir / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def _prepare_scratch(repo: Path, files: Path) -> None:
    files.mkdir(parents=True, exist_ok=True)
    readme = files / "hello.txt"
    if not readme.exists():
        readme.write_text("Hello from Bastion's scratch folder.\n")
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        (repo / "README.md").write_text("# Scratch repository\n\nCreated by Bastion's default configuration.\n")
        import subprocess

        env = {**os.environ, "GIT_AUTHOR_NAME": "Bastion", "GIT_AUTHOR_EMAIL": "bastion@localhost",
               "GIT_COMMITTER_NAME": "Bastion", "GIT_COMMITTER_EMAIL": "bastion@localhost"}
        for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "README.md"],
                     ["git", "commit", "-q", "-m", "Initial commit"]):
            subprocess.run(argv, cwd=repo, env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
