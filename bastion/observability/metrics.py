"""What the gateway counts per request, and the read API others (the console) draw on.

Per request there is one interceptor, outermost on the one chain (``RequestMeter``), so it sees every client
request, the ones the exposure, screens, policy and guardrails refuse included; and a clock on the chain's innermost
position (``ServerClock``), which tells the time a request spent with its server from the gateway's own time, and
whether the server was reached at all (an error before it is a refusal). Both keep plain dicts keyed by label
tuples: a ``Counter.labels()`` per call would cost more than all of this. prometheus-client turns them into metric
families only when ``/metrics`` is scraped (``bastion.observability.collector``), with the rest of the gateway's
state read at that moment.

Labels are bounded: methods from MCP's own list, tools from the catalog (a name a client invents is ``other``),
servers from the configuration, callers as the class of how they authenticated unless ``identity_labels = "name"``
(capped too: past ``MAX_LABEL_VALUES`` names, ``other``).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from bastion.model import TO_SERVER, GatewayRequest, Handler

if TYPE_CHECKING:
    from bastion.observability.config import MetricsConfig

OTHER = "other"
# The methods a client may send (both protocol eras); any other name is counted as ``other``.
CLIENT_METHODS = frozenset({
    "initialize", "ping", "server/discover", "subscriptions/listen", "logging/setLevel", "completion/complete",
    "tools/list", "tools/call", "resources/list", "resources/templates/list", "resources/read",
    "resources/subscribe", "resources/unsubscribe", "prompts/list", "prompts/get",
    "tasks/get", "tasks/list", "tasks/cancel", "tasks/result",
})
# How many distinct values one open-ended label (an identity's name, a policy rule) takes before the rest are
# ``other``: a client must not be able to grow the gateway's memory or the scrape without bound.
MAX_LABEL_VALUES = 500
# Seconds; from a tenth of a millisecond (the gateway's own time) to a minute (a slow tool).
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
           30.0, 60.0)
_BUCKETS_NS = tuple(int(b * 1e9) for b in BUCKETS)
_now = time.perf_counter_ns

# Outcomes of a request: answered; an error once its server was reached (the server's, its transport's, a timeout);
# refused by the gateway (before the server, or its answer blocked on the way back); withdrawn by the client.
OK, ERROR, REFUSED, CANCELLED = "ok", "error", "refused", "cancelled"


def new_histogram() -> list[int]:
    """One latency histogram as the meter keeps it: a count per bucket (not cumulative; the last bucket past the
    largest bound), then the sum in nanoseconds. A list, bumped in place: an object's attributes cost more."""
    return [0] * (len(BUCKETS) + 2)


def cumulative(histogram: list[int]) -> list[tuple[float, int]]:
    """``(upper bound in seconds, requests at or under it)``, the last bound ``inf``."""
    total, out = 0, []
    for bound, count in zip((*BUCKETS, float("inf")), histogram[:-1]):
        total += count
        out.append((bound, total))
    return out


@dataclass(frozen=True, slots=True)
class LatencySample:
    """A histogram as read at one moment: cumulative buckets, the sum in seconds and the count."""

    buckets: tuple[tuple[float, int], ...]
    sum_seconds: float
    count: int

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the ``q`` quantile (None with no requests): an over-estimate
        by at most one bucket, as Prometheus's own histogram_quantile would interpolate within it."""
        if not self.count:
            return None
        wanted = q * self.count
        for bound, cumulative in self.buckets:
            if cumulative >= wanted:
                return bound
        return float("inf")

    @staticmethod
    def of(histograms: Any) -> "LatencySample":
        merged = new_histogram()
        for histogram in histograms:
            merged = [a + b for a, b in zip(merged, histogram)]
        return LatencySample(tuple(cumulative(merged)), merged[-1] / 1e9, sum(merged[:-1]))


@dataclass(frozen=True, slots=True)
class Totals:
    """The requests the gateway has answered since it started, by outcome, and their latency: what the console
    draws its request rate (the difference of two ``requests`` over their time) and latency from."""

    at: float  # time.monotonic() when read
    requests: int
    by_outcome: Mapping[str, int]
    gateway_latency: LatencySample  # the gateway's own time per request (all of it, minus the server's)
    server_latency: LatencySample  # the time requests spent with their servers


