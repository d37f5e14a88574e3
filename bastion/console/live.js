"use strict";
// The live page refreshes its own figures: every few seconds it reads the page again (same origin, its session's
// cookie), copies the text of each figure across, and draws the request rate of the readings it has seen. It writes
// text and an SVG path only, never markup, so nothing the gateway counted can become part of the page.
(function () {
  const live = document.getElementById("live");
  if (!live) return;
  const every = Number(live.dataset.poll || "2") * 1000, keep = Number(live.dataset.keep || "60");
  const rates = [];
  function draw() {
    const line = document.getElementById("rate-line");
    if (!line || rates.length < 2) return;
    const top = Math.max(1, ...rates);
    line.setAttribute("d", rates.map((rate, i) => (i ? "L" : "M") + (i * 300 / (keep - 1)).toFixed(1) + " " +
      (58 - rate * 56 / top).toFixed(1)).join(" "));
  }
  function take(fresh) {
    for (const figure of live.querySelectorAll("[data-figure]")) {
      const source = fresh.querySelector('[data-figure="' + figure.dataset.figure + '"]');
      if (source) figure.textContent = source.textContent;
    }
    const rate = Number((fresh.getElementById("live") || live).dataset.rate);
    if (Number.isFinite(rate)) { rates.push(rate); if (rates.length > keep) rates.shift(); draw(); }
    live.dataset.updated = String(Date.now());
  }
  async function poll() {
    const state = document.getElementById("live-state");
    try {
      const answer = await fetch(location.pathname, {credentials: "same-origin", redirect: "error"});
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      take(new DOMParser().parseFromString(await answer.text(), "text/html"));
      if (state) state.textContent = "updated every " + every / 1000 + " s";
    } catch (error) {
      if (state) state.textContent = "not updated: " + error.message;
    }
  }
  const first = Number(live.dataset.rate);
  if (Number.isFinite(first)) rates.push(first);
  setInterval(poll, every);
})();
