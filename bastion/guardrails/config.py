"""The ``[guardrails]`` configuration: every guardrail on by default, each one a readable switch, per server too.

    [guardrails]
    secrets = "redact"            # redact | block | off
    output_injection = "mark"     # mark | block | off

    [guardrails.servers.github]   # the same switches, for one server
    secrets = "off"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from bastion.paths import state_dir


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GuardrailSwitches(_Strict):
    """What each guardrail does; in ``[guardrails.servers.NAME]`` an absent switch keeps the gateway-wide one."""

    pinning: Literal["enforce", "off"] | None = Field(
        default=None, description="enforce: a tool, prompt or template changed since first seen is withheld until "
        "`bastion pins accept`")
    secrets: Literal["redact", "block", "off"] | None = Field(
        default=None, description="credentials in what reaches the model: redact replaces each value by a marker")
    pii: Literal["redact", "block", "off"] | None = Field(
        default=None, description="personal data in what reaches the model: redact replaces each value by a marker")
    metadata_injection: Literal["withhold", "sanitize", "off"] | None = Field(
        default=None, description="instructions or hidden text in tool, prompt and resource descriptions")
    output_injection: Literal["mark", "block", "off"] | None = Field(
        default=None, description="instructions aimed at the model in results: mark labels them untrusted data")
    taint: Literal["approve", "refuse", "off"] | None = Field(
        default=None, description="after untrusted content, a destructive call on another server needs approval")
    argument_secrets: Literal["approve", "refuse", "off"] | None = Field(
        default=None, description="a credential in a call's arguments (to the called server): approve waits for a "
        "person, refuse refuses the call")
    flow: Literal["approve", "refuse", "off"] | None = Field(
        default=None, description="a distinctive value from one server's answers in a call to another server: approve "
        "waits for a person, refuse refuses the call")
    sampling: Literal["enforce", "off"] | None = Field(
        default=None, description="a server's sampling requests: origin, budgets, scanning")
    deputy: Literal["enforce", "off"] | None = Field(
        default=None, description="a server reads through Bastion only what it owns")
    elicitation: Literal["enforce", "off"] | None = Field(
        default=None, description="a server's elicitation requests: a budget per client, and no asking for secrets")


DEFAULT_SWITCHES = GuardrailSwitches(
    pinning="enforce", secrets="redact", pii="redact", metadata_injection="withhold", output_injection="mark",
    taint="approve", argument_secrets="approve", flow="approve", sampling="enforce", deputy="enforce",
    elicitation="enforce",
)


ScanAction = Literal["redact", "block", "off"]


class ScanningSettings(_Strict):
    """Secret and personal-data scanning per kind (the kinds are the markers' names: "email", "private-key",
    "aws-access-key", ...; docs/guardrails.md lists them), everywhere or for one server."""

    kinds: dict[str, ScanAction] = Field(
        default_factory=dict, description="kind -> what to do with it on every server (overrides secrets/pii)")
    servers: dict[str, dict[str, ScanAction]] = Field(
        default_factory=dict, description="server -> kind -> what to do with it in that server's content")
    thread_above_bytes: int = Field(
        default=65536, ge=0, description="content larger than this is scanned in a worker thread, off the event loop")

    @field_validator("kinds", "servers")
    @classmethod
    def _known_kinds(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        tables = value.values() if info.field_name == "servers" else [value]
        named = {kind for table in tables for kind in table}
        if named:
            from bastion.guardrails.scanning import known_kinds

            unknown = sorted(named - known_kinds())
            if unknown:
                raise ValueError(f"unknown kind(s) {', '.join(unknown)}: use a kind the scanners report, such as "
                                 f"email, payment-card, private-key, aws-access-key, generic-api-key (the full list is "
                                 f"in docs/guardrails.md)")
        return value


class PinningSettings(_Strict):
    path: str = Field(default_factory=lambda: str(state_dir() / "pins.json"),
                      description="where first-seen definitions are recorded")


class SamplingLimits(_Strict):
    """One server's sampling budget where it differs from the gateway-wide one; an absent field keeps that one."""

    requests_per_call: int | None = Field(default=None, ge=0)
    requests_per_minute: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)


class SamplingSettings(_Strict):
    requests_per_call: int = Field(default=3, ge=0, description="sampling requests a server may make in one call")
    requests_per_minute: int = Field(default=20, ge=0, description="sampling requests per server and session a minute")
    max_tokens: int = Field(default=4096, ge=1, description="maxTokens above this is capped to it")
    tokens_per_minute: int = Field(default=32768, ge=1, description="maxTokens requested per server and session a minute")
    servers: dict[str, SamplingLimits] = Field(
        default_factory=dict, description="per server: the limits that differ from the ones above")

    def for_server(self, server: str) -> "SamplingSettings":
        """The budget of ``server``: its own limits where it has them, the gateway-wide ones otherwise."""
        own = self.servers.get(server)
        if own is None:
            return self
        return self.model_copy(update={**own.model_dump(exclude_none=True), "servers": {}})