class Bounded:
    """The values one open-ended label has taken, at most ``MAX_LABEL_VALUES``; later new ones are ``other``."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        seen = self._seen
        if value in seen:
            return value
        if len(seen) >= MAX_LABEL_VALUES:
            return OTHER
        seen.add(value)
        return value


class GatewayMetrics:
    """The gateway's own metrics: what the chain's meter counts and what the collector reads at scrape time. One per
    gateway (built by the composition root, held by the gateway as ``gateway.metrics``), never process-global."""

    def __init__(self, config: "MetricsConfig") -> None:
        self.config = config
        # (method, server, tool, outcome, identity) -> requests
        self.requests: dict[tuple[str, str, str, str, str], int] = {}
        self.gateway_time: dict[str, list[int]] = {}  # by method (``new_histogram``)
        self.server_time: dict[tuple[str, str], list[int]] = {}  # by (method, server)
        # (stage, effect, rule) -> decisions, told by the policy (``decided``)
        self.decisions: dict[tuple[Any, ...], int] = {}
        self._rules = Bounded()
        self.names = Bounded() if config.identity_labels == "name" else None
        # Which server a request that is not a tools/call goes to (the router's answer), once the gateway exists.
        self.server_for: Callable[[str | None, Mapping[str, Any]], str | None] = lambda method, params: None
        # The sources read at scrape time, set by whoever owns them (compose, the frontends).
        self.sessions: dict[str, Callable[[], int]] = {}  # transport -> sessions open now
        self.bytes_in: dict[str, int] = {}  # transport -> bytes received from clients
        self.bytes_out: dict[str, int] = {}  # transport -> bytes sent to clients
        self.interventions: Any = None  # the guardrails' InterventionLog (its counts), None when they are off
        self.registry: Any = None  # the prometheus-client registry that reads these, made on the first scrape
        self.meter = RequestMeter(self)
        self.clock = ServerClock(self.meter)

    # ------------------------------------------------------------------ told by others
    def decided(self, stages: list[tuple[Any, ...]]) -> None:
        """The policy's stages for one request: ``(stage, effect, rule, reason, detail)`` each (the effect a
        ``str`` enum, counted as it is and written as its value at scrape time)."""
        decisions = self.decisions
        for stage in stages:
            key = stage[:3]
            try:
                decisions[key] += 1
            except KeyError:
                self._new_decision(key)

    def _new_decision(self, key: tuple[Any, ...]) -> None:
        stage, effect, rule = key
        if self._rules(rule) == rule:
            self.decisions[key] = 1
        else:  # past the bound: counted, under "other"
            other = (stage, effect, OTHER)
            self.decisions[other] = self.decisions.get(other, 0) + 1

    def counting_received(self, transport: str, feed: Callable[..., None]) -> Callable[..., None]:
        """``feed(frame, ...)`` that counts the frame's bytes as received from a client over ``transport``."""
        counts = self.bytes_in
        counts.setdefault(transport, 0)

        def counted(frame: bytes, *rest: Any) -> None:
            counts[transport] += len(frame)
            feed(frame, *rest)
        return counted

    def counting_sent(self, transport: str, send: Callable[..., None]) -> Callable[..., None]:
        """``send(frame, ...)`` that counts the frame's bytes as sent to a client over ``transport``."""
        counts = self.bytes_out
        counts.setdefault(transport, 0)

        def counted(frame: bytes, *rest: Any) -> None:
            counts[transport] += len(frame)
            send(frame, *rest)
        return counted

    def calls_now(self) -> tuple[dict[str, int], dict[str, int]]:
        """Tool calls inside the gateway now, by server: those their server has in hand (in flight), and those
        still waiting in the gateway on their way to it (for a person's approval, the server's start, the checks)."""
        in_flight: dict[str, int] = {}
        waiting: dict[str, int] = {}
        for _, entry, answered, message in list(self.meter.probes.values()):
            if entry is not None:
                if not answered:  # else answered, on its way back
                    in_flight[entry.server] = in_flight.get(entry.server, 0) + 1
            elif message.method == "tools/call":
                target = message.target
                if target is not None:
                    waiting[target.server] = waiting.get(target.server, 0) + 1
        return in_flight, waiting

    # ------------------------------------------------------------------ the read API (the console's)
    def totals(self) -> Totals:
        """Requests so far by outcome, and the latency histograms merged over methods and servers."""
        by_outcome: dict[str, int] = {}
        for (_, _, _, outcome, _), count in list(self.requests.items()):
            by_outcome[outcome] = by_outcome.get(outcome, 0) + count
        return Totals(time.monotonic(), sum(by_outcome.values()), by_outcome,
                      LatencySample.of(list(self.gateway_time.values())),
                      LatencySample.of(list(self.server_time.values())))


