"""The ``policy`` section of Bastion's configuration.

Every model forbids unknown keys, so a misspelt option is an error that names it instead of a silently
ignored setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bastion.paths import state_dir


class PolicyStartError(Exception):
    """The policy section cannot be put to work; the message names the file and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IdentityConfig(_Strict):
    """Who the stdio client is (a stdio pipe carries no credentials, so it is configured)."""

    name: str = Field(default="local", min_length=1)
    groups: list[str] = Field(default_factory=list)


class _GuardBase(_Strict):
    tool: str = Field(
        default="*",
        description='which tools: "server/tool" with * and ? wildcards, e.g. "fs/*"; the exposed name also matches',
    )
    argument: str = Field(
        min_length=1,
        description='the argument name, or a JSON Pointer such as "/options/path"; lists are checked element-wise',
    )
    rule: str = Field(default="", description="name recorded in the audit trail; default: kind:tool:argument")


class PathGuardConfig(_GuardBase):
    kind: Literal["path"]
    roots: list[str] = Field(min_length=1, description="directories the path must stay inside")
    base: str | None = Field(default=None, description="directory relative paths start from; default: first root")
    resolve_symlinks: bool = Field(
        default=True, description="resolve the path on the file system as the kernel does (links, '..' after a link) "
                                  "and require it inside the resolved roots; false: by its names alone")
    allow_hidden: bool = Field(default=False, description="admit names starting with a dot (.env, .git, .ssh)")
    allow_backslash: bool = False
    allow_percent: bool = Field(
        default=False, description="admit percent signs (names like '100% done.txt'); escapes must be valid UTF-8")
    allow_lookalikes: bool = Field(
        default=False, description="admit characters that look like '/', '\\' or '.'; each is also read as that ASCII")


class ShellGuardConfig(_GuardBase):
    kind: Literal["shell"]
    mode: Literal["argument", "command"] = "argument"
    positional: bool = Field(default=False, description="refuse values starting with '-' (option injection)")
    allow_whitespace: bool = False
    allowed_commands: list[str] = Field(default_factory=list, description="command mode: programs allowed")


class UrlGuardConfig(_GuardBase):
    kind: Literal["url"]
    schemes: list[str] = Field(default_factory=lambda: ["https", "http"])
    allow_hosts: list[str] = Field(default_factory=list, description='hosts allowed, "*.example.com" wildcards')
    deny_hosts: list[str] = Field(default_factory=list)
    allow_private: bool = Field(default=False, description="admit loopback, private and link-local addresses")
    allow_userinfo: bool = False
    allowed_ports: list[int] = Field(default_factory=list)

    @field_validator("schemes")
    @classmethod
    def _lower(cls, schemes: list[str]) -> list[str]:
        return [s.lower().rstrip(":") for s in schemes]


class SchemaGuardConfig(_GuardBase):
    kind: Literal["schema"]
    json_schema: dict[str, Any] = Field(
        alias="schema", description="an extra JSON Schema (2020-12) the argument must satisfy"
    )
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


GuardConfig = Annotated[
    Union[PathGuardConfig, ShellGuardConfig, UrlGuardConfig, SchemaGuardConfig], Field(discriminator="kind")
]


# An approval is a decision about a call now: a window that lets the identical call through again stays short.
MAX_REUSE_SECONDS = 3600.0


class ApprovalConfig(_Strict):
    fallback: Literal["refuse", "queue"] = Field(
        default="refuse",
        description="when the client cannot ask the person: refuse, or wait in the local approval queue",
    )
    approver: Literal["auto", "client", "out_of_band"] = Field(
        default="auto",
        description="who may answer an approval: client (the client's own prompt, elicitation, which an agent that "
        "declares elicitation can answer itself), out_of_band (only a person through `bastion approve`: the client "
        "is never asked), or auto: the client over stdio (a person at a desktop client), out_of_band over HTTP "
        "(most often an agent at the client)",
    )
    timeout_seconds: float = Field(default=120.0, gt=0, description="unanswered approvals are denied after this")
    remember: Literal["never", "session"] = Field(
        default="never", description="session: one approval covers later calls of that tool in the session"
    )
    reuse_seconds: float = Field(
        default=0.0, ge=0, le=MAX_REUSE_SECONDS, allow_inf_nan=False,
        description="after a person approves a call, the identical call (same caller, tool and arguments) runs "
        "without asking again for this many seconds; 0, the default: every call is asked about",
    )
    # Defaults are worked out when a configuration is built, so they follow XDG_STATE_HOME as it is then.
    queue_dir: str = Field(default_factory=lambda: str(state_dir() / "approvals"))
    poll_seconds: float = Field(default=0.5, gt=0)
    secret_file: str | None = Field(
        default=None,
        description="file holding the key that signs requestState; default: a random key per gateway process",
    )
    show_argument_values: bool = Field(default=True, description="show argument values to the approving person")


class RateLimitConfig(_Strict):
    scope: Literal["principal", "tool", "server"]
    match: str = Field(default="*", description="principal name, server/tool or server name, with wildcards")
    rate: float = Field(gt=0, description="tokens added per second")
    burst: float = Field(gt=0, description="bucket size: calls allowed at once")
    per_principal: bool = Field(default=False, description="tool/server scope: a separate bucket per principal")


