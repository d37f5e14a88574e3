"""Live request rate and latency for the console, from the gateway's own metrics (``GatewayMetrics.totals``).

The metrics count since the gateway started; what is live is the difference between now and a reading some seconds
ago. ``LiveWindow`` keeps the readings of the last ``window`` seconds (one per look at the page, so it costs the
gateway nothing while nobody looks) and gives the rate, the outcomes and the latency quantiles of the requests
answered between the oldest of them and now. Quantiles are bucket bounds, as Prometheus's would be.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

WINDOW_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class LiveFigures:
    """What the live page shows: over the last ``seconds`` (0 at the first look: since the gateway started)."""

    seconds: float
    rate: float | None  # requests per second over the window; None at the first look
    requests: int  # answered in the window
    by_outcome: Mapping[str, int]  # of those
    total: int  # answered since the gateway started
    in_flight: int  # inside the gateway now
    gateway_p50_ms: float | None  # the gateway's own time per request (without the server's)
    gateway_p95_ms: float | None
    server_p50_ms: float | None  # the time requests spent with their servers
    server_p95_ms: float | None


def _quantile(now: Any, before: Any, q: float) -> float | None:
    """The ``q`` quantile, in ms, of the requests observed between two cumulative readings of one histogram."""
    earlier = dict(before.buckets) if before is not None else {}
    buckets = [(bound, count - earlier.get(bound, 0)) for bound, count in now.buckets]
    count = buckets[-1][1] if buckets else 0
    if count <= 0:
        return None
    wanted = q * count
    for bound, cumulative in buckets:
        if cumulative >= wanted:
            return bound * 1000.0
    return None


class LiveWindow:
    """Readings of the gateway's totals over the last ``window`` seconds; ``read`` is ``GatewayMetrics.totals``
    (its ``at`` is monotonic time) and ``in_flight`` the requests inside the gateway now."""

    def __init__(self, read: Callable[[], Any], in_flight: Callable[[], int] = lambda: 0,
                 window: float = WINDOW_SECONDS, most: int = 600) -> None:
        self._read, self._in_flight, self._window = read, in_flight, window
        self._readings: collections.deque[Any] = collections.deque(maxlen=most)
        self._lock = threading.Lock()  # pages render on worker threads

    def figures(self) -> LiveFigures:
        now = self._read()
        with self._lock:
            readings = self._readings
            # The oldest reading kept is the last one at least a window old, so a window is always covered.
            while len(readings) > 1 and now.at - readings[1].at >= self._window:
                readings.popleft()
            before = readings[0] if readings else None
            readings.append(now)
        seconds = now.at - before.at if before is not None else 0.0
        requests = now.requests - (before.requests if before is not None else 0)
        outcomes = {outcome: count - (before.by_outcome.get(outcome, 0) if before is not None else 0)
                    for outcome, count in now.by_outcome.items()}
        return LiveFigures(
            seconds=seconds,
            rate=requests / seconds if seconds > 0 else None,
            requests=requests,
            by_outcome={k: v for k, v in outcomes.items() if v},
            total=now.requests,
            in_flight=self._in_flight(),
            gateway_p50_ms=_quantile(now.gateway_latency, before and before.gateway_latency, 0.5),
            gateway_p95_ms=_quantile(now.gateway_latency, before and before.gateway_latency, 0.95),
            server_p50_ms=_quantile(now.server_latency, before and before.server_latency, 0.5),
            server_p95_ms=_quantile(now.server_latency, before and before.server_latency, 0.95),
        )
