"""Guardrail interventions as the console shows them, from the audit trail's ``guardrail`` records (who, where,
which rule; never the matched value, which the guardrails never record: bastion/guardrails/report.py): how many of
each guardrail, action and kind, and the newest ones. The trail is read rather than the gateway's own counters so
that ``bastion console``, a process apart from the gateways, shows the same as ``bastion serve --http``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from bastion.console.audit_view import AuditQuery, SearchResult, search


@dataclass(frozen=True, slots=True)
class InterventionCount:
    guardrail: str
    action: str
    kind: str
    count: int


def tally(record: dict[str, Any]) -> tuple[str, str, str]:
    """What an intervention is counted by: guardrail, action and kind found."""
    return (str(record.get("guardrail", "")), str(record.get("action", "")), str(record.get("found", "")))


def interventions(trail: str | Path, form: Mapping[str, str]) -> SearchResult:
    """The newest guardrail records matching the page's search fields, and every match counted by guardrail,
    action and kind (reads files: off the event loop); raises QueryError for a field it cannot read."""
    return search(trail, AuditQuery.from_form(form, kind="guardrail"), count_by=tally)


def counts(result: SearchResult) -> list[InterventionCount]:
    """The tally of a search, most frequent first."""
    rows = [InterventionCount(*key, number) for key, number in result.counts.items()]
    return sorted(rows, key=lambda row: (-row.count, row.guardrail, row.action, row.kind))
