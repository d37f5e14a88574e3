"""Per-server sandbox settings: a profile plus the grants a user writes by hand."""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic import BaseModel, ByteSize, ConfigDict, Field, field_validator, model_validator

from bastion.sandbox.egress_policy import AllowRule, parse_allow_rule

MIB = 1024 * 1024

SIZE_FORM = re.compile(r"^\s*\d+(\.\d+)?\s*(b|kb|kib|mb|mib|gb|gib|tb|tib|k|m|g|t)?\s*$", re.IGNORECASE)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ProfileLimits(BaseModel):
    """The limits a named profile starts from; explicit settings override them."""

    model_config = ConfigDict(frozen=True)
    memory: int
    cpu: float
    pids: int


# Sized for a Node or Python server with its dependencies loaded, not for builds or browsers.
PROFILES: dict[str, ProfileLimits] = {
    "default": ProfileLimits(memory=512 * MIB, cpu=1.0, pids=128),
    "strict": ProfileLimits(memory=256 * MIB, cpu=0.5, pids=32),
}
NO_SANDBOX = "none"
RUNTIMES = ("bubblewrap", "gvisor")


def format_bytes(size: int) -> str:
    """256 MiB, 1.5 GiB: the unit users write in their configuration."""
    for unit, factor in (("GiB", 1024**3), ("MiB", MIB), ("KiB", 1024)):
        if size >= factor:
            value = size / factor
            return f"{value:g} {unit}" if value != int(value) else f"{int(value)} {unit}"
    return f"{size} B"


class SandboxConfig(BaseModel):
    """How one local (stdio) MCP server is confined.

    Accepts a bare profile or runtime name as shorthand, so ``sandbox = "none"``, ``sandbox = "gvisor"`` and
    ``[servers.x.sandbox] profile = "default"`` all validate.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = Field(default="default", description="'default', 'strict' or 'none' (no sandbox)")
    runtime: str = Field(default="bubblewrap", description="'bubblewrap' (namespaces on the host kernel) or "
                         "'gvisor' (runsc: a user-space kernel between the server and the host's)")
    read_only: tuple[str, ...] = Field(default=(), description="host paths visible read-only")
    writable: tuple[str, ...] = Field(default=(), description="host paths visible read-write")
    network: tuple[str, ...] = Field(default=(), description="egress allowlist: host:port, *.example.com:443")
    env: tuple[str, ...] = Field(default=(), description="host environment variables passed through by name")
    memory: ByteSize | None = Field(default=None, description="memory limit, e.g. '256MiB'")
    cpu: float | None = Field(default=None, gt=0, le=1024, description="CPU cores, e.g. 0.5")
    pids: int | None = Field(default=None, ge=8, le=1_000_000, description="process and thread limit")

    @model_validator(mode="before")
    @classmethod
    def _profile_shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            # `sandbox = "gvisor"`: the default profile's limits under the stronger runtime.
            return {"runtime": value} if value in RUNTIMES[1:] else {"profile": value}
        return value

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        known = sorted([*PROFILES, NO_SANDBOX])
        if value not in known:
            raise ValueError(f"unknown sandbox profile {value!r}; use one of {', '.join(known)}")
        return value

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, value: str) -> str:
        if value not in RUNTIMES:
            raise ValueError(f"unknown sandbox runtime {value!r}; use one of {', '.join(RUNTIMES)}")
        return value

    @field_validator("read_only", "writable")
    @classmethod
    def _absolute_paths(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        resolved = []
        for path in paths:
            expanded = os.path.normpath(os.path.expanduser(path))
            if not os.path.isabs(expanded):
                raise ValueError(f"{path!r} is not an absolute path; write it as /full/path or ~/path")
            if expanded == "/":
                raise ValueError("granting '/' exposes the whole machine; name the directories the server needs")
            resolved.append(expanded)
        return tuple(resolved)

    @field_validator("network")
    @classmethod
    def _allow_rules(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        for entry in entries:
            parse_allow_rule(entry)  # raises ValueError naming the entry and the expected form
        return entries

    @field_validator("env")
    @classmethod
    def _env_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name (letters, digits, '_')")
        return names

    @field_validator("memory", mode="before")
    @classmethod
    def _memory_form(cls, value: Any) -> Any:
        if isinstance(value, str) and not SIZE_FORM.match(value):
            raise ValueError(f"{value!r} is not a size; write it like '256MiB' or '1GiB'")
        return value

    @field_validator("memory")
    @classmethod
    def _memory_floor(cls, value: ByteSize | None) -> ByteSize | None:
        if value is not None and value < 16 * MIB:
            raise ValueError(f"{int(value)} bytes is too little to start a server; use at least '16MiB'")
        return value

    @model_validator(mode="after")
    def _no_grants_without_sandbox(self) -> SandboxConfig:
        if self.profile == NO_SANDBOX and self.runtime != "bubblewrap":
            raise ValueError(f"runtime {self.runtime!r} confines the server but profile 'none' runs it unconfined; "
                             "remove one of them (use profile 'default' or 'strict' with runtime "
                             f"{self.runtime!r})")
        if self.profile == NO_SANDBOX:
            granted = [
                key for key in ("read_only", "writable", "network", "env", "memory", "cpu", "pids")
                if getattr(self, key)
            ]
            if granted:
                raise ValueError(
                    f"sandbox profile 'none' runs the server unconfined, so {', '.join(granted)} would have "
                    "no effect; remove them or use profile 'default'"
                )
        return self

    @property
    def sandboxed(self) -> bool:
        return self.profile != NO_SANDBOX

    @property
    def limits(self) -> ProfileLimits:
        base = PROFILES.get(self.profile, PROFILES["default"])
        return ProfileLimits(
            memory=int(self.memory) if self.memory is not None else base.memory,
            cpu=self.cpu if self.cpu is not None else base.cpu,
            pids=self.pids if self.pids is not None else base.pids,
        )

    @property
    def allow_rules(self) -> tuple[AllowRule, ...]:
        return tuple(parse_allow_rule(entry) for entry in self.network)
