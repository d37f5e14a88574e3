"""The outcome of a policy decision, shared by authorization, guards, rate limits and approval."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Effect(str, Enum):
    ALLOW = "allow"
    DENY = "deny"
    APPROVAL = "approval"  # allowed only once a person confirms it


@dataclass(frozen=True, slots=True)
class Decision:
    """What was decided, by which rule, and why (the reason is safe to show the agent)."""

    effect: Effect
    rule: str = ""
    reason: str = ""
    # Extra facts for the audit trail only (never sent to the client).
    detail: dict[str, object] = field(default_factory=dict)

    @property
    def allowed(self) -> bool:
        return self.effect is Effect.ALLOW

    @staticmethod
    def allow(rule: str = "", reason: str = "") -> "Decision":
        return Decision(Effect.ALLOW, rule, reason)

    @staticmethod
    def deny(rule: str, reason: str, **detail: object) -> "Decision":
        return Decision(Effect.DENY, rule, reason, dict(detail))


@dataclass(frozen=True, slots=True)
class GuardResult:
    """A guard's verdict on one argument value: ``reason`` is None when the value is acceptable."""

    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


PASS = GuardResult()


def refuse(reason: str) -> GuardResult:
    return GuardResult(reason)
