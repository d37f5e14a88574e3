"""The approvals, audit, guardrails and live pages rendered from real files (an approval queue, a sealed trail) and
real metrics: what callers, servers and the trail wrote is escaped, each waiting call has approve and deny forms
carrying the session's CSRF token, a search field that cannot be read is said, and a console without metrics says
where they are instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.config import GatewayConfig
from bastion.console.data import ConsoleData
from bastion.console.live import LiveWindow
from bastion.console.pages import approvals, audit, interventions, live
from bastion.console.registry import ActRequest, View
from bastion.guardrails.report import Intervention, InterventionLog
from bastion.model import Identity
from bastion.observability.config import MetricsConfig
from bastion.observability.metrics import GatewayMetrics
from bastion.policy.audit import AuditWriter

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'
OLGA = Identity("olga", ("admins",), "api_key")


def _data(tmp_path: Path, **extra) -> ConsoleData:
    config = GatewayConfig.model_validate({"servers": {}, "policy": {
        "audit": {"path": str(tmp_path / "audit.jsonl")}, "approval": {"queue_dir": str(tmp_path / "approvals")}}})
    return ConsoleData(config, **extra)


def _view(data: ConsoleData, path: str, query: dict[str, str] | None = None) -> View:
    return View(OLGA, query or {}, data, "CSRF-TOKEN", path)


def _queue_hostile_call(data: ConsoleData) -> str:
    who = {"name": HOSTILE, "groups": [], "authenticated_by": "api_key"}
    return data.approval_queue().submit({"identity": HOSTILE, "who": who, "server": HOSTILE, "tool": HOSTILE,
                                         "method": "tools/call", "arguments": {"path": HOSTILE},
                                         "note": HOSTILE}, 60)


async def test_the_approvals_page_escapes_and_posts_the_csrf_token(tmp_path) -> None:
    data = _data(tmp_path)
    approval_id = _queue_hostile_call(data)
    page = await approvals.render(_view(data, "approvals"))
    assert "<script>" not in page and "<img" not in page and "&lt;script&gt;" in page
    assert page.count('name="csrf" value="CSRF-TOKEN"') == 2
    assert 'action="/admin/act/approve"' in page and 'action="/admin/act/deny"' in page
    assert page.count(f'name="approval_id" value="{approval_id}"') == 2


async def test_the_approve_and_deny_acts(tmp_path) -> None:
    data = _data(tmp_path)
    approve, deny = approvals.ACTS
    first, second = _queue_hostile_call(data), _queue_hostile_call(data)
    done = await approve.run(ActRequest(OLGA, {"approval_id": first}, data))
    assert done.done and "approved" in done.message
    assert data.approval_queue().read(first).record["by"] == "olga (api_key) in the console"
    again = await deny.run(ActRequest(OLGA, {"approval_id": first}, data))
    assert again.status == 409 and "already approved" in again.message
    assert (await deny.run(ActRequest(OLGA, {"approval_id": second}, data))).done
    unknown = await approve.run(ActRequest(OLGA, {"approval_id": "0123456789ab"}, data))
    assert unknown.status == 404 and "no approval request" in unknown.message
    with pytest.raises(Exception, match="approval_id"):
        await approve.run(ActRequest(OLGA, {"approval_id": "x" * 100}, data))  # BadForm: answered 400
    assert approve.target({"approval_id": first}) == first


@pytest.fixture
def trail_data(tmp_path) -> ConsoleData:
    data = _data(tmp_path)
    writer = AuditWriter(data.audit_trail())
    who = {"name": HOSTILE, "groups": [], "authenticated_by": "header"}
    stages = [("authorization", "deny", HOSTILE, HOSTILE, None)]
    writer.write_call((1000.0, who, "tools/call", HOSTILE, {"a": HOSTILE}, False, -32001, 0, stages))
    InterventionLog(writer.write).report(Intervention("secrets", "redacted", HOSTILE, HOSTILE, "aws-access-key",
                                                      HOSTILE, detail=HOSTILE, identity=Identity(HOSTILE, (), "header")))
    writer.close()
    return data


async def test_the_audit_page_escapes_the_trail(trail_data) -> None:
    page = await audit.render(_view(trail_data, "audit", {"text": HOSTILE}))
    assert "<script>" not in page and "<img" not in page
    assert "Chain verified: intact" in page and "tools/call" in page


async def test_the_audit_page_says_which_field_it_cannot_read(trail_data) -> None:
    page = await audit.render(_view(trail_data, "audit", {"since": "last tuesday", "evil": "<x>"}))
    assert "since: &#x27;last tuesday&#x27; is not a time" in page


async def test_the_audit_page_without_a_trail(tmp_path) -> None:
    config = GatewayConfig.model_validate({"servers": {}, "policy": {"audit": {"enabled": False}}})
    page = await audit.render(_view(ConsoleData(config), "audit"))
    assert "writes no audit trail" in page


async def test_the_guardrails_page_escapes_and_counts(trail_data) -> None:
    page = await interventions.render(_view(trail_data, "interventions"))
    assert "<script>" not in page and "<img" not in page
    assert "aws-access-key" in page and "<td>1</td>" in page


async def test_the_live_page_with_and_without_metrics(tmp_path) -> None:
    assert "[metrics] listen" in await live.render(_view(_data(tmp_path), "live"))
    metrics = GatewayMetrics(MetricsConfig())
    page = await live.render(_view(_data(tmp_path, live=LiveWindow(metrics.totals)), "live"))
    assert 'src="/admin/static/live.js"' in page and "since the gateway started" in page
    assert 'data-figure="total"' in page
