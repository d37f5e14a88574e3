"""One thing ``bastion check`` reports about a configuration: where it is, what is wrong and the fix. The
configuration notes some while loading and the launchers add theirs, so it lives below both."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Finding:
    level: Literal["error", "warning"]
    where: str  # the key it is about, e.g. "servers.git.command"
    message: str
    fix: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
