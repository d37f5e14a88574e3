"""``bastion policy check``: the whole decision pipeline for a hypothetical call, no server contacted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from bastion.model import Identity, ToolEntry
from bastion.policy.config import PolicyConfig
from bastion.policy.decision import Decision, Effect
from bastion.policy.engine import PolicyEngine

EXIT_ALLOW = 0
EXIT_DENY = 3
EXIT_APPROVAL = 4


@dataclass(frozen=True, slots=True)
class DecisionReport:
    decision: Decision
    stages: tuple[tuple[str, Decision], ...]

    @property
    def exit_code(self) -> int:
        return {Effect.ALLOW: EXIT_ALLOW, Effect.DENY: EXIT_DENY, Effect.APPROVAL: EXIT_APPROVAL}[self.decision.effect]

    def lines(self) -> list[str]:
        out = [f"decision: {self.decision.effect.value} (rule {self.decision.rule or '-'}: {self.decision.reason})"]
        out += [f"  {stage}: {d.effect.value} (rule {d.rule or '-'}: {d.reason})" for stage, d in self.stages]
        return out


def dry_run(
    policy_config: PolicyConfig,
    tool_entry: ToolEntry,
    identity: Identity,
    arguments: Mapping[str, Any] | None,
    engine: PolicyEngine | None = None,
    claim_attributes: tuple[str, ...] = (),
) -> DecisionReport:
    """Authorization and guards for one call, as the running gateway would decide it (before approval)."""
    engine = engine or PolicyEngine(policy_config, claim_attributes=claim_attributes)
    report = engine.decide_call(identity, tool_entry, arguments)
    return DecisionReport(report.decision, tuple(report.stages))
