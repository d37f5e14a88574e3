"""The meter and the clock on a real chain (``bastion.gateway.pipeline.Chain``), the last step standing in for the
server: outcomes told apart by where a request ended, the console's read API, bounded labels, and readiness's
answer when the state store fails."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bastion.gateway.pipeline import Chain
from bastion.model import GatewayError, GatewayRequest, Identity, Session, ToolEntry
from bastion.observability.config import MetricsConfig
from bastion.observability.health import state_reachable
from bastion.observability.metrics import MAX_LABEL_VALUES, GatewayMetrics
from bastion.policy.decision import Effect


class Catalog:
    def __init__(self) -> None:
        self.entries = {name: ToolEntry(name, "fx", name.split("__")[1], {"name": name})
                        for name in ("fx__ok", "fx__fails", "fx__slow", "fx__blocked")}

    def tool(self, name: str) -> ToolEntry | None:
        return self.entries.get(name)

    def tools(self) -> list[ToolEntry]:
        return list(self.entries.values())


class Refuse:
    """A guard before the server: refuses fx__blocked; and on the way back, blocks fx__ok's answer when asked."""

    def __init__(self) -> None:
        self.block_answers = False

    async def on_request(self, message: GatewayRequest, call_next: Any) -> dict[str, Any]:
        if message.params.get("name") == "fx__blocked":
            raise GatewayError(-32001, "refused by policy")
        result = await call_next(message)
        if self.block_answers:
            raise GatewayError(-32603, "blocked on its way back")
        return result


async def server(message: GatewayRequest) -> dict[str, Any]:
    name = message.params.get("name")
    if name == "fx__fails":
        raise GatewayError(-32001, "server 'fx' is not available: it crashed")
    if name == "fx__slow":
        message.session.facts["reached"].set()
        await asyncio.Event().wait()
    if message.target is None and message.method == "tools/call":
        raise GatewayError(-32602, "unknown tool")
    return {"content": []}


def chain(metrics: GatewayMetrics, guard: Refuse) -> Any:
    return Chain([metrics.meter, guard, metrics.clock], lambda raw_results: server).handle


def call(name: str, identity: Identity = Identity("alice", (), "oauth")) -> GatewayRequest:
    session = Session(identity, "legacy", "2025-11-25", {})
    return GatewayRequest("tools/call", {"name": name, "arguments": {}}, session, Catalog())


def outcomes(metrics: GatewayMetrics) -> dict[tuple[str, str], int]:
    return {(tool, outcome): count for (_, _, tool, outcome, _), count in metrics.requests.items()}


async def test_outcomes_are_told_apart_by_where_the_request_ended() -> None:
    metrics, guard = GatewayMetrics(MetricsConfig()), Refuse()
    handle = chain(metrics, guard)
    await handle(call("fx__ok"))
    for name in ("fx__blocked", "fx__fails", "fx__invented"):
        with pytest.raises(GatewayError):
            await handle(call(name))
    guard.block_answers = True
    with pytest.raises(GatewayError):
        await handle(call("fx__ok"))
    slow_call = call("fx__slow")
    reached = slow_call.session.facts["reached"] = asyncio.Event()
    slow = asyncio.ensure_future(handle(slow_call))
    await reached.wait()  # the call is with the server, which never answers
    in_flight, waiting = metrics.calls_now()
    assert in_flight == {"fx": 1} and waiting == {}
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert outcomes(metrics) == {("fx__ok", "ok"): 1, ("fx__blocked", "refused"): 1, ("fx__fails", "error"): 1,
                                 ("other", "refused"): 1, ("fx__ok", "refused"): 1, ("fx__slow", "cancelled"): 1}
    assert metrics.calls_now() == ({}, {})
    assert not metrics.meter.probes  # nothing left behind
    assert {labels[4] for labels in metrics.requests} == {"oauth"}


async def test_the_console_reads_totals_and_latency() -> None:
    metrics = GatewayMetrics(MetricsConfig())
    handle = chain(metrics, Refuse())
    before = metrics.totals()
    assert before.requests == 0 and before.gateway_latency.quantile(0.5) is None
    for _ in range(10):
        await handle(call("fx__ok"))
    with pytest.raises(GatewayError):
        await handle(call("fx__blocked"))
    after = metrics.totals()
    assert after.requests == 11 and after.by_outcome == {"ok": 10, "refused": 1}
    assert after.at >= before.at
    assert after.gateway_latency.count == 11 and after.server_latency.count == 10
    assert after.gateway_latency.buckets[-1] == (float("inf"), 11)
    assert after.server_latency.quantile(0.5) is not None and after.server_latency.sum_seconds > 0


