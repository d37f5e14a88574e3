"""Live figures from the gateway's own metrics: the requests, outcomes and latency of the window between a reading
and now, not since start; nothing before the first look."""

from __future__ import annotations

from bastion.console.live import LiveWindow
from bastion.observability.config import MetricsConfig
from bisect import bisect_left

from bastion.observability.metrics import BUCKETS, GatewayMetrics, new_histogram

_BOUNDS_NS = tuple(int(bound * 1e9) for bound in BUCKETS)


def _observe(histogram: list[int], ns: int) -> None:
    histogram[bisect_left(_BOUNDS_NS, ns)] += 1  # as the gateway's meter counts a request
    histogram[-1] += ns


def _answered(metrics: GatewayMetrics, count: int, outcome: str, gateway_ns: int, server_ns: int) -> None:
    key = ("tools/call", "kb", "kb__lookup", outcome, "api_key")
    metrics.requests[key] = metrics.requests.get(key, 0) + count
    own = metrics.gateway_time.setdefault("tools/call", new_histogram())
    theirs = metrics.server_time.setdefault(("tools/call", "kb"), new_histogram())
    for _ in range(count):
        _observe(own, gateway_ns)
        _observe(theirs, server_ns)


def test_the_window_counts_what_was_answered_since_the_oldest_reading() -> None:
    metrics = GatewayMetrics(MetricsConfig())
    _answered(metrics, 50, "ok", 200_000, 40_000_000)  # before anyone looked
    inside = {"now": 0}
    window = LiveWindow(metrics.totals, lambda: inside["now"])
    first = window.figures()  # the first look has no earlier reading: figures since start, and no rate
    assert first.rate is None and first.seconds == 0 and first.total == first.requests == 50
    assert (first.gateway_p50_ms, first.server_p95_ms) == (0.25, 50.0)

    _answered(metrics, 9, "ok", 80_000, 2_000_000)
    _answered(metrics, 1, "refused", 80_000, 2_000_000)
    inside["now"] = 2
    now = window.figures()
    assert now.requests == 10 and now.total == 60 and now.by_outcome == {"ok": 9, "refused": 1}
    assert now.rate is not None and now.rate > 0 and now.seconds > 0
    # the bucket bounds above 80 µs and 2 ms: the window's requests alone, not the 50 slower ones before it
    assert now.gateway_p50_ms == 0.1 and now.server_p95_ms == 2.5
    assert now.in_flight == 2


def test_readings_older_than_the_window_are_dropped() -> None:
    metrics = GatewayMetrics(MetricsConfig())
    window = LiveWindow(metrics.totals, window=0.0)
    assert window.figures().requests == 0
    _answered(metrics, 3, "ok", 1_000, 1_000)
    assert window.figures().requests == 3
    assert window.figures().requests == 0  # the window is nothing: only the last reading is kept
