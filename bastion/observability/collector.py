"""The metric families of one gateway, made when ``/metrics`` is scraped: what the chain's meter counted, and the
gateway's state read at that moment (servers, queues, approvals, sessions, the audit trail). Nothing here runs per
request. Every name and label is listed in docs/operations.md ("Metrics")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from bastion.observability.metrics import BUCKETS, GatewayMetrics, cumulative

if TYPE_CHECKING:
    from bastion.gateway.core import Gateway

_BOUNDS = tuple(repr(float(b)) for b in BUCKETS) + ("+Inf",)


def registry_for(gateway: "Gateway", metrics: GatewayMetrics, interventions: Any = None) -> CollectorRegistry:
    """A registry of the gateway's own (never prometheus-client's global one) with its collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(gateway, metrics, interventions))  # type: ignore[arg-type]
    return registry


def registry_of(gateway: "Gateway") -> CollectorRegistry:
    """The gateway's registry, made on its first scrape."""
    metrics = gateway.metrics
    if metrics.registry is None:
        metrics.registry = registry_for(gateway, metrics, metrics.interventions)
    return metrics.registry  # type: ignore[no-any-return]


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format."""
    return generate_latest(registry)


class GatewayCollector:
    def __init__(self, gateway: "Gateway", metrics: GatewayMetrics, interventions: Any = None) -> None:
        self._gateway = gateway
        self._metrics = metrics
        self._interventions = interventions  # the guardrails' InterventionLog, None when they are off

    def collect(self) -> Iterator[Metric]:
        yield from self._requests()
        yield from self._servers()
        yield from self._policy()
        yield from self._sessions()
        yield from self._audit()

    # ---------------------------------------------------------------------------- per request
    def _requests(self) -> Iterator[Metric]:
        metrics = self._metrics
        requests = CounterMetricFamily("bastion_requests", "Client requests answered, by method, server, tool, "
                                       "outcome and identity", labels=["method", "server", "tool", "outcome",
                                                                       "identity"])
        for labels, count in list(metrics.requests.items()):
            requests.add_metric(list(labels), count)
        yield requests
        gateway_time = HistogramMetricFamily("bastion_gateway_duration_seconds", "The gateway's own time per "
                                             "client request (all of it but the time with its server)",
                                             labels=["method"])
        for method, histogram in list(metrics.gateway_time.items()):
            gateway_time.add_metric([method], _buckets(histogram), histogram[-1] / 1e9)
        yield gateway_time
        server_time = HistogramMetricFamily("bastion_server_duration_seconds", "Time client requests spent with "
                                            "their server", labels=["method", "server"])
        for (method, server), histogram in list(metrics.server_time.items()):
            server_time.add_metric([method, server], _buckets(histogram), histogram[-1] / 1e9)
        yield server_time

    # ---------------------------------------------------------------------------- servers
    def _servers(self) -> Iterator[Metric]:
        gateway = self._gateway
        in_flight_now, waiting_now = self._metrics.calls_now()
        up = GaugeMetricFamily("bastion_server_up", "1 when the server is ready, 0 otherwise", labels=["server"])
        in_flight = GaugeMetricFamily("bastion_server_calls_in_flight", "Client tool calls the server has in hand "
                                      "now (past the gateway's checks, not answered yet)", labels=["server"])
        queue = GaugeMetricFamily("bastion_server_queue_depth", "Client tool calls for the server still waiting in "
                                  "the gateway (for approval, for its start, in the checks)", labels=["server"])
        restarts = CounterMetricFamily("bastion_server_restarts", "Starts of the server after its first",
                                       labels=["server"])
        crashes = CounterMetricFamily("bastion_server_crashes", "Runs of the server that ended after it was ready",
                                      labels=["server"])
        memory = CounterMetricFamily("bastion_server_memory_kills", "Runs the sandbox's memory limit ended",
                                     labels=["server"])
        for name, upstream in list(gateway.upstreams.items()):
            pool = gateway.pools.get(name)
            every = [upstream, *(pool.instances() if pool is not None else ())]
            up.add_metric([name], 1 if upstream.ready.is_set() else 0)
            in_flight.add_metric([name], in_flight_now.get(name, 0))
            queue.add_metric([name], waiting_now.get(name, 0))
            restarts.add_metric([name], sum(u.restarts for u in every))
            crashes.add_metric([name], sum(u.crashes for u in every))
            memory.add_metric([name], sum(u.memory_kills for u in every))
        yield from (up, in_flight, queue, restarts, crashes, memory)

    # ---------------------------------------------------------------------------- policy and guardrails
    def _policy(self) -> Iterator[Metric]:
        decisions = CounterMetricFamily("bastion_policy_decisions", "Policy decisions, by stage, effect and rule",
                                        labels=["stage", "effect", "rule"])
        merged: dict[tuple[str, str, str], int] = {}
        for (stage, effect, rule), count in list(self._metrics.decisions.items()):
            labels = (stage, str(getattr(effect, "value", effect)), rule or "-")
            merged[labels] = merged.get(labels, 0) + count
        for labels, count in merged.items():
            decisions.add_metric(list(labels), count)
        yield decisions
        interventions = CounterMetricFamily("bastion_guardrail_interventions", "Guardrail interventions, by "
                                            "guardrail, action and kind", labels=["guardrail", "action", "kind"])
        if self._interventions is not None:
            for labels, count in list(self._interventions.counts.items()):
                interventions.add_metric(list(labels), count)
        yield interventions
        approval = self._gateway.policy.approval if self._gateway.policy is not None else None
        yield GaugeMetricFamily("bastion_approvals_waiting", "Calls waiting for a person's approval now",
                                value=approval.waiting if approval is not None else 0)

    # ---------------------------------------------------------------------------- clients
    def _sessions(self) -> Iterator[Metric]:
        metrics = self._metrics
        sessions = GaugeMetricFamily("bastion_sessions_open", "Client sessions open now, by transport",
                                     labels=["transport"])
        for transport, count in list(metrics.sessions.items()):
            sessions.add_metric([transport], count())
        yield sessions
        received = CounterMetricFamily("bastion_client_received_bytes", "Bytes of MCP messages received from "
                                       "clients, by transport", labels=["transport"])
        for transport, count in list(metrics.bytes_in.items()):
            received.add_metric([transport], count)
        yield received
        sent = CounterMetricFamily("bastion_client_sent_bytes", "Bytes of MCP messages sent to clients, by "
                                   "transport", labels=["transport"])
        for transport, count in list(metrics.bytes_out.items()):
            sent.add_metric([transport], count)
        yield sent

    # ---------------------------------------------------------------------------- the audit trail
    def _audit(self) -> Iterator[Metric]:
        policy = self._gateway.policy
        writer = policy.audit.writer if policy is not None else None
        if writer is None:
            return  # no trail is kept: nothing to be healthy
        yield GaugeMetricFamily("bastion_audit_writable", "1 while the audit trail is being written, 0 while it "
                                "cannot be", value=0 if writer.failure is not None else 1)
        yield GaugeMetricFamily("bastion_audit_records_behind", "Audit records handed over and not yet sent to "
                                "the sealer", value=writer.behind())
        if writer.last_delivered is not None:
            yield GaugeMetricFamily("bastion_audit_last_write_timestamp_seconds", "When records last went to the "
                                    "sealer whole (Unix time)", value=writer.last_delivered)


def _buckets(histogram: list[int]) -> list[tuple[str, float]]:
    return [(bound, float(count)) for bound, (_, count) in zip(_BOUNDS, cumulative(histogram))]
