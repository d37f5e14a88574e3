"""The approval, audit, interventions and live pages as HTML: hostile values from callers, servers and the trail are
escaped, every form that changes something posts the console's CSRF fields, and a broken chain is said as such."""

from __future__ import annotations

from bastion.console import approvals_page, audit_page, interventions_page, live_page
from bastion.console.approvals import Settled, WaitingCall
from bastion.console.audit_view import ChainState, Found, SearchResult
from bastion.console.interventions import InterventionCount

HOSTILE = '<script>alert("x")</script>" onmouseover="alert(1)'
CSRF = '<input type=hidden name=csrf value=TOKEN>'


def _call(**changes) -> WaitingCall:
    fields = dict(id="abc123", who=HOSTILE, server=HOSTILE, tool="t", arguments='{"a": "' + HOSTILE + '"}',
                  note=HOSTILE, created=0.0, seconds_left=30.0)
    return WaitingCall(**{**fields, **changes})


def test_the_approval_page_escapes_what_callers_and_servers_wrote() -> None:
    page = approvals_page.render([_call()], CSRF, "/admin/approvals", now=10.0)
    assert "<script>" not in page and 'onmouseover="alert' not in page
    assert "&lt;script&gt;" in page


def test_each_waiting_call_has_approve_and_deny_posting_the_csrf_fields() -> None:
    page = approvals_page.render([_call(id="a1"), _call(id="b2")], CSRF, "/admin/approvals")
    assert page.count("<form method=post") == 2 and page.count(CSRF) == 2
    assert page.count("value=approve") == 2 and page.count("value=deny") == 2
    assert 'name=approval_id value="a1"' in page and 'name=approval_id value="b2"' in page


def test_an_empty_queue_and_what_became_of_an_answer() -> None:
    assert "No call is waiting" in approvals_page.render([], CSRF, "/x")
    done = approvals_page.render([], CSRF, "/x", Settled("a1", "approved", "files/write"))
    assert "files/write (a1): approved." in done
    refused = approvals_page.render([], CSRF, "/x", Settled("a1", "expired", "f/w", f"timed out {HOSTILE}"))
    assert "Nothing changed: timed out" in refused and "<script>" not in refused


def _state(intact: bool) -> ChainState:
    problems = () if intact else (f"/t/audit.jsonl:2 (seq 1): record was altered (hash mismatch) {HOSTILE}",)
    return ChainState(intact, 3, 1, problems, (), frozenset())


def test_the_audit_page_says_whether_the_chain_holds() -> None:
    assert "Chain verified: intact" in audit_page.render({}, "/a", _state(True), SearchResult(), None)
    broken = audit_page.render({}, "/a", _state(False), SearchResult(), None)
    assert "Chain BROKEN" in broken and "record was altered" in broken and "<script>" not in broken


def test_audit_records_are_escaped_and_broken_ones_marked() -> None:
    record = {"kind": "call", "seq": 1, "ts": 0, "who": {"name": HOSTILE}, "what": {"method": HOSTILE, "target": HOSTILE},
              "outcome": HOSTILE}
    result = SearchResult([Found("f", 2, record, broken=True), Found("f", 3, {**record, "seq": 2})], 2)
    page = audit_page.render({"text": HOSTILE}, "/a", _state(False), result, None)
    assert "<script>" not in page and 'onmouseover="' not in page
    assert page.count("chain broken here") == 1


def test_the_search_form_keeps_what_was_asked_and_a_bad_field_is_said() -> None:
    page = audit_page.render({"identity": "alice", "outcome": "refused"}, "/a", _state(True), None, "since: not a time")
    assert 'name=identity value="alice"' in page and '<option value="refused" selected>' in page
    assert "since: not a time" in page


def test_query_form_takes_only_the_search_fields() -> None:
    assert audit_page.query_form({"identity": ["bob", "eve"], "evil": "x", "text": ""}) == {"identity": "bob"}


def test_the_interventions_page() -> None:
    rows = [InterventionCount("secrets", "redacted", HOSTILE, 3)]
    record = {"kind": "guardrail", "ts": 0, "guardrail": "pii", "action": "redacted", "found": "email",
              "server": "s", "target": "t", "rule": "r", "detail": HOSTILE, "who": {"name": "alice"}}
    page = interventions_page.render(rows, {}, "/i", SearchResult([Found("f", 1, record)], 1), None)
    assert "<script>" not in page and ">3<" in page and "alice" in page
    assert "No guardrail has intervened" in interventions_page.render([], {}, "/i", SearchResult(), None)


def test_the_live_page_shows_the_figures_and_loads_its_script_from_the_console() -> None:
    live = {"rate": 1.5, "p50_ms": 2.25, "p95_ms": None, "in_flight": 0, "total": 7,
            "servers": [{"server": HOSTILE, "rate": 1.5, "p50_ms": 2.25, "p95_ms": None, "in_flight": 0}]}
    page = live_page.render(live, "/admin/live.json", "/admin/live.js")
    assert "1.50 calls/s" in page and "2.2 ms" in page and ">7<" in page
    assert '<script src="/admin/live.js" defer></script>' in page and "<script>" not in page
    assert "innerHTML" not in live_page.SCRIPT  # figures are written as text, never as markup
