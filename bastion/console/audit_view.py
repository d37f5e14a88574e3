"""The audit trail as the console searches it, and its chains verified by the code of ``bastion audit verify``.

A search reads every chain of the trail (each with its rotated files) and keeps the newest matches, up to a limit;
it reads files, so the console calls it off the event loop. Verification is ``verify_paths`` itself, so the page and
the command cannot disagree; where a chain breaks, the records named in its problems are marked in the results.
"""

from __future__ import annotations

import collections
import heapq
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import orjson

from bastion.policy.audit import TrailReport, verify_paths
from bastion.policy.audit_chains import trail_chains
from bastion.policy.interceptors import POLICY_DENIED

MAX_RESULTS = 500  # records a page lists at most; a search asks for fewer by default
DEFAULT_RESULTS = 100
MAX_FIELD = 200  # characters of a search field: more is not a search, it is a payload
OUTCOMES = ("", "ok", "refused", "error", "cancelled", "intervened")
# Outcomes of a call that ran (or goes on in another round); anything else a call record says is an error.
_RAN = ("complete", "continued", "input_required")
# A call refused by the gateway's policy (its JSON-RPC code), and an operator's act refused (the console's HTTP-like
# status): refusals, not errors.
_REFUSED = (POLICY_DENIED, 403)


class QueryError(ValueError):
    """A search field that cannot be read; the message names the field and what to write."""


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """What to find: every field empty finds every record. Text fields match without regard to case."""

    since: float | None = None  # seconds since the epoch, inclusive
    until: float | None = None
    identity: str = ""  # part of the caller's name
    method: str = ""  # part of the method or of its target (a tool, a resource, an admin act's object)
    outcome: str = ""  # one of OUTCOMES
    text: str = ""  # part of the record's JSON
    kind: str = ""  # a record kind only (the interventions page asks for "guardrail")
    limit: int = DEFAULT_RESULTS

    @classmethod
    def from_form(cls, form: Mapping[str, str], **fixed: Any) -> "AuditQuery":
        """A query from the search form's fields (strings); raises QueryError naming a field it cannot read."""
        for name, value in form.items():
            if len(value) > MAX_FIELD:
                raise QueryError(f"{name}: at most {MAX_FIELD} characters")
        outcome = form.get("outcome", "").strip()
        if outcome not in OUTCOMES:
            raise QueryError(f"outcome: {outcome!r} is not one of {', '.join(o for o in OUTCOMES if o)} (or empty)")
        return cls(
            since=_time(form.get("since", ""), "since"),
            until=_time(form.get("until", ""), "until"),
            identity=form.get("identity", "").strip(),
            method=form.get("method", "").strip(),
            outcome=outcome,
            text=form.get("text", "").strip(),
            limit=_limit(form.get("limit", "")),
            **fixed,
        )

    def matches(self, record: Mapping[str, Any]) -> bool:
        ts = record.get("ts")
        if self.since is not None and not (type(ts) in (int, float) and ts >= self.since):
            return False
        if self.until is not None and not (type(ts) in (int, float) and ts <= self.until):
            return False
        if self.kind and record.get("kind") != self.kind:
            return False
        if self.identity and self.identity.casefold() not in caller_of(record).casefold():
            return False
        if self.method and self.method.casefold() not in f"{method_of(record)} {target_of(record)}".casefold():
            return False
        if self.outcome and outcome_of(record) != self.outcome:
            return False
        if self.text and self.text.casefold() not in orjson.dumps(record).decode().casefold():
            return False
        return True


def _time(text: str, name: str) -> float | None:
    """An ISO 8601 time (``2026-12-06T03:00``, UTC unless it says otherwise; the form's datetime-local sends that)."""
    text = text.strip()
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise QueryError(f"{name}: {text[:40]!r} is not a time; write 2026-12-06T03:00 (UTC) or leave it empty") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _limit(text: str) -> int:
    text = text.strip()
    if not text:
        return DEFAULT_RESULTS
    if not text.isdigit() or not 1 <= int(text) <= MAX_RESULTS:
        raise QueryError(f"limit: write a whole number from 1 to {MAX_RESULTS}")
    return int(text)


def caller_of(record: Mapping[str, Any]) -> str:
    who = record.get("who")
    return str(who.get("name", "")) if isinstance(who, dict) else ""


def method_of(record: Mapping[str, Any]) -> str:
    what = record.get("what")
    if isinstance(what, dict):
        return str(what.get("method", ""))
    if record.get("kind") == "guardrail":
        return f"guardrail/{record.get('guardrail', '')}"
    return ""


def target_of(record: Mapping[str, Any]) -> str:
    what = record.get("what")
    if isinstance(what, dict):
        return str(what.get("target") or "")
    if record.get("kind") == "guardrail":
        return "/".join(str(part) for part in (record.get("server"), record.get("target")) if part)
    return ""


