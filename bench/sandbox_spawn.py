"""Sandbox start-up cost: spawn -> first tools/list answer of mcp-server-time, sandboxed vs not, in one run.

Both paths go through ``bastion.sandbox.spawn`` (profile "none" and profile "default") and the same raw
JSON-RPC exchange: initialize, notifications/initialized, tools/list. Rounds alternate between the
paths so machine noise lands on both alike; only the ratio within one run means anything.
A second pair times a trivial command (``/bin/true`` to exit) to show the sandbox's own fixed cost.
Where runsc is installed, the gVisor tier (``runtime = "gvisor"``, default profile) runs in the same rounds as a
third path, so its cost is measured against bubblewrap's and no sandbox's on the same machine load.

Target: sandboxed median <= 1.15 x unsandboxed median.

Usage: .venv/bin/python bench/sandbox_spawn.py [--rounds N (30)] [--json] [--no-gvisor]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bastion.sandbox import SandboxConfig, spawn  # noqa: E402

TIME_SERVER = REPO / ".venv" / "bin" / "mcp-server-time"
TARGET_RATIO = 1.15
PROFILES = {"unsandboxed": SandboxConfig(profile="none"), "sandboxed": SandboxConfig()}
GVISOR = SandboxConfig(runtime="gvisor")


def profiles(gvisor: bool) -> dict[str, SandboxConfig]:
    return {**PROFILES, "gvisor": GVISOR} if gvisor else dict(PROFILES)


async def request(process, message_id: int, method: str, params: dict) -> dict:
    process.stdin.write(json.dumps({"jsonrpc": "2.0", "id": message_id, "method": method, "params": params}).encode()
                        + b"\n")
    await process.stdin.drain()
    while True:
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        if not line:
            raise RuntimeError(f"server exited: {process.termination_reason()}")
        reply = json.loads(line)
        if reply.get("id") == message_id:
            return reply


async def time_to_tools_list(config: SandboxConfig) -> float:
    started = time.perf_counter()
    process = await spawn("time", str(TIME_SERVER), [], {}, None, config)
    try:
        await request(process, 1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                                 "clientInfo": {"name": "bench", "version": "0"}})
        process.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        reply = await request(process, 2, "tools/list", {})
        elapsed = time.perf_counter() - started
        assert reply["result"]["tools"], reply
        return elapsed
    finally:
        await process.terminate(grace=1.0)


async def time_to_exit(config: SandboxConfig) -> float:
    started = time.perf_counter()
    process = await spawn("true", "/bin/true", [], {}, None, config)
    await process.wait()
    elapsed = time.perf_counter() - started
    await process.terminate()
    return elapsed


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": statistics.median(ordered) * 1000, "p90_ms": ordered[math.ceil(0.9 * len(ordered)) - 1] * 1000,
            "min_ms": ordered[0] * 1000}


async def measure(rounds: int, gvisor: bool = False) -> dict:
    paths = profiles(gvisor)
    for config in paths.values():  # warm caches (page cache, compiled seccomp program) for all alike
        await time_to_tools_list(config)
    tools_list: dict[str, list[float]] = {name: [] for name in paths}
    trivial: dict[str, list[float]] = {name: [] for name in paths}
    for round_number in range(rounds):
        order = list(paths) if round_number % 2 == 0 else list(reversed(paths))
        for name in order:
            tools_list[name].append(await time_to_tools_list(paths[name]))
            trivial[name].append(await time_to_exit(paths[name]))
    report = {
        "rounds": rounds,
        "tools_list": {name: summary(samples) for name, samples in tools_list.items()},
        "trivial_command": {name: summary(samples) for name, samples in trivial.items()},
    }
    report["ratio"] = report["tools_list"]["sandboxed"]["median_ms"] / report["tools_list"]["unsandboxed"]["median_ms"]
    # Each round ran both paths back to back: the median of per-round ratios cancels slow drifts in load.
    report["paired_ratio"] = statistics.median(
        sandboxed / plain for sandboxed, plain in zip(tools_list["sandboxed"], tools_list["unsandboxed"], strict=True))
    report["sandbox_fixed_cost_ms"] = (report["trivial_command"]["sandboxed"]["median_ms"]
                                       - report["trivial_command"]["unsandboxed"]["median_ms"])
    if gvisor:
        report["gvisor"] = {
            "ratio_to_unsandboxed": report["tools_list"]["gvisor"]["median_ms"]
            / report["tools_list"]["unsandboxed"]["median_ms"],
            "ratio_to_bubblewrap": report["tools_list"]["gvisor"]["median_ms"]
            / report["tools_list"]["sandboxed"]["median_ms"],
            "paired_ratio_to_bubblewrap": statistics.median(
                g / b for g, b in zip(tools_list["gvisor"], tools_list["sandboxed"], strict=True)),
            "fixed_cost_ms": (report["trivial_command"]["gvisor"]["median_ms"]
                              - report["trivial_command"]["unsandboxed"]["median_ms"]),
        }
    report["target_ratio"] = TARGET_RATIO
    report["meets_target"] = report["ratio"] <= TARGET_RATIO
    return report


def print_report(report: dict) -> None:
    out = sys.stderr
    print(f"mcp-server-time, spawn -> first tools/list answer ({report['rounds']} rounds, alternating):", file=out)
    for name, figures in report["tools_list"].items():
        print(f"  {name:12s} median {figures['median_ms']:8.1f} ms   p90 {figures['p90_ms']:8.1f} ms   "
              f"min {figures['min_ms']:8.1f} ms", file=out)
    print(f"  ratio of medians sandboxed / unsandboxed: {report['ratio']:.3f}x (target <= {TARGET_RATIO}x: "
          f"{'met' if report['meets_target'] else 'NOT met'})", file=out)
    print(f"  median of per-round ratios: {report['paired_ratio']:.3f}x", file=out)
    print("/bin/true, spawn -> exit:", file=out)
    for name, figures in report["trivial_command"].items():
        print(f"  {name:12s} median {figures['median_ms']:8.1f} ms", file=out)
    print(f"  sandbox fixed cost: {report['sandbox_fixed_cost_ms']:.1f} ms", file=out)
    if "gvisor" in report:
        figures = report["gvisor"]
        print(f"gVisor (runsc): first answer {figures['ratio_to_unsandboxed']:.3f}x unsandboxed, "
              f"{figures['ratio_to_bubblewrap']:.3f}x bubblewrap (per round {figures['paired_ratio_to_bubblewrap']:.3f}x);"
              f" fixed cost {figures['fixed_cost_ms']:.1f} ms", file=out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON on stdout")
    parser.add_argument("--no-gvisor", action="store_true", help="leave the gVisor tier out even where runsc is")
    args = parser.parse_args()
    if not TIME_SERVER.exists():
        print(f"{TIME_SERVER} is missing: install the dev dependencies (mcp-server-time)", file=sys.stderr)
        return 2
    # Profile "none" warns at every start by design; forty identical warnings would bury the figures.
    logging.getLogger("bastion.sandbox").setLevel(logging.ERROR)
    gvisor = not args.no_gvisor and shutil.which("runsc") is not None
    if not gvisor and not args.no_gvisor:
        print("runsc is not on PATH: the gVisor tier is left out", file=sys.stderr)
    report = asyncio.run(measure(args.rounds, gvisor))
    print_report(report)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
