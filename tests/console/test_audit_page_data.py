"""The audit trail as the console searches and verifies it: a trail sealed by the real sealer process, then searched
by each field, and tampered with to see the break where ``bastion audit verify`` sees it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from bastion.console.audit_view import AuditQuery, QueryError, outcome_of, search, summary, verify_trail
from bastion.console.interventions import counts, interventions
from bastion.guardrails.report import Intervention, InterventionLog
from bastion.model import Identity
from bastion.policy.audit import AuditWriter

ALICE = {"name": "alice", "groups": ["dev"], "authenticated_by": "header", "session": "s1"}
BOB = {"name": "bob", "groups": [], "authenticated_by": "header", "session": "s2"}
ALLOW = [("authorization", "allow", "default-allow", "allowed", None)]
DENY = [("authorization", "deny", "no-delete", "deleting is forbidden", None)]


@pytest.fixture(scope="module")
def trail(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("audit") / "audit.jsonl"
    writer = AuditWriter(path)
    writer.write_call((1000.0, ALICE, "tools/call", "files__read", {"path": "/a"}, True, "complete", 1_000_000, ALLOW))
    writer.write_call((2000.0, BOB, "tools/call", "files__delete", {"path": "/b"}, True, -32001, 0, DENY))
    writer.write_call((3000.0, ALICE, "tools/list", None, None, False, "complete", 0, []))
    log = InterventionLog(writer.write)
    log.report(Intervention("secrets", "redacted", "files", "read", "aws-access-key", "aws-access-token",
                            identity=Identity("alice", ("dev",), "header")))
    writer.close()
    return path


def _methods(result) -> list[str]:
    return [f"{found.record.get('kind')}:{found.record.get('what', {}).get('method', '')}" for found in result.found]


def test_everything_newest_first(trail) -> None:
    result = search(trail, AuditQuery())
    stamps = [found.record.get("ts") for found in result.found]
    assert stamps == sorted(stamps, reverse=True)
    assert result.scanned == len(result.found) >= 6  # two records for a decided call, one for the list, a guardrail


def test_search_by_each_field(trail) -> None:
    assert {f.record["who"]["name"] for f in search(trail, AuditQuery(identity="BOB")).found} == {"bob"}
    assert _methods(search(trail, AuditQuery(method="delete"))) == ["call:tools/call", "decision:tools/call"]
    assert [f.record["kind"] for f in search(trail, AuditQuery(outcome="refused")).found] == ["call", "decision"]
    assert [f.record.get("outcome") for f in search(trail, AuditQuery(outcome="refused")).found] == [-32001, None]
    assert search(trail, AuditQuery(outcome="error")).found == []
    assert [f.record["ts"] for f in search(trail, AuditQuery(since=1500, until=2500)).found] == [2000.0, 2000.0]
    assert [f.record["rule"] for f in search(trail, AuditQuery(text="FORBIDDEN")).found] == ["no-delete"]


def test_the_limit_keeps_the_newest_and_says_there_is_more(trail) -> None:
    result = search(trail, AuditQuery(kind="call", limit=1))
    assert [f.record["ts"] for f in result.found] == [3000.0] and result.more


@pytest.mark.parametrize("form, field", [
    ({"since": "yesterday"}, "since"), ({"outcome": "maybe"}, "outcome"), ({"limit": "0"}, "limit"),
    ({"limit": "-1"}, "limit"), ({"limit": "9999"}, "limit"), ({"text": "x" * 201}, "text"),
])
def test_a_field_that_cannot_be_read_is_named(form, field) -> None:
    with pytest.raises(QueryError, match=f"^{field}"):
        AuditQuery.from_form(form)


def test_form_times_are_utc_unless_they_say_otherwise() -> None:
    query = AuditQuery.from_form({"since": "1970-01-01T00:16:40", "until": "1970-01-01T01:00+01:00"})
    assert (query.since, query.until) == (1000.0, 0.0)


def test_an_intact_trail_verifies_as_the_command_says(trail) -> None:
    state = verify_trail(trail)
    assert state.intact and state.problems == () and state.chains == 1
    command = subprocess.run([sys.executable, "-m", "bastion", "audit", "verify", str(trail)], capture_output=True)
    assert command.returncode == 0


def test_a_tampered_trail_is_broken_where_it_was_edited(tmp_path, trail) -> None:
    copy = tmp_path / "audit.jsonl"
    lines = trail.read_bytes().splitlines(keepends=True)
    record = orjson.loads(lines[1])
    record["who"]["name"] = "mallory"
    lines[1] = orjson.dumps(record) + b"\n"
    copy.write_bytes(b"".join(lines))
    state = verify_trail(copy)
    assert not state.intact
    assert any("record was altered" in problem for problem in state.problems)
    assert (str(copy), 2) in state.broken_at
    marked = [found for found in search(copy, AuditQuery(), state.broken_at).found if found.broken]
    assert [found.record["who"]["name"] for found in marked] == ["mallory"]
    command = subprocess.run([sys.executable, "-m", "bastion", "audit", "verify", str(copy)], capture_output=True)
    assert command.returncode == 1


def test_a_missing_trail_is_an_empty_search_and_an_intact_nothing(tmp_path) -> None:
    assert search(tmp_path / "none.jsonl", AuditQuery()).found == []
    assert verify_trail(tmp_path / "none.jsonl").records == 0


def test_lines_that_are_not_records_are_skipped_by_search_and_reported_by_verify(tmp_path, trail) -> None:
    copy = tmp_path / "audit.jsonl"
    copy.write_bytes(trail.read_bytes() + b"<script>alert(1)</script>\n[1,2]\n")
    assert len(search(copy, AuditQuery()).found) == len(search(trail, AuditQuery()).found)
    assert any("not an audit record" in problem for problem in verify_trail(copy).problems)


def test_outcomes_and_summaries() -> None:
    assert outcome_of({"kind": "call", "outcome": "complete"}) == "ok"
    assert outcome_of({"kind": "call", "outcome": 0}) == "ok"  # an operator's act that was done
    assert outcome_of({"kind": "call", "outcome": "cancelled"}) == "cancelled"
    assert outcome_of({"kind": "call", "outcome": 403}) == "refused"  # an operator's act Cedar refused
    assert outcome_of({"kind": "call", "outcome": -32603}) == "error"
    assert outcome_of({"kind": "shutdown"}) == "shutdown"
    assert summary({"kind": "decision", "decision": "deny", "rule": "r", "reason": "why"}) == "deny by r: why"


def test_interventions_counted_and_listed_from_the_trail(tmp_path) -> None:
    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path)
    log = InterventionLog(writer.write)
    alice = Identity("alice", (), "header")
    for kind, who in (("email", alice), ("email", None), ("aws-access-key", alice)):
        log.report(Intervention("pii" if kind == "email" else "secrets", "redacted", "s", "t", kind, "rule",
                                identity=who))
    writer.write_call((1.0, BOB, "tools/call", "x", {}, True, "complete", 0, ALLOW))
    writer.close()
    found = interventions(path, {})
    assert [(row.kind, row.count) for row in counts(found)] == [("email", 2), ("aws-access-key", 1)]
    assert [f.record["found"] for f in found.found] == ["aws-access-key", "email", "email"]
    assert "value" not in str(found.found)
    mine = interventions(path, {"identity": "alice", "limit": "1"})
    assert [(row.kind, row.count) for row in counts(mine)] == [("email", 1), ("aws-access-key", 1)]  # pii < secrets
    assert len(mine.found) == 1 and mine.more


async def test_the_worker_process_answers_as_the_functions_do(tmp_path, trail) -> None:
    from bastion.console.audit_worker import TrailUnreadable, read

    state, result, error = await read(str(trail), {"identity": "bob"})
    assert error is None and state == verify_trail(trail)
    assert [found.record for found in result.found] == [found.record for found in
                                                        search(trail, AuditQuery(identity="bob")).found]
    copy = tmp_path / "audit.jsonl"
    copy.write_bytes(trail.read_bytes().replace(b'"name":"bob"', b'"name":"eve"', 1))
    state, result, _ = await read(str(copy), {"identity": "eve"})
    assert not state.intact and [found.broken for found in result.found] == [True]  # only the edited record
    _, _, error = await read(str(trail), {"limit": "lots"})
    assert error.startswith("limit:")
    _, counted, _ = await read(str(trail), {}, verify=False, kind="guardrail", count=True)
    assert [(row.kind, row.count) for row in counts(counted)] == [("aws-access-key", 1)]
    with pytest.raises(TrailUnreadable, match="could not be read"):
        await read(str(trail), {}, key_file=str(tmp_path / "no-such-key"))


async def test_a_trail_sealed_with_a_key_verifies_with_its_key_file_only(tmp_path) -> None:
    from bastion.console.audit_worker import read

    key = bytes(range(32))
    (tmp_path / "audit.key").write_text(key.hex())
    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path, key=key)
    writer.write_call((1.0, ALICE, "tools/call", "files__read", {}, True, "complete", 0, ALLOW))
    writer.close()
    keyed, _, _ = await read(str(path), {}, key_file=str(tmp_path / "audit.key"))
    assert keyed.intact
    unkeyed, _, _ = await read(str(path), {})
    assert not unkeyed.intact  # without its key every record reads as altered: the page says so, never makes a key
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["audit.key", "audit.jsonl", "audit.jsonl.lock"])
