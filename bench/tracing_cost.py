"""The cost per ``tools/call`` of tracing when it is off, against the same build with tracing absent, in one run.

One process builds the gateway of a plain ``mcpServers`` file as users run it (the default policy with its audit
trail, the default guardrails; ``autoApprove`` lets echo run without asking) and drives calls through its chain,
whose last step answers at once, so what differs is the chain alone. Three chains over the same interceptors:

- absent: the chain as compiled before tracing existed (``bastion/gateway/pipeline.py`` at ``BEFORE_TRACING``, read
  from git): no observer to ask about, ever;
- off: the chain as ``build_gateway`` compiles it without a ``[tracing]`` table (what every user without tracing
  runs);
- on: with tracing on, spans batched to an exporter that drops them (the cost of recording, not of sending).

Rounds alternate between the chains so the machine's noise lands on all; a round's figure is its mean per call, and
the result is the median round. Function calls per call are counted with cProfile, as bench/call_count.py does
(a count, not a time: it does not drift with the machine's load). Whether OpenTelemetry was imported before the
"on" chain was built is checked in ``sys.modules``.

The router is not in this chain: with tracing off it is built exactly as before (``Router`` wraps its call to a
server only when given an observer), and bench/call_count.py counts the whole path of a real ``bastion run``.

Usage: .venv/bin/python bench/tracing_cost.py [--calls N] [--rounds R] [--json]
Target: tracing off under 1 µs per call (issue 30).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import importlib.util
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BEFORE_TRACING = "c348b81"  # the last commit of main before tracing: its pipeline.py has no observer
TARGET_OFF_US = 1.0
ECHO = {"name": "echo", "description": "Echo text back",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}
ANSWER = {"content": [{"type": "text", "text": "hello"}]}


def chain_before_tracing() -> Any:
    """The ``Chain`` class of ``BEFORE_TRACING``: the same build's chain with tracing absent."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE_TRACING}:bastion/gateway/pipeline.py"],
                            capture_output=True, text=True, check=True).stdout
    assert "observer" not in source
    spec = importlib.util.spec_from_loader("pipeline_before_tracing", loader=None)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  # dataclasses look their module up there
    exec(compile(source, "pipeline_before_tracing.py", "exec"), module.__dict__)  # noqa: S102 - our own history
    return module.Chain


def build(workdir: Path) -> Any:
    from bastion.compose import build_gateway
    from bastion.config import load_config

    config_file = workdir / "mcp.json"
    config_file.write_text('{"mcpServers": {"echo": {"command": "true", "autoApprove": ["echo"]}}}')
    gateway = build_gateway(load_config(config_file))
    gateway.catalog.update("echo", "tools", [ECHO])
    return gateway


def chains(gateway: Any) -> dict[str, Any]:
    from bastion.gateway.pipeline import Chain

    async def answer(message: Any) -> dict[str, Any]:
        return ANSWER

    def terminal(raw_results: bool) -> Any:
        return answer

    interceptors = gateway.chain.interceptors
    built = {"absent": chain_before_tracing()(interceptors, terminal), "off": Chain(interceptors, terminal)}
    built["otel_imported_when_off"] = any(name.startswith("opentelemetry") for name in sys.modules)
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from bastion.observability.tracing import Tracing, build_provider
    from bastion.observability.tracing_config import TracingConfig

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracing = Tracing(build_provider(TracingConfig(), Dropped()))
    built["on"] = Chain(interceptors, terminal, tracing)
    built["tracing"] = tracing
    return built


def message(gateway: Any, session: Any, method: str, params: dict[str, Any]) -> Any:
    from bastion.model import GatewayRequest

    return GatewayRequest(method, params, session, gateway.catalog, request_id=1)


async def run_calls(chain: Any, gateway: Any, session: Any, calls: int) -> None:
    handle = chain.handle
    for index in range(calls):
        await handle(message(gateway, session, "tools/call", {"name": "echo", "arguments": {"text": f"call {index}"}}))


async def per_call_ns(chain: Any, gateway: Any, session: Any, calls: int) -> float:
    gc.collect()
    started = time.perf_counter_ns()
    await run_calls(chain, gateway, session, calls)
    return (time.perf_counter_ns() - started) / calls


async def calls_counted(chain: Any, gateway: Any, session: Any, calls: int) -> float:
    profile = cProfile.Profile()
    profile.enable()
    await run_calls(chain, gateway, session, calls)
    profile.disable()
    return pstats.Stats(profile).total_calls / calls  # type: ignore[attr-defined]


async def measure(calls: int, rounds: int) -> dict[str, Any]:
    from bastion.model import Session

    with tempfile.TemporaryDirectory(prefix="bastion-tracing-cost-") as tmp:
        os.environ["XDG_STATE_HOME"] = tmp
        gateway = build(Path(tmp))
        session = Session(gateway.identity, "legacy", "2025-11-25", {}, None, "bench")
        built = chains(gateway)
        names = ("absent", "off", "on")
        try:
            for name in names:  # pins the definition, warms every route
                await built[name].handle(message(gateway, session, "tools/list", {}))
                await run_calls(built[name], gateway, session, 200)
            counts = {name: await calls_counted(built[name], gateway, session, calls) for name in names}
            timings: dict[str, list[float]] = {name: [] for name in names}
            for round_index in range(rounds):
                order = names if round_index % 2 == 0 else tuple(reversed(names))
                for name in order:
                    timings[name].append(await per_call_ns(built[name], gateway, session, calls))
        finally:
            await built["tracing"].aclose()
            await gateway.close()
    median = {name: statistics.median(values) / 1000 for name, values in timings.items()}
    off_added = median["off"] - median["absent"]
    return {
        "calls": calls, "rounds": rounds,
        "us_per_call": {name: round(value, 2) for name, value in median.items()},
        "calls_per_call": {name: round(value, 1) for name, value in counts.items()},
        "off_added_us": round(off_added, 3), "on_added_us": round(median["on"] - median["absent"], 2),
        "otel_imported_when_off": built["otel_imported_when_off"],
        "target_off_us": TARGET_OFF_US, "met": off_added < TARGET_OFF_US and not built["otel_imported_when_off"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(measure(args.calls, args.rounds))
    if args.json:
        import orjson

        print(orjson.dumps(figures).decode())
        return
    us, counted = figures["us_per_call"], figures["calls_per_call"]
    print(f"tools/call through the chain, default policy and guardrails ({args.calls} calls x {args.rounds} rounds, "
          "median round):")
    for name in ("absent", "off", "on"):
        print(f"  tracing {name:6} {us[name]:8.2f} µs/call   {counted[name]:7.1f} function calls/call")
    print(f"  off - absent: {figures['off_added_us']:+.3f} µs/call (target < {TARGET_OFF_US} µs: "
          f"{'met' if figures['met'] else 'NOT met'}); OpenTelemetry imported while off: "
          f"{figures['otel_imported_when_off']}")


if __name__ == "__main__":
    main()
