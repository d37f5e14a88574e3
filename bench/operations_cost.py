"""What metrics cost per ``tools/call``: the gateway's own chain with metrics on, against the same build with them
absent (``[metrics] enabled = false``), in one run.

Both gateways are built by the composition root (``bastion.compose.build_gateway``) from one configuration that
differs only in ``[metrics]``: the default policy with its audit trail (the echo tool approved in advance, as a
client's ``autoApprove`` does) and the default guardrails. Their chains, the interceptors as built, are compiled
around a last step that answers at once instead of the router, so the difference between the two is the metrics'
meter and clock alone, not a server's pipe. Calls alternate between the two in rounds, so machine noise lands on
both; timed with the wall clock and the thread's CPU clock, and counted in Python function calls with cProfile (a
count does not drift with the machine's load). The tracing half of the issue's bench is bench/tracing_cost.py's.

Usage: .venv/bin/python bench/operations_cost.py [--calls N] [--rounds R] [--json]
Target: under 3 µs added at p50 per call.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bastion.compose import build_gateway  # noqa: E402
from bastion.config import GatewayConfig  # noqa: E402
from bastion.gateway.pipeline import Chain  # noqa: E402
from bastion.model import GatewayRequest, Identity, Session  # noqa: E402

TARGET_ADDED_P50_US = 3.0
ECHO_SERVER = Path(__file__).resolve().parent / "fixtures" / "echo_server.py"
ECHO_TOOL = {"name": "echo", "description": "Return the given text unchanged.",
             "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}
RESULT = {"content": [{"type": "text", "text": "hello"}], "isError": False}


def configuration(metrics: bool) -> GatewayConfig:
    return GatewayConfig.model_validate({
        "servers": {"echo": {"command": sys.executable, "args": [str(ECHO_SERVER)], "auto_approve": ["echo"]}},
        "tools": {"exposure": "all"}, "metrics": {"enabled": metrics}})


def instant_chain(metrics: bool) -> tuple[Any, Callable[[GatewayRequest], Any]]:
    """A gateway of the default policy and guardrails, its catalog holding the echo tool, and its chain with a last
    step that answers at once."""
    gateway = build_gateway(configuration(metrics))
    gateway.catalog.update("echo", "tools", [ECHO_TOOL])

    async def answer(message: GatewayRequest) -> dict[str, Any]:
        if message.method == "tools/list":
            return {"tools": gateway.catalog.listing("tools")}
        return dict(RESULT)

    chain = Chain(gateway.chain.interceptors, lambda raw_results: answer)
    return gateway, chain.handle


def calls(catalog: Any, count: int, session: Session) -> list[GatewayRequest]:
    return [GatewayRequest("tools/call", {"name": "echo__echo", "arguments": {"text": f"call {i}"}}, session, catalog)
            for i in range(count)]


async def time_calls(handle: Callable[[GatewayRequest], Any], batch: Sequence[GatewayRequest],
                     wall: list[float], cpu: list[float]) -> None:
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    for message in batch:
        start_cpu, start = cpu_clock(), clock()
        await handle(message)
        wall.append((clock() - start) / 1000.0)
        cpu.append((cpu_clock() - start_cpu) / 1000.0)


async def function_calls(handle: Callable[[GatewayRequest], Any], batch: Sequence[GatewayRequest]) -> float:
    """Python function calls per call, as cProfile counts them."""
    profiler = cProfile.Profile()
    profiler.enable()
    for message in batch:
        await handle(message)
    profiler.disable()
    stats = pstats.Stats(profiler)
    return stats.total_calls / len(batch)  # type: ignore[attr-defined]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(count: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_STATE_HOME"] = tmp  # the audit trail, pins and approvals of this run only
        gateways = {"absent": instant_chain(False), "on": instant_chain(True)}
        session = Session(Identity("alice", ("dev",)), "legacy", "2025-11-25", {}, {"name": "bench"}, "s1")
        for gateway, handle in gateways.values():
            # The client's list first, as a client does (pinning takes the definitions it serves), then a warm-up.
            await handle(GatewayRequest("tools/list", {}, session, gateway.catalog))
            wall: list[float] = []
            await time_calls(handle, calls(gateway.catalog, 500, session), wall, [])
            assert gateway.catalog.tool("echo__echo") is not None
        wall = {label: [] for label in gateways}
        cpu = {label: [] for label in gateways}
        gc.disable()
        try:
            for round_number in range(rounds):
                # Short batches, the order swapped each round: what the machine does meanwhile (other processes on
                # its cores) lands on both alike.
                order = list(gateways.items())
                for label, (gateway, handle) in order if round_number % 2 else reversed(order):
                    await time_calls(handle, calls(gateway.catalog, count, session), wall[label], cpu[label])
        finally:
            gc.enable()
        counted = {label: await function_calls(handle, calls(gateway.catalog, 2000, session))
                   for label, (gateway, handle) in gateways.items()}
        metrics = gateways["on"][0].metrics
        totals = metrics.totals()
        assert totals.by_outcome.get("ok", 0) >= rounds * count, totals  # the meter saw every call
        for gateway, _ in gateways.values():
            await gateway.close()
    result: dict[str, Any] = {"calls_per_gateway": rounds * count, "load_average": os.getloadavg()[0]}
    for label in gateways:
        result[f"{label}_p50_us"] = percentile(wall[label], 0.50)
        result[f"{label}_p99_us"] = percentile(wall[label], 0.99)
        result[f"{label}_cpu_p50_us"] = percentile(cpu[label], 0.50)
        result[f"{label}_function_calls"] = counted[label]
    result["added_p50_us"] = result["on_p50_us"] - result["absent_p50_us"]
    result["added_cpu_p50_us"] = result["on_cpu_p50_us"] - result["absent_cpu_p50_us"]
    result["added_p99_us"] = result["on_p99_us"] - result["absent_p99_us"]
    result["added_function_calls"] = counted["on"] - counted["absent"]
    result["target_met"] = result["added_p50_us"] < TARGET_ADDED_P50_US
    return result


def report(result: dict[str, Any]) -> None:
    print(f"metrics cost per tools/call (default policy and guardrails; {result['calls_per_gateway']} calls each; "
          f"load {result['load_average']:.2f})")
    print(f"{'':18} {'p50 µs':>9} {'p99 µs':>9} {'cpu p50 µs':>11} {'calls/call':>11}")
    for label in ("absent", "on"):
        print(f"{'metrics ' + label:18} {result[label + '_p50_us']:9.2f} {result[label + '_p99_us']:9.2f} "
              f"{result[label + '_cpu_p50_us']:11.2f} {result[label + '_function_calls']:11.1f}")
    print(f"{'added':18} {result['added_p50_us']:9.2f} {result['added_p99_us']:9.2f} "
          f"{result['added_cpu_p50_us']:11.2f} {result['added_function_calls']:11.1f}")
    verdict = "met" if result["target_met"] else "MISSED"
    print(f"target: under {TARGET_ADDED_P50_US:g} µs added at p50: {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500, help="calls per gateway per round (default 500)")
    parser.add_argument("--rounds", type=int, default=60, help="rounds, alternating the two gateways (default 60)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    options = parser.parse_args()
    if options.calls < 1 or options.rounds < 1:
        parser.error("--calls and --rounds must be at least 1")
    result = asyncio.run(run(options.calls, options.rounds))
    if options.json:
        print(json.dumps(result, indent=2))
    else:
        report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