async def test_names_and_rules_are_bounded() -> None:
    metrics = GatewayMetrics(MetricsConfig(identity_labels="name"))
    handle = chain(metrics, Refuse())
    for index in range(MAX_LABEL_VALUES + 20):
        await handle(call("fx__ok", Identity(f"user-{index}")))
    names = {labels[4] for labels in metrics.requests}
    assert len(names) == MAX_LABEL_VALUES + 1 and "other" in names
    for index in range(MAX_LABEL_VALUES + 20):
        metrics.decided([("authorization", Effect.ALLOW, f"rule-{index}", "", None)])
    rules = {rule for _, _, rule in metrics.decisions}
    assert len(rules) == MAX_LABEL_VALUES + 1 and "other" in rules
    assert sum(metrics.decisions.values()) == MAX_LABEL_VALUES + 20


async def test_the_collector_writes_what_the_meter_counted() -> None:
    from bastion.observability.collector import exposition, registry_for

    class NoServers:  # a gateway of no servers and no policy: what the collector reads of one
        upstreams: dict[str, Any] = {}
        pools: dict[str, Any] = {}
        policy = None

    metrics = GatewayMetrics(MetricsConfig())
    metrics.decided([("authorization", Effect.DENY, "", "", None)])
    handle = chain(metrics, Refuse())
    await handle(call("fx__ok"))
    text = exposition(registry_for(NoServers(), metrics)).decode()  # type: ignore[arg-type]
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("bastion_requests_total", (("identity", "oauth"), ("method", "tools/call"), ("outcome", "ok"),
                                               ("server", "fx"), ("tool", "fx__ok")))] == 1
    assert samples[("bastion_policy_decisions_total", (("effect", "deny"), ("rule", "-"),
                                                       ("stage", "authorization")))] == 1
    assert samples[("bastion_server_duration_seconds_count", (("method", "tools/call"), ("server", "fx")))] == 1
    assert "bastion_audit_writable" not in text  # no trail is kept: nothing to be healthy


async def test_a_state_store_that_fails_is_not_reachable() -> None:
    class Broken:
        async def ping(self) -> None:
            raise ConnectionError("the store is gone")

    class Working:
        async def ping(self) -> None:
            return None

    assert await state_reachable(Working()) is True
    assert await state_reachable(Broken()) is False


class Rewrite:
    """As the search exposure's call_tool and the approval stage do: the call passed on as a new message, under the
    real tool's name."""

    async def on_request(self, message: GatewayRequest, call_next: Any) -> dict[str, Any]:
        import dataclasses

        if message.params.get("name") == "call_tool":
            real = message.params["arguments"]["name"]
            message = dataclasses.replace(message, params={"name": real, "arguments": {}}, person_approved=True)
        return await call_next(message)


async def test_a_call_passed_on_as_a_new_message_is_counted_under_its_real_tool() -> None:
    metrics = GatewayMetrics(MetricsConfig())
    handle = Chain([metrics.meter, Rewrite(), metrics.clock], lambda raw_results: server).handle

    def meta(real: str, request_id: int) -> GatewayRequest:
        message = call("call_tool")
        message.params["arguments"] = {"name": real}
        message.request_id = request_id
        return message

    await handle(meta("fx__ok", 1))
    with pytest.raises(GatewayError):
        await handle(meta("fx__fails", 2))  # the server's error, not a refusal
    assert outcomes(metrics) == {("fx__ok", "ok"): 1, ("fx__fails", "error"): 1}
    assert sum(metrics.server_time[("tools/call", "fx")][:-1]) == 2
    assert not metrics.meter.probes


def test_a_gateway_nobody_scrapes_never_imports_prometheus_client() -> None:
    """prometheus-client takes tens of milliseconds to import: a start of ``bastion run`` (or a one-shot command)
    must not pay it."""
    import subprocess
    import sys

    probe = ("import sys, asyncio\n"
             "from bastion.compose import build_gateway\n"
             "from bastion.config import GatewayConfig\n"
             "async def main():\n"
             "    gateway = build_gateway(GatewayConfig.model_validate({'servers': {}}))\n"
             "    assert gateway.metrics is not None\n"
             "    await gateway.close()\n"
             "asyncio.run(main())\n"
             "print('prometheus_client' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
