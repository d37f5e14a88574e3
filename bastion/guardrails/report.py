"""Every intervention of a guardrail, made visible the same way: a log line, a counter and an audit record.

The line and the record name the server, the tool, the kind and the rule, never the matched value itself.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any, Callable

from bastion.model import Identity

log = logging.getLogger("bastion.guardrails")


@dataclass(frozen=True, slots=True)
class Intervention:
    guardrail: str  # "pinning", "secrets", "pii", "metadata_injection", "output_injection", "taint", "sampling", "deputy"
    action: str  # what was done: "withheld", "refused", "redacted", "blocked", "marked", "sanitized", "capped", ...
    server: str | None
    target: str | None  # the tool, prompt, resource or method concerned
    kind: str  # what was found: "aws-access-key", "email", "zero-width", "changed-definition", ...
    rule: str  # the rule or detector that found it
    detail: str = ""  # words for people; never the matched value
    session: str = ""
    # the caller whose request it was (None for what no one request caused); recorded by name, method and issuer
    identity: Identity | None = None


class InterventionLog:
    """Reports interventions; ``counts`` holds how many of each (guardrail, action, kind) since start."""

    def __init__(self, audit: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._audit = audit
        self.counts: Counter[tuple[str, str, str]] = Counter()

    def report(self, intervention: Intervention) -> None:
        self.counts[(intervention.guardrail, intervention.action, intervention.kind)] += 1
        identity = intervention.identity
        log.warning("guardrail %s %s %s on server %s, %s (rule %s)%s%s", intervention.guardrail, intervention.action,
                    intervention.kind, intervention.server or "-", intervention.target or "-", intervention.rule,
                    f" for {identity.describe()}" if identity is not None else "",
                    f": {intervention.detail}" if intervention.detail else "")
        if self._audit is not None:
            # "kind" names an audit record's type, so what was found is recorded as "found". Field by field, not
            # asdict: that would copy the identity whole, its token included.
            record = {name: getattr(intervention, name) for name in _RECORDED}
            record["found"] = record.pop("kind")
            if identity is not None:
                record["who"] = identity.record()
            self._audit({"kind": "guardrail", **record})


_RECORDED = tuple(f.name for f in fields(Intervention) if f.name != "identity")
