"""What the content guardrails cost: added time per tools/call with every default guardrail on, against the same call
with them off, for a small result and for a 1 MB one, in one run.

Paths, driven by the data-plane benchmark's raw client (bench/dataplane_client.py) to one server
(bench/fixtures/sized_server.py) whose tool answers N characters of the standard library's source:

  direct         client -> sized server                                       (context: the server alone)
  guardrails-on  client -> `bastion run` (guardrails as they come, policy off) -> sized server
  guardrails-off client -> `bastion run` (guardrails = "off", policy off)    -> sized server
  scanning-only  the same with every guardrail off but secrets and pii       (the scanner's share, end to end)

The policy is off on both Bastion paths so the difference is the guardrails alone. The rounds alternate between the
paths so machine noise lands on all of them alike; only differences taken within one run mean anything. Beside the
end-to-end figures, the scanner of secrets and personal data is timed in process on the same texts, to show its
share. Targets (issue 19): at most 50 µs added at p50 for a small result, at most 10 ms for 1 MB; (issue 27)
at most 20 µs of added CPU in Bastion's process per call for a small result, 10 ms for 1 MB.

Usage: .venv/bin/python bench/guardrails.py [--quick] [--json] [--small-calls N] [--large-calls N] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataplane_client import McpPipeClient  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SIZED_SERVER = BENCH_DIR / "fixtures" / "sized_server.py"
SMALL = 200  # characters: a short answer (a status line, a few fields)
LARGE = 1_048_576  # 1 MB
TARGET_SMALL_US = 50.0
TARGET_LARGE_MS = 10.0
TARGET_CPU_SMALL_US = 20.0  # added CPU of Bastion's process per call (issue 27)
HANDSHAKE_TIMEOUT_S = 60.0
PATHS = ("direct", "guardrails-on", "guardrails-off", "scanning-only")
ONLY_SCANNING = {"pinning": "off", "metadata_injection": "off", "output_injection": "off", "taint": "off",
                 "sampling": "off", "deputy": "off"}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def config_file(workdir: Path, name: str, python: str, guardrails: Any) -> Path:
    top: dict[str, Any] = {"policy": "off", "servers": {"sized": {"command": python, "args": [str(SIZED_SERVER)]}}}
    if guardrails is not None:
        top["guardrails"] = guardrails
    path = workdir / name
    path.write_bytes(orjson.dumps(top))
    return path


def commands(python: str, bastion: str, workdir: Path) -> dict[str, list[str]]:
    return {
        "direct": [python, str(SIZED_SERVER)],
        "guardrails-on": [bastion, "run", str(config_file(workdir, "on.json", python, None))],
        "guardrails-off": [bastion, "run", str(config_file(workdir, "off.json", python, "off"))],
        "scanning-only": [bastion, "run", str(config_file(workdir, "scanning.json", python, ONLY_SCANNING))],
    }


async def timed_read(client: McpPipeClient, tool: str, size: int) -> int:
    started = time.perf_counter_ns()
    result = await client.request("tools/call", {"name": tool, "arguments": {"size": size}})
    elapsed = time.perf_counter_ns() - started
    text = result["content"][0]["text"]
    # The source names its authors' e-mail addresses, which the guardrails redact: about the same length back.
    if abs(len(text) - size) > size // 100 + 64:
        raise RuntimeError(f"{tool} answered {len(text)} characters instead of about {size}: {text[:200]!r}")
    return elapsed


@contextlib.contextmanager
def collector_paused():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def measure(options: argparse.Namespace,
                  workdir: Path) -> tuple[dict[str, dict[str, list[int]]], dict[str, dict[str, float]]]:
    argv = commands(options.python, options.bastion, workdir)
    env = {**os.environ, "XDG_STATE_HOME": str(workdir / "state"), "XDG_CACHE_HOME": str(workdir / "cache")}
    clients: dict[str, tuple[McpPipeClient, str]] = {}
    timings: dict[str, dict[str, list[int]]] = {path: {"small": [], "large": []} for path in PATHS}
    # CPU time of the process on each path (Bastion's, or the server's on the direct one), which a busy machine
    # disturbs far less than the wall time of a call.
    cpu: dict[str, dict[str, float]] = {path: {"small": 0.0, "large": 0.0} for path in PATHS}
    logs = contextlib.ExitStack()
    try:
        for path in PATHS:
            stderr = logs.enter_context(open(workdir / f"{path}.log", "wb"))
            process = await asyncio.create_subprocess_exec(
                *argv[path], stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
                limit=1 << 25, cwd=REPO_ROOT, env=env, start_new_session=True)
            client = McpPipeClient(process)
            await asyncio.wait_for(client.handshake(), HANDSHAKE_TIMEOUT_S)
            names = await asyncio.wait_for(client.tool_names(), HANDSHAKE_TIMEOUT_S)
            (tool,) = [name for name in names if name.endswith("read")]
            clients[path] = (client, tool)
            for _ in range(options.warmup):  # the first calls fill caches on every side
                await timed_read(client, tool, SMALL)
                await timed_read(client, tool, LARGE)
        for round_number in range(options.rounds):
            log(f"round {round_number + 1}/{options.rounds}")
            for path in PATHS:
                client, tool = clients[path]
                with collector_paused():
                    for size, label, calls in ((SMALL, "small", options.small_calls),
                                               (LARGE, "large", options.large_calls)):
                        before = client.cpu_seconds() or 0.0
                        for _ in range(calls):
                            timings[path][label].append(await timed_read(client, tool, size))
                        cpu[path][label] += (client.cpu_seconds() or 0.0) - before
    finally:
        for client, _ in clients.values():
            await client.close()
        logs.close()
    return timings, cpu


def scanner_in_process(repeat: int) -> dict[str, float]:
    """The secret and personal-data scanner alone on the same texts (median of ``repeat``), in µs and ms."""
    sys.path.insert(0, str(SIZED_SERVER.parent))
    from sized_server import corpus

    from bastion.guardrails.config import GuardrailsConfig
    from bastion.guardrails.content import text_slots
    from bastion.guardrails.scanning import ScanningPolicy, default_scanner

    scanner = default_scanner()
    action = ScanningPolicy(GuardrailsConfig()).action_for(None)
    figures = {}
    for label, size in (("small_us", SMALL), ("large_ms", LARGE)):
        text = corpus(size)
        samples = []
        for _ in range(repeat):
            result = {"content": [{"type": "text", "text": text}], "isError": False}
            started = time.perf_counter_ns()
            hits = scanner.scan(text_slots("tools/call", result), action)
            samples.append(time.perf_counter_ns() - started)
        figures[label] = statistics.median(samples) / (1e3 if label == "small_us" else 1e6)
        figures[label.split("_")[0] + "_findings"] = len(hits)
    return figures


def guardrails_in_the_chain() -> list[str]:
    """The guardrails a default configuration builds, by module, in chain order."""
    from bastion.guardrails.chain import inner_builders, screen_builders

    return [builder.__module__.rsplit(".", 1)[-1] for builder in [*screen_builders(), *inner_builders()]]


def summary(timings: dict[str, dict[str, list[int]]], cpu: dict[str, dict[str, float]]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for path, sizes in timings.items():
        figures[path] = {size: {"p50_ms": statistics.median(values) / 1e6,
                                "p90_ms": sorted(values)[int(len(values) * 0.9)] / 1e6, "calls": len(values),
                                "cpu_ms_per_call": cpu[path][size] * 1e3 / len(values) if values else None}
                         for size, values in sizes.items()}
    added_small_us = (figures["guardrails-on"]["small"]["p50_ms"] - figures["guardrails-off"]["small"]["p50_ms"]) * 1e3
    added_large_ms = figures["guardrails-on"]["large"]["p50_ms"] - figures["guardrails-off"]["large"]["p50_ms"]
    scanning = {size: (figures["scanning-only"][size]["p50_ms"] - figures["guardrails-off"][size]["p50_ms"])
                for size in ("small", "large")}
    cpu_added = {size: (figures["guardrails-on"][size]["cpu_ms_per_call"] - figures["guardrails-off"][size]["cpu_ms_per_call"])
                 for size in ("small", "large")}
    return {"paths": figures, "added_small_us": added_small_us, "added_large_ms": added_large_ms,
            "cpu_added_small_us": cpu_added["small"] * 1e3, "cpu_added_large_ms": cpu_added["large"],
            "scanning_added_small_us": scanning["small"] * 1e3, "scanning_added_large_ms": scanning["large"],
            "targets": [
                {"name": "added p50, small result", "value": f"{added_small_us:.1f} µs",
                 "target": f"<= {TARGET_SMALL_US:.0f} µs", "met": added_small_us <= TARGET_SMALL_US},
                {"name": "added p50, 1 MB result", "value": f"{added_large_ms:.2f} ms",
                 "target": f"<= {TARGET_LARGE_MS:.0f} ms", "met": added_large_ms <= TARGET_LARGE_MS},
            ],
            "cpu_targets": [
                {"name": "added CPU per call, small result", "value": f"{cpu_added['small'] * 1e3:.1f} µs",
                 "target": f"<= {TARGET_CPU_SMALL_US:.0f} µs", "met": cpu_added["small"] * 1e3 <= TARGET_CPU_SMALL_US},
                {"name": "added CPU per call, 1 MB result", "value": f"{cpu_added['large']:.2f} ms",
                 "target": f"<= {TARGET_LARGE_MS:.0f} ms", "met": cpu_added["large"] <= TARGET_LARGE_MS},
            ]}


def render(report: dict[str, Any]) -> str:
    lines = [f"guardrails in the chain: {', '.join(report['guardrails'])}", "",
             "| path | small p50 | small p90 | small CPU/call | 1 MB p50 | 1 MB p90 | 1 MB CPU/call |",
             "|---|---|---|---|---|---|---|"]
    for path, sizes in report["paths"].items():
        small, large = sizes["small"], sizes["large"]
        lines.append(f"| {path} | {small['p50_ms']:.3f} ms | {small['p90_ms']:.3f} ms | {small['cpu_ms_per_call']:.3f} ms | "
                     f"{large['p50_ms']:.2f} ms | {large['p90_ms']:.2f} ms | {large['cpu_ms_per_call']:.2f} ms |")
    lines += ["", "| target | measured | goal | met |", "|---|---|---|---|"]
    for row in [*report["targets"], *report["cpu_targets"]]:
        lines.append(f"| {row['name']} | {row['value']} | {row['target']} | {'yes' if row['met'] else 'no'} |")
    scanner = report["scanner"]
    lines += ["", f"added CPU per call, guardrails on against off: {report['cpu_added_small_us']:.1f} µs small, "
                  f"{report['cpu_added_large_ms']:.2f} ms for 1 MB"]
    lines += ["", f"secrets and pii alone, end to end: {report['scanning_added_small_us']:.1f} µs small, "
                  f"{report['scanning_added_large_ms']:.2f} ms for 1 MB"]
    lines += ["", f"secret and personal-data scanner alone, in process: {scanner['small_us']:.1f} µs small, "
                  f"{scanner['large_ms']:.2f} ms for 1 MB ({scanner['large_findings']} findings in it: its authors' "
                  f"e-mail addresses)",
              f"({report['machine']}; {report['small_calls']} small and {report['large_calls']} large calls per path)"]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (for tests): few calls and one round")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of tables")
    parser.add_argument("--small-calls", type=int, default=None, help="small calls per path and round (400)")
    parser.add_argument("--large-calls", type=int, default=None, help="1 MB calls per path and round (20)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (5; 1 with --quick)")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the server")
    parser.add_argument("--bastion", default=str(Path(sys.executable).parent / "bastion"), help="the bastion script")
    options = parser.parse_args(argv)
    options.small_calls = options.small_calls or (20 if options.quick else 400)
    options.large_calls = options.large_calls or (2 if options.quick else 20)
    options.rounds = options.rounds or (1 if options.quick else 5)
    options.warmup = 3 if options.quick else 20
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bastion-bench-guardrails-") as workdir:
        timings, cpu = asyncio.run(measure(options, Path(workdir)))
    report = summary(timings, cpu)
    report.update(guardrails=guardrails_in_the_chain(), scanner=scanner_in_process(5 if options.quick else 50),
                  machine=f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                  small_calls=options.small_calls * options.rounds, large_calls=options.large_calls * options.rounds)
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() if options.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
