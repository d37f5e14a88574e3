"""Live request rate and latency: the figures of the last minute from the gateway's own metrics, refreshed in the
page by a small script of the console's (``/admin/static/live.js``: it reads this page again every few seconds;
nothing is fetched from anywhere else). Only ``bastion serve --http`` has them: the console runs inside that gateway;
``bastion console`` is a process apart from the gateways it shows, which expose theirs on ``[metrics] listen``."""

from __future__ import annotations

import asyncio
from importlib import resources

from bastion.console.live import LiveFigures
from bastion.console.markup import Html, tag
from bastion.console.registry import Asset, Page, View

POLL_SECONDS = 2
HISTORY = 60  # readings drawn: two minutes at the poll interval


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g} ms" if value < 1 else f"{value:.0f} ms"


def _rate(figures: LiveFigures) -> str:
    return "- (first reading)" if figures.rate is None else f"{figures.rate:.2f} requests/s"


async def render(view: View) -> Html:
    window = view.data.live_window()
    if window is None:
        return tag("p", "Live figures come from the gateway's own metrics, which only the console of bastion serve "
                        "--http has (it runs inside the gateway), and only with [metrics] enabled. A gateway started "
                        "by a client (bastion run) exposes them on its [metrics] listen address, for Prometheus.",
                   class_="empty")
    figures = await asyncio.to_thread(window.figures)
    outcomes = ", ".join(f"{outcome} {count}" for outcome, count in sorted(figures.by_outcome.items())) or "none"

    def figure(label: str, name: str, text: str) -> Html:
        return tag("div", tag("dt", label), tag("dd", text, data_figure=name, data_testid=f"live-{name}"))

    rate = "" if figures.rate is None else f"{figures.rate:.4f}"
    return tag("section",
               tag("dl", figure("Request rate", "rate", _rate(figures)),
                   figure("Window", "window", f"last {figures.seconds:.0f} s" if figures.seconds else
                          "since the gateway started (first reading)"),
                   figure("Answered in the window", "requests", str(figures.requests)),
                   figure("Outcomes", "outcomes", outcomes),
                   figure("Gateway time p50", "gateway-p50", _ms(figures.gateway_p50_ms)),
                   figure("Gateway time p95", "gateway-p95", _ms(figures.gateway_p95_ms)),
                   figure("Server time p50", "server-p50", _ms(figures.server_p50_ms)),
                   figure("Server time p95", "server-p95", _ms(figures.server_p95_ms)),
                   figure("Calls in the gateway now", "in-flight", str(figures.in_flight)),
                   figure("Answered since start", "total", str(figures.total)), class_="figures"),
               Html('<svg class="spark" viewBox="0 0 300 60" width="300" height="60" role="img" '
                    'aria-label="request rate, last two minutes"><path id="rate-line" d="" fill="none" '
                    'stroke="currentColor" stroke-width="1.5"></path></svg>'),
               tag("p", "the page updates these figures while scripts run", id="live-state", class_="muted"),
               tag("script", src="/admin/static/live.js", defer=True),
               id="live", data_poll=str(POLL_SECONDS), data_keep=str(HISTORY), data_rate=rate)


PAGES = (Page("live", "Live", render),)
ACTS = ()
# The console's one script; the Content-Security-Policy runs no other and nothing inline.
ASSETS = (Asset("live.js", "text/javascript; charset=utf-8",
                resources.files("bastion.console").joinpath("live.js").read_bytes()),)