class RequestMeter:
    """Outermost on the chain: each client request's labels, outcome and time. It reads no params but the tool's
    name and no result, so raw pass-through of arguments and results stays as it is. Written for the hot path: every
    call here is one a ``tools/call`` pays (bench/operations_cost.py counts them), so counts are bumped in place
    and a new key is the exception."""

    directions = (TO_SERVER,)
    reads_params = False
    reads_results = False
    span_name = None  # it measures, it decides nothing: no span of its own in a trace

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics
        # (id(session), request id) -> [ns with its server, its tool once it reached it (the catalog's entry then: a server that
        # crashes takes its tools out), answered by it, the message], while the request is inside: what is in
        # flight and what waits is read from here at scrape time
        self.probes: dict[Any, list[Any]] = {}

    async def on_request(self, message: GatewayRequest, call_next: Handler) -> dict[str, Any]:
        started = _now()
        # What the clock finds it by: the session and the client's id, which an interceptor that passes the call on
        # as a new message (the search exposure's call_tool, a call a person approved) keeps.
        key: Any = (id(message.session), message.request_id)
        probes = self.probes
        if key in probes:  # one id twice in one session (the host API's calls have none): this one on its own
            key = id(message)
        probe = probes[key] = [0, None, False, message]
        outcome = OK
        try:
            return await call_next(message)
        except BaseException as error:
            if not isinstance(error, Exception):
                outcome = CANCELLED
            elif probe[1] is not None and not probe[2]:
                outcome = ERROR
            else:
                outcome = REFUSED
            raise
        finally:
            elapsed = _now() - started
            del probes[key]
            metrics = self.metrics
            method = message.method
            if method == "tools/call":
                entry = probe[1]
                if entry is None:  # refused before its server: the tool as the chain left it
                    entry = message.target
                tool, server = (entry.exposed_name, entry.server) if entry is not None else (OTHER, "")
            elif method in CLIENT_METHODS:
                tool, server = "", metrics.server_for(method, message.params) or ""
            else:
                method, tool, server = OTHER, "", ""
            identity = message.session.identity
            names = metrics.names
            labels = (method, server, tool, outcome,
                      identity.authenticated_by if names is None else names(identity.name))
            try:
                metrics.requests[labels] += 1
            except KeyError:
                metrics.requests[labels] = 1
            server_ns = probe[0]
            try:
                histogram = metrics.gateway_time[method]
            except KeyError:
                histogram = metrics.gateway_time[method] = new_histogram()
            ns = elapsed - server_ns
            histogram[bisect_left(_BUCKETS_NS, ns)] += 1
            histogram[-1] += ns
            if server_ns:
                try:
                    histogram = metrics.server_time[(method, server)]
                except KeyError:
                    histogram = metrics.server_time[(method, server)] = new_histogram()
                histogram[bisect_left(_BUCKETS_NS, server_ns)] += 1
                histogram[-1] += server_ns


class ServerClock:
    """Innermost on the chain, on the route of ``tools/call`` only: what follows it is the router and the server.
    It tells the meter how long the call spent there, and whether the server answered (an error after that is the
    gateway's refusal of the answer; an error before it, the server's)."""

    directions = (TO_SERVER,)
    methods = frozenset({"tools/call"})
    reads_params = False
    reads_results = False
    span_name = None  # as the meter's

    def __init__(self, meter: RequestMeter) -> None:
        self._probes = meter.probes

    async def on_request(self, message: GatewayRequest, call_next: Handler) -> dict[str, Any]:
        probe = self._probes.get((id(message.session), message.request_id))
        entry = message.target
        if probe is None or entry is None:
            # a request the meter did not see (a chain of the tests' own), or a tool no server has: the router
            # refuses it itself
            return await call_next(message)
        probe[1] = entry
        started = _now()
        try:
            result = await call_next(message)
            probe[2] = True
            return result
        finally:
            probe[0] += _now() - started


__all__ = ["BUCKETS", "CLIENT_METHODS", "GatewayMetrics", "LatencySample", "OTHER", "Totals", "cumulative"]