class ElicitationLimits(_Strict):
    """One server's elicitation budget where it differs from the gateway-wide one; an absent field keeps that one."""

    max_requests: int | None = Field(default=None, ge=0)
    window_seconds: float | None = Field(default=None, gt=0)


class ElicitationSettings(_Strict):
    """What a server may ask a person through ``elicitation/create`` (docs/guardrails.md, "Consent requests")."""

    max_requests: int = Field(
        default=5, ge=0, description="elicitation requests one server may send one client within window_seconds; "
        "past it a request is refused to the server (0 refuses every one)")
    window_seconds: float = Field(default=60.0, gt=0, description="the window max_requests counts in, in seconds")
    secrets: Literal["refuse", "flag", "off"] = Field(
        default="refuse", description="a form asking for a password, key, token or card number: refuse it, flag it "
        "to the person with a warning, or let it pass")
    servers: dict[str, ElicitationLimits] = Field(
        default_factory=dict, description="per server: the budget that differs from the one above")

    def for_server(self, server: str) -> tuple[int, float]:
        """(max_requests, window_seconds) for ``server``."""
        own = self.servers.get(server)
        limit = own.max_requests if own is not None and own.max_requests is not None else self.max_requests
        window = own.window_seconds if own is not None and own.window_seconds is not None else self.window_seconds
        return limit, window

    def longest_window(self) -> float:
        return max([self.window_seconds, *(own.window_seconds for own in self.servers.values()
                                           if own.window_seconds is not None)])


class CrossServerSettings(_Strict):
    """What crosses from one server to another: taint approvals and the pairs the confused-deputy guard allows."""

    allow: dict[str, list[str]] = Field(
        default_factory=dict, description="server -> the servers whose resources it may point the client at (resource "
        "links in its results) or put in its sampling requests; \"*\" for any")
    approval_timeout_seconds: float = Field(
        default=120.0, gt=0, description="how long a tainted session's call waits for a person to answer")
    # A 2026-07-28 client has no session: each request is one of its own, so what tainted one request is kept per
    # caller (identity) and holds the calls of the next ones.
    taint_memory_seconds: float = Field(
        default=3600.0, gt=0, description="how long a 2026-07-28 caller stays tainted after the last answer that "
        "tainted it (each request of such a client is a session of its own)")
    # Read by nothing since the memory moved to the gateway's state store, where each caller's entry expires on its
    # own (taint_memory_seconds) and no replica can count the others' callers: accepted so that a file setting it
    # still loads.
    taint_memory_callers: int = Field(
        default=10000, ge=1, description="no longer used: a caller's taint and values expire taint_memory_seconds "
        "after the last answer that left them, in the gateway's state store")

    def allows(self, server: str, owner: str) -> bool:
        allowed = self.allow.get(server, ())
        return owner in allowed or "*" in allowed


class GuardrailsConfig(GuardrailSwitches):
    pins: PinningSettings = Field(default_factory=PinningSettings)
    sampling_budget: SamplingSettings = Field(default_factory=SamplingSettings)
    consent: ElicitationSettings = Field(default_factory=ElicitationSettings)
    cross_server: CrossServerSettings = Field(default_factory=CrossServerSettings)
    servers: dict[str, GuardrailSwitches] = Field(
        default_factory=dict, description="per server: the switches that differ from the gateway-wide ones")
    scanning: ScanningSettings = Field(default_factory=ScanningSettings)

    def switch(self, name: str, server: str | None) -> str:
        """What guardrail ``name`` does for ``server`` (gateway-wide when None): its own setting, the gateway's,
        then the default."""
        if server is not None:
            own = self.servers.get(server)
            if own is not None and getattr(own, name) is not None:
                return getattr(own, name)
        value = getattr(self, name)
        return value if value is not None else getattr(DEFAULT_SWITCHES, name)

    def on_anywhere(self, name: str) -> bool:
        """Whether guardrail ``name`` is on for some server, so its interceptor is needed at all."""
        if self.switch(name, None) != "off":
            return True
        return any(getattr(own, name) not in (None, "off") for own in self.servers.values())

    def pins_path(self) -> Path:
        return Path(self.pins.path).expanduser()


class Switch:
    """What one guardrail does, per server, read from the configuration once per server: a running chain's
    configuration does not change (a new one builds a new chain), and a call asks for it at every guardrail."""

    __slots__ = ("_config", "_known", "_name")

    def __init__(self, config: GuardrailsConfig, name: str) -> None:
        self._config = config
        self._name = name
        self._known: dict[str | None, str] = {}

    def __call__(self, server: str | None) -> str:
        known = self._known.get(server)
        if known is None:
            known = self._known[server] = self._config.switch(self._name, server)
        return known
