"""Live request rate and latency: a page whose small script (no library, nothing fetched but the console's own
JSON) polls ``live.json`` every few seconds and redraws the figures and a sparkline of the rate. Without the
script the page shows the figures as they were when it was served."""

from __future__ import annotations

from html import escape
from typing import Any, Mapping

POLL_SECONDS = 2
HISTORY = 60  # points of the sparkline: two minutes at the poll interval

# Served as its own file (the console's pages allow no inline script): reads the JSON, writes text and an SVG path,
# never HTML, so nothing in the figures can become markup.
SCRIPT = """
"use strict";
(function () {
  const root = document.getElementById("live");
  if (!root) return;
  const source = root.dataset.source, every = Number(root.dataset.poll) * 1000, keep = Number(root.dataset.keep);
  const rates = [];
  const show = (name, text) => { const cell = root.querySelector('[data-figure="' + name + '"]'); if (cell) cell.textContent = text; };
  const ms = (value) => value === null || value === undefined ? "-" : value.toFixed(1) + " ms";
  function draw() {
    const line = document.getElementById("rate-line");
    if (!line || rates.length < 2) return;
    const top = Math.max(1, ...rates);
    line.setAttribute("d", rates.map((rate, i) => (i ? "L" : "M") + (i * 300 / (keep - 1)).toFixed(1) + " " +
      (60 - rate * 58 / top).toFixed(1)).join(" "));
  }
  function servers(rows) {
    const body = document.getElementById("live-servers");
    if (!body) return;
    body.replaceChildren(...rows.map((row) => {
      const tr = document.createElement("tr");
      for (const text of [row.server, row.rate.toFixed(2) + "/s", ms(row.p50_ms), ms(row.p95_ms), String(row.in_flight)]) {
        const td = document.createElement("td"); td.textContent = text; tr.append(td);
      }
      return tr;
    }));
  }
  async function poll() {
    try {
      const answer = await fetch(source, {credentials: "same-origin", headers: {"Accept": "application/json"}});
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      const live = await answer.json();
      show("rate", live.rate.toFixed(2) + " calls/s");
      show("p50", ms(live.p50_ms)); show("p95", ms(live.p95_ms)); show("in_flight", String(live.in_flight));
      show("total", String(live.total));
      rates.push(live.rate); if (rates.length > keep) rates.shift();
      draw(); servers(live.servers || []);
      root.dataset.updated = String(live.at); root.classList.remove("stale");
    } catch (error) {
      root.classList.add("stale"); show("status", "not updated: " + error.message);
      return;
    }
    show("status", "updated every " + every / 1000 + " s");
  }
  poll(); setInterval(poll, every);
})();
"""


def _ms(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f} ms"


def render(live: Mapping[str, Any], source: str, script: str) -> str:
    """The page's body with the figures of ``live`` (``snapshot``'s shape); ``source``: the JSON's URL;
    ``script``: the script's URL."""
    rows = "".join(
        f"<tr><td>{escape(str(row['server']))}</td><td>{row['rate']:.2f}/s</td><td>{_ms(row['p50_ms'])}</td>"
        f"<td>{_ms(row['p95_ms'])}</td><td>{row['in_flight']}</td></tr>" for row in live.get("servers", []))
    return (
        "<h1>Live requests</h1>"
        f'<section id=live data-source="{escape(source)}" data-poll="{POLL_SECONDS}" data-keep="{HISTORY}">'
        "<dl class=figures>"
        f'<div><dt>Rate</dt><dd data-figure=rate data-testid=rate>{live["rate"]:.2f} calls/s</dd></div>'
        f'<div><dt>Latency p50</dt><dd data-figure=p50>{_ms(live["p50_ms"])}</dd></div>'
        f'<div><dt>Latency p95</dt><dd data-figure=p95>{_ms(live["p95_ms"])}</dd></div>'
        f'<div><dt>In flight</dt><dd data-figure=in_flight>{live["in_flight"]}</dd></div>'
        f'<div><dt>Requests since start</dt><dd data-figure=total data-testid=total>{live["total"]}</dd></div>'
        "</dl>"
        '<svg class=spark viewBox="0 0 300 60" width=300 height=60 role=img aria-label="request rate, last two '
        'minutes"><path id=rate-line d="" fill=none stroke=currentColor stroke-width=1.5></path></svg>'
        "<table class=live><thead><tr><th>Server</th><th>Rate</th><th>p50</th><th>p95</th><th>In flight</th></tr>"
        f"</thead><tbody id=live-servers>{rows}</tbody></table>"
        "<p class=status data-figure=status>figures as served; the page updates them when scripts run</p>"
        f'</section><script src="{escape(script)}" defer></script>'
    )