def outcome_of(record: Mapping[str, Any]) -> str:
    """ok, refused, error, cancelled or intervened; a record of another kind (shutdown, gap, ...) is its kind."""
    kind = record.get("kind")
    if kind == "decision":
        return "refused" if record.get("decision") == "deny" else "ok"
    if kind == "guardrail":
        return "intervened"
    if kind != "call":
        return str(kind or "")
    outcome = record.get("outcome")
    if outcome in _RAN or outcome == 0:
        return "ok"
    if outcome == "cancelled":
        return outcome
    return "refused" if outcome in _REFUSED else "error"


@dataclass(frozen=True, slots=True)
class Found:
    """One record of a search, with where it is and whether its chain breaks at it."""

    file: str
    line: int
    record: dict[str, Any]
    broken: bool = False


@dataclass
class SearchResult:
    found: list[Found] = field(default_factory=list)  # newest first
    scanned: int = 0  # records read
    more: bool = False  # more records matched than the limit lets the page list
    counts: collections.Counter[Any] = field(default_factory=collections.Counter)  # every match, by ``count_by``


def trail_members(trail: Path) -> list[Path]:
    """Every file of every chain of the trail (rotated ones first within each chain)."""
    return [member for members in trail_chains(trail).values() for member in members]


def _records(files: Iterable[Path]) -> Iterator[tuple[str, int, dict[str, Any]]]:
    for path in files:
        try:
            with path.open("rb") as lines:
                for number, line in enumerate(lines, 1):
                    try:
                        record = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        continue  # verification reports it; a search lists records
                    if type(record) is dict:
                        yield str(path), number, record
        except OSError:
            continue


def search(trail: str | Path, query: AuditQuery, broken_at: frozenset[tuple[str, int]] = frozenset(),
           count_by: Callable[[dict[str, Any]], Any] | None = None) -> SearchResult:
    """The newest records of the trail that match, up to ``query.limit``; ``broken_at`` (file, line) marks the
    records where verification found the chain broken; ``count_by`` tallies every match (not only those listed)."""
    result = SearchResult()
    # The newest across every chain (chains interleave in time): a bounded heap of (ts, order read, record).
    kept: list[tuple[float, int, Found]] = []
    matched = 0
    for file, line, record in _records(trail_members(Path(trail).expanduser())):
        result.scanned += 1
        if query.matches(record):
            matched += 1
            if count_by is not None:
                result.counts[count_by(record)] += 1
            entry = (_ts(record), result.scanned, Found(file, line, record, (file, line) in broken_at))
            if len(kept) < query.limit:
                heapq.heappush(kept, entry)
            else:
                heapq.heappushpop(kept, entry)
    # Newest first; of records stamped alike, the later read first (a call after its decision).
    result.found = [found for _, _, found in sorted(kept, key=lambda entry: entry[:2], reverse=True)]
    result.more = matched > len(kept)
    return result


def _ts(record: Mapping[str, Any]) -> float:
    ts = record.get("ts")
    return float(ts) if type(ts) in (int, float) else 0.0


_WHERE = re.compile(r"^(?P<file>.+?):(?P<line>\d+) \(seq ")


@dataclass(frozen=True, slots=True)
class ChainState:
    """The verification as the page shows it."""

    intact: bool
    records: int
    chains: int
    problems: tuple[str, ...]  # where and how each chain breaks, as ``bastion audit verify`` says it
    notes: tuple[str, ...]  # gaps the trail itself records, a tail still being written: not tampering
    broken_at: frozenset[tuple[str, int]]  # (file, line) of the records a problem names


def verify_trail(trail: str | Path, key: bytes | None = None) -> ChainState:
    """Every chain of the trail verified as ``bastion audit verify`` does (reads files: off the event loop)."""
    report: TrailReport = verify_paths([Path(trail).expanduser()], key)
    problems = [problem for chain in report.chains for problem in chain.report.problems] + list(report.problems)
    notes = [note for chain in report.chains for note in chain.report.warnings]
    broken = set()
    for problem in problems:
        where = _WHERE.match(problem)
        if where:
            broken.add((where["file"], int(where["line"])))
    chains = sum(1 for chain in report.chains if chain.chain is not None)
    return ChainState(report.ok, report.records, chains, tuple(problems), tuple(notes), frozenset(broken))


def when(ts: Any) -> str:
    """A record's time for people, in UTC."""
    if type(ts) not in (int, float):
        return ""
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def summary(record: Mapping[str, Any]) -> str:
    """A record's gist in one line: the rule and reason of a decision, what a guardrail found, a gap's reason."""
    kind = record.get("kind")
    if kind == "decision":
        return f"{record.get('decision')} by {record.get('rule')}: {record.get('reason', '')}"
    if kind == "guardrail":
        return (f"{record.get('guardrail')} {record.get('action')} {record.get('found')} (rule {record.get('rule')})"
                + (f": {record['detail']}" if record.get("detail") else ""))
    if kind == "call":
        return f"outcome {record.get('outcome')}, {record.get('latency_ms')} ms"
    return str(record.get("reason", ""))