class AuditConfig(_Strict):
    enabled: bool = True
    path: str = Field(default_factory=lambda: str(state_dir() / "audit.jsonl"))
    rotate_bytes: int = Field(default=50 * 1024 * 1024, ge=4096)
    arguments: Literal["shape", "values"] = Field(
        default="shape", description="shape records only types and sizes; values records argument values"
    )
    key_file: str | None = Field(
        default=None, description="key for HMAC-chained records, so an editor cannot recompute the chain"
    )
    on_failure: Literal["continue", "refuse"] = Field(
        default="continue",
        description="while the trail cannot be written (a full disk): continue runs calls, counted and told in a "
        "gap record once it can be written again; refuse answers every call with an error before it reaches a server",
    )

    @field_validator("on_failure", mode="before")
    @classmethod
    def _on_failure(cls, value: Any) -> Any:
        if value not in ("continue", "refuse"):
            raise ValueError(
                f'policy.audit.on_failure is {value!r}; set it to "continue" (calls run while the audit trail cannot '
                f'be written, and a gap record counts them once it can) or "refuse" (calls are refused until it can)'
            )
        return value

    @model_validator(mode="after")
    def _refuse_needs_a_trail(self) -> "AuditConfig":
        # Refusing calls while the trail cannot be written promises a trail; with none, every call would run unaudited
        # under a setting that reads as fail-closed.
        if self.on_failure == "refuse" and not self.enabled:
            raise ValueError(
                'policy.audit.on_failure is "refuse" but policy.audit.enabled is false, so no call would ever be '
                'recorded; set enabled = true, or drop on_failure'
            )
        return self


UNDECLARED_ARGUMENTS = ("refuse_untrusted", "refuse", "allow")


def _undeclared_setting(value: Any, key: str) -> Any:
    if value not in UNDECLARED_ARGUMENTS:
        raise ValueError(
            f'{key} is {value!r}; set it to "refuse_untrusted" (calls to an untrusted server\'s tool may carry only '
            f'the argument names its input schema declares), "refuse" (the same whatever the server\'s trust) or '
            f'"allow" (no such check)'
        )
    return value


class ServerPolicy(_Strict):
    """``[policy.servers.NAME]``: what differs for one server from the gateway-wide policy settings."""

    undeclared_arguments: Literal["refuse_untrusted", "refuse", "allow"] | None = Field(
        default=None, description="this server's own undeclared_arguments: refuse to be strict with one trusted "
        "server, allow to let one untrusted server take free-form arguments; absent: the gateway-wide setting")

    @field_validator("undeclared_arguments", mode="before")
    @classmethod
    def _undeclared(cls, value: Any) -> Any:
        return value if value is None else _undeclared_setting(value, "policy.servers.<name>.undeclared_arguments")


class PolicyConfig(_Strict):
    identity: IdentityConfig = Field(default_factory=IdentityConfig)
    policy_files: list[str] = Field(
        default_factory=list, description="Cedar policy files; empty uses the default policy shipped with Bastion"
    )
    include_default_policy: bool = Field(
        default=False, description="also load the shipped default policy alongside policy_files"
    )
    schema_validation: bool = Field(default=True, description="validate tools/call arguments against inputSchema")
    undeclared_arguments: Literal["refuse_untrusted", "refuse", "allow"] = Field(
        default="refuse_untrusted",
        description="refuse a tools/call whose arguments carry keys the tool's inputSchema does not declare in "
        "'properties' (nested objects too), whatever additionalProperties says: refuse_untrusted (the default) for "
        "tools of untrusted servers, refuse for every server, allow never",
    )
    servers: dict[str, ServerPolicy] = Field(
        default_factory=dict, description="per server: the settings that differ from the gateway-wide ones")
    guards: list[GuardConfig] = Field(default_factory=list)
    approval: ApprovalConfig = Field(default_factory=ApprovalConfig)
    rate_limits: list[RateLimitConfig] = Field(default_factory=list)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    pins: str | None = Field(
        default=None,
        description="JSON file of pinned tool definitions (written by `bastion tools pin`); tools whose definition "
        "still matches their pin have resource.pinned == true",
    )
    base_dir: str | None = Field(default=None, description="directory relative policy_files and pins are read from")

    @field_validator("undeclared_arguments", mode="before")
    @classmethod
    def _undeclared(cls, value: Any) -> Any:
        return _undeclared_setting(value, "policy.undeclared_arguments")

    def undeclared_setting(self, server: str) -> tuple[str, str]:
        """``undeclared_arguments`` for ``server`` and the key it is read from: the server's own in
        ``[policy.servers.NAME]``, else the gateway-wide one."""
        own = self.servers.get(server)
        if own is not None and own.undeclared_arguments is not None:
            return own.undeclared_arguments, f"policy.servers.{server}.undeclared_arguments"
        return self.undeclared_arguments, "policy.undeclared_arguments"

    @model_validator(mode="after")
    def _files_named(self) -> "PolicyConfig":
        for name in self.policy_files:
            if not name.strip():
                raise ValueError("policy_files: an entry is blank; give the path of a .cedar file")
        return self

    def policy_paths(self) -> list[Path]:
        return [self._beside(p) for p in self.policy_files]

    def pins_path(self) -> Path | None:
        return self._beside(self.pins) if self.pins else None

    def _beside(self, name: str) -> Path:
        base = Path(self.base_dir).expanduser() if self.base_dir else Path.cwd()
        return base / Path(name).expanduser()
