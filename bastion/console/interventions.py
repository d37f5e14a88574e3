"""Guardrail interventions as the console shows them: how many of each since the gateway started (the gateway's own
``InterventionLog``), and the recent ones with who, where and which rule, from the audit trail's ``guardrail``
records. Neither holds the matched value: the guardrails never record it (bastion/guardrails/report.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from bastion.console.audit_view import AuditQuery, SearchResult, search
from bastion.guardrails.report import InterventionLog


@dataclass(frozen=True, slots=True)
class InterventionCount:
    guardrail: str
    action: str
    kind: str
    count: int


def counts(log: InterventionLog | None) -> list[InterventionCount]:
    """Interventions since start by guardrail, action and kind, most frequent first."""
    if log is None:
        return []
    rows = [InterventionCount(guardrail, action, kind, number)
            for (guardrail, action, kind), number in dict(log.counts).items()]
    return sorted(rows, key=lambda row: (-row.count, row.guardrail, row.action, row.kind))


def recent(trail: str | Path, form: Mapping[str, str]) -> SearchResult:
    """The newest guardrail records of the trail matching the page's search fields (reads files: off the loop);
    raises QueryError for a field it cannot read."""
    return search(trail, AuditQuery.from_form(form, kind="guardrail"))
