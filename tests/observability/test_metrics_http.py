"""``/metrics``, ``/healthz`` and ``/readyz`` on a real ``bastion serve --http``: the official SDK's HTTP clients of
both eras call tools with API keys, then the metrics are scraped and parsed with prometheus-client's own parser;
a server's process is killed and the metrics and readiness follow; who may read the metrics is Cedar's decision."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from prometheus_client.parser import text_string_to_metric_families

from tests.auth.serving import Served, start, stop
from tests.support import BASTION, FIXTURES, READY_TIMEOUT, pids_with_tag, raw_server, wait_for

pytestmark = pytest.mark.slow

POLICY = """
@id("anyone-lists")
permit (principal, action in [Bastion::Action::"list_tools", Bastion::Action::"list_resources",
                              Bastion::Action::"list_prompts"], resource);

@id("calls-but-garbage")
permit (principal, action == Bastion::Action::"call_tool", resource) unless { resource.name == "garbage" };

@id("admins-read-metrics")
permit (principal in Bastion::Group::"admins", action == Bastion::Action::"view_metrics", resource);
"""
ERAS = ("legacy", "auto")  # auto probes server/discover and so speaks 2026-07-28 to Bastion


def make_key(file: Path, name: str, *groups: str) -> str:
    made = subprocess.run([BASTION, "keys", "create", name, "--file", str(file),
                           *(("--groups", ",".join(groups)) if groups else ())],
                          capture_output=True, text=True, timeout=120, check=True)
    return made.stdout.strip()


def gate_server(settings: Path, tag: str, gate: Path) -> dict[str, Any]:
    """A server that starts once ``gate`` exists, and only while ``settings`` does: once that is deleted and the
    process killed, it stays down."""
    return {"command": sys.executable, "args": [str(FIXTURES / "start_gate_server.py"), tag],
            "env": {"START_CRASH_UNLESS": str(settings), "START_GATE": str(gate), "START_NAME": "gate"},
            "trust": "trusted", "sandbox": {"writable": [str(settings.parent)]}}


def write_config(tmp: Path, servers: dict[str, Any], *, metrics: dict[str, Any] | None = None,
                 audit: Path | None = None) -> Path:
    (tmp / "team.cedar").write_text(POLICY)
    config = {"servers": servers, "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"},
              "auth": {"api_keys": "keys.json"}, **({"metrics": metrics} if metrics is not None else {}),
              "policy": {"policy_files": ["team.cedar"], "audit": {"path": str(audit or tmp / "audit.jsonl")}}}
    path = tmp / "bastion.json"
    path.write_text(json.dumps(config))
    return path


def base(served: Served) -> str:
    return served.url[: -len("/mcp")]


def scrape(served: Served, key: str) -> dict[str, list[Any]]:
    """The samples of every family, by family name (a counter's family is named without ``_total``)."""
    answer = httpx2.get(f"{base(served)}/metrics", headers={"authorization": f"Bearer {key}"}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return {family.name: family.samples for family in text_string_to_metric_families(answer.text)}


def value(families: dict[str, list[Any]], sample: str, **labels: str) -> float:
    family = families[sample.removesuffix("_total").removesuffix("_count").removesuffix("_sum")]
    found = [s.value for s in family if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(found)


async def calls(url: str, key: str, mode: str) -> None:
    http = httpx2.AsyncClient(headers={"authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(120, read=300))
    async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"raw__echo", "gate__hello"} <= names
        for _ in range(3):
            result = await client.call_tool("raw__echo", {"text": "hi"})
            assert not result.is_error
        assert (await client.call_tool("gate__hello", {})).content
        with pytest.raises(MCPError):
            await client.call_tool("raw__garbage", {})  # refused by the policy
        with pytest.raises(MCPError):
            await client.call_tool("raw__made_up_by_the_client", {})  # no such tool


async def test_metrics_count_calls_of_both_eras_refusals_and_a_killed_server(tmp_path: Path) -> None:
    settings = tmp_path / "gate-settings"
    settings.write_text("ok")
    tag = f"gate-{os.getpid()}-{tmp_path.name}"
    gate = tmp_path / "gate-open"
    config = write_config(tmp_path, {"raw": raw_server(trust="trusted"), "gate": gate_server(settings, tag, gate)})
    admin = make_key(tmp_path / "keys.json", "olivia", "admins")
    agent = make_key(tmp_path / "keys.json", "agent", "ops")
    served = start(config)
    try:
        # not ready while a server is still starting: the gate server waits for its gate
        assert wait_for(lambda: value(scrape(served, admin), "bastion_server_up", server="raw") == 1, timeout=120)
        starting = httpx2.get(f"{base(served)}/readyz", timeout=60)
        assert starting.status_code == 503
        assert starting.json()["checks"]["servers"] == {"ok": False, "ready": 1, "starting": 1, "configured": 2}
        gate.write_text("open")
        assert wait_for(lambda: httpx2.get(f"{base(served)}/readyz", timeout=60).status_code == 200, timeout=120)
        for mode in ERAS:
            await calls(served.url, agent, mode)
        families = scrape(served, admin)
        by = {"identity": "api_key"}
        assert value(families, "bastion_requests_total", method="tools/call", tool="raw__echo", server="raw",
                     outcome="ok", **by) == 6
        assert value(families, "bastion_requests_total", method="tools/call", tool="gate__hello", server="gate",
                     outcome="ok", **by) == 2
        assert value(families, "bastion_requests_total", method="tools/call", tool="raw__garbage",
                     outcome="refused", **by) == 2
        # a name the client invented is never a label of its own
        assert value(families, "bastion_requests_total", method="tools/call", tool="other", outcome="refused") == 2
        assert not any("made_up" in str(s.labels) for samples in families.values() for s in samples)
        assert value(families, "bastion_policy_decisions_total", stage="authorization", effect="deny",
                     rule="default-deny") == 2
        assert value(families, "bastion_policy_decisions_total", effect="allow", rule="calls-but-garbage") == 8
        assert value(families, "bastion_server_duration_seconds_count", method="tools/call", server="raw") == 6
        assert value(families, "bastion_gateway_duration_seconds_count", method="tools/call") == 12
        assert value(families, "bastion_server_up", server="gate") == 1
        assert value(families, "bastion_client_received_bytes_total", transport="http") > 0
        assert value(families, "bastion_client_sent_bytes_total", transport="http") > 0
        assert value(families, "bastion_audit_writable") == 1

        # The gate server's process is killed and cannot start again: it is down, and the gateway not ready.
        settings.unlink()
        for pid in pids_with_tag(tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # the sandbox's process, gone with the server it ran (or the other way round)
        assert wait_for(lambda: value(scrape(served, admin), "bastion_server_up", server="gate") == 0, timeout=60)
        families = scrape(served, admin)
        assert value(families, "bastion_server_crashes_total", server="gate") == 1
        assert value(families, "bastion_server_up", server="raw") == 1
        not_ready = httpx2.get(f"{base(served)}/readyz", timeout=60)
        assert not_ready.status_code == 503
        body = not_ready.json()
        assert body["checks"]["servers"] == {"ok": False, "ready": 1, "starting": 0, "configured": 2}
        assert "gate" not in not_ready.text and "raw" not in not_ready.text and str(tmp_path) not in not_ready.text
        assert wait_for(lambda: value(scrape(served, admin), "bastion_server_restarts_total", server="gate") >= 1,
                        timeout=60)
        alive = httpx2.get(f"{base(served)}/healthz", timeout=60)
        assert alive.status_code == 200 and alive.json() == {"status": "ok"}
    finally:
        stop(served)


async def test_only_identities_the_policy_lets_view_metrics_read_them(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"raw": raw_server(trust="trusted")})
    admin = make_key(tmp_path / "keys.json", "olivia", "admins")
    agent = make_key(tmp_path / "keys.json", "agent", "ops")
    served = start(config)
    try:
        url = f"{base(served)}/metrics"
        nobody = httpx2.get(url, timeout=60)
        assert nobody.status_code == 401
        wrong = httpx2.get(url, headers={"authorization": "Bearer bk_not_a_key"}, timeout=60)
        assert wrong.status_code == 401
        refused = httpx2.get(url, headers={"authorization": f"Bearer {agent}"}, timeout=60)
        assert refused.status_code == 403
        assert "bastion_" not in refused.text
        allowed = httpx2.get(url, headers={"authorization": f"Bearer {admin}"}, timeout=60)
        assert allowed.status_code == 200 and "bastion_server_up" in allowed.text
        posted = httpx2.post(url, headers={"authorization": f"Bearer {admin}"}, timeout=60)
        assert posted.status_code == 405
        # probes are answered whatever Host they send (a kubelet's is the pod's address); the rest is guarded
        probe = httpx2.get(f"{base(served)}/healthz", headers={"host": "10.1.2.3:8080"}, timeout=60)
        assert probe.status_code == 200
        guarded = httpx2.get(url, headers={"authorization": f"Bearer {admin}", "host": "attacker.example"},
                             timeout=60)
        assert guarded.status_code == 403
    finally:
        stop(served)
    # the refusal is in the audit trail, with who and the rule that decided
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    refusals = [r for r in records if r.get("what", {}).get("method") == "admin/view_metrics"]
    assert refusals and {r["who"]["name"] for r in refusals} == {"agent"}, refusals
    assert [r["outcome"] for r in refusals if "outcome" in r] == [403]


async def test_labels_stay_bounded_and_escaped_whatever_callers_send(tmp_path: Path) -> None:
    """Callers named by a header, each a label of its own (``identity_labels = "name"``): quotes and backslashes
    in a name stay inside its label, 600 names make at most 500 labels and ``other``, and a method nobody defined
    is ``other``. The separate listener serves a gateway on HTTP too, unauthenticated."""
    from tests.auth.serving import modern_request

    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"raw": raw_server(trust="trusted")}, "ready_timeout": READY_TIMEOUT, "policy": "off",
        "tools": {"exposure": "all"}, "http": {"identity_header": "X-Agent"},
        "metrics": {"listen": "127.0.0.1:0", "identity_labels": "name"}}))
    served = start(config)
    try:
        [listener] = [line.split("serving metrics on ")[1].removesuffix("/metrics") for line in
                      served.log().splitlines() if "serving metrics on " in line]
        hostile = 'eve"} bastion_server_up{server="raw"} 0 #\\'
        async with httpx2.AsyncClient(timeout=60) as http:
            assert (await modern_request(http, served.url, {"x-agent": hostile}, "tools/list", {})).status_code == 200
            for index in range(600):
                answer = await modern_request(http, served.url, {"x-agent": f"agent-{index}"}, "tools/list", {})
                assert answer.status_code == 200
            odd = await modern_request(http, served.url, {"x-agent": "agent-1"}, "tools/invented_by_the_client", {})
            assert "error" in odd.text
            scraped = await http.get(f"{listener}/metrics")
        assert scraped.status_code == 200
        families = {family.name: family.samples for family in text_string_to_metric_families(scraped.text)}
        identities = {s.labels["identity"] for s in families["bastion_requests"]}
        assert hostile in identities  # one label, its quotes its own
        assert len(identities) == 501 and "other" in identities
        assert value(families, "bastion_requests_total", identity="other") == 600 + 1 - 500
        assert [s.value for s in families["bastion_server_up"]] == [1.0]  # the forged series is not one
        assert {s.labels["method"] for s in families["bastion_requests"]} <= {"tools/list", "other"}
    finally:
        stop(served)
