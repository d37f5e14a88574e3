"""Data-plane latency benchmark: what one Bastion hop costs, against a floor and a peer, in one run.

Paths, all driven by the same raw JSON-RPC client (bench/dataplane_client.py) to the same minimal echo
server (bench/fixtures/echo_server.py):

  direct    client -> echo server
  relay     client -> minimal parse-and-forward relay -> echo server       (the floor for a Python hop)
  bastion   client -> `bastion run CONFIG` -> echo server   (a plain mcpServers file: the default policy, its
            audit and the default guardrails on, as users run it; the client file's autoApprove lets echo run
            without asking)
  bastion-off  the same with policy = "off" and guardrails = "off": no policy, no audit, no guardrails (the
            shortest path through Bastion, for comparison)
  fastmcp   client -> FastMCP's stdio proxy -> echo server                  (the peer)

Each path gets a legacy handshake, a warm-up, N sequential tools/call and N calls with 32 in flight.
The rounds alternate between paths so that machine noise lands on all of them alike. Only ratios taken
within one run are meaningful; absolute times drift between runs and machines.

Usage: .venv/bin/python bench/dataplane.py [--calls N] [--quick] [--paths direct,relay,...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import os
import platform
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, IO

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataplane_client import CallTiming, McpPipeClient  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
FIXTURES = BENCH_DIR / "fixtures"
ECHO_SERVER = FIXTURES / "echo_server.py"
ALL_PATHS = ("direct", "relay", "bastion", "bastion-off", "fastmcp")
OPTIONAL_PATHS = ("bastion", "bastion-off", "fastmcp")  # these may fail to start; the rest of the run goes on without them
WINDOW = 32
RSS_SERVER_COUNT = 10
HANDSHAKE_TIMEOUT_S = 30.0
MB = 1024 * 1024

# Targets from the project's performance goals, each checked against figures from the same run.
# Issue 18's targets, on the path users run (policy on): added latency per call at most 0.6x the minimal relay's and
# at most 1/20 of FastMCP's, and with 32 in flight at least 0.7x direct throughput.
TARGET_ADDED_VS_RELAY = 0.6
TARGET_ADDED_VS_FASTMCP = 0.05
TARGET_THROUGHPUT_VS_DIRECT = 0.7
TARGET_IDLE_RSS_MB = 80.0


# ----------------------------------------------------------------------------------------------------
# Paths
# ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PathSpec:
    name: str
    argv: list[str]
    tool: str  # what the echo tool is called on this path (Bastion prefixes it with the server name)


def mcp_servers_config(python: str, names: list[str], *, policy_off: bool = False) -> bytes:
    """A plain ``mcpServers`` config federating one echo server per name, echo approved in advance as a client
    file says it (``autoApprove``); with ``policy_off`` it turns the policy and the guardrails off."""
    servers = {name: {"command": python, "args": [str(ECHO_SERVER)], "autoApprove": ["echo"]} for name in names}
    config: dict[str, Any] = {"mcpServers": servers}
    if policy_off:
        config["policy"] = "off"
        config["guardrails"] = "off"
    return orjson.dumps(config, option=orjson.OPT_INDENT_2)


def write_config(workdir: Path, filename: str, python: str, names: list[str], *, policy_off: bool = False) -> Path:
    path = workdir / filename
    path.write_bytes(mcp_servers_config(python, names, policy_off=policy_off))
    return path


def bastion_command(python: str, requested: str | None) -> list[str]:
    """The installed ``bastion`` script next to the interpreter, else the package run from this checkout."""
    if requested:
        return [requested]
    script = Path(python).parent / "bastion"
    return [str(script)] if script.exists() else [python, "-m", "bastion"]


def path_specs(selected: list[str], python: str, bastion: list[str], workdir: Path) -> list[PathSpec]:
    echo = [python, str(ECHO_SERVER)]
    builders = {
        "direct": lambda: PathSpec("direct", echo, "echo"),
        "relay": lambda: PathSpec("relay", [python, str(FIXTURES / "relay.py"), *echo], "echo"),
        "bastion": lambda: PathSpec(
            "bastion", [*bastion, "run", str(write_config(workdir, "bastion-1.json", python, ["echo"]))],
            "echo__echo"),
        "bastion-off": lambda: PathSpec(
            "bastion-off",
            [*bastion, "run", str(write_config(workdir, "bastion-off.json", python, ["echo"], policy_off=True))],
            "echo__echo"),
        "fastmcp": lambda: PathSpec("fastmcp", [python, str(FIXTURES / "fastmcp_proxy.py"), *echo], "echo"),
    }
    return [builders[name]() for name in selected]


# ----------------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------------

def percentile(sorted_values: list[int], fraction: float) -> int:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass
class Accumulated:
    """Latencies and busy time gathered over several rounds of one mode on one path."""

    latencies_ns: list[int] = field(default_factory=list)
    elapsed_ns: int = 0

    def add(self, timing: CallTiming) -> None:
        self.latencies_ns.extend(timing.latencies_ns)
        self.elapsed_ns += timing.elapsed_ns

    def summary(self) -> dict[str, float]:
        ordered = sorted(self.latencies_ns)
        calls = len(ordered)
        return {
            "calls": calls,
            "p50_ms": percentile(ordered, 0.50) / 1e6,
            "p99_ms": percentile(ordered, 0.99) / 1e6,
            "mean_ms": sum(ordered) / calls / 1e6,
            "calls_per_s": calls / (self.elapsed_ns / 1e9),
        }


# ----------------------------------------------------------------------------------------------------
# Running the paths
# ----------------------------------------------------------------------------------------------------

@dataclass
class LivePath:
    spec: PathSpec
    client: McpPipeClient
    tool: str
    sequential: Accumulated = field(default_factory=Accumulated)
    windowed: Accumulated = field(default_factory=Accumulated)
    cpu_at_start: float | None = None

    def cpu_us_per_call(self) -> float | None:
        """CPU the process behind the pipe spent per measured call; unlike wall time, barely moved by
        other load on the machine."""
        now = self.client.cpu_seconds()
        calls = len(self.sequential.latencies_ns) + len(self.windowed.latencies_ns)
        if now is None or self.cpu_at_start is None or not calls:
            return None
        return (now - self.cpu_at_start) / calls * 1e6


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def stderr_tail(log_file: IO[bytes], lines: int = 8) -> str:
    log_file.flush()
    with open(log_file.name, "rb") as handle:
        tail = handle.read().decode(errors="replace").strip().splitlines()[-lines:]
    return "\n".join("    | " + line for line in tail) or "    | (no stderr output)"


def resolve_tool(spec: PathSpec, names: list[str]) -> str:
    if spec.tool in names:
        return spec.tool
    # A gateway may spell its namespace prefix differently; any single tool that ends in "echo" is ours.
    candidates = [name for name in names if name.endswith("echo")]
    if len(candidates) == 1:
        return candidates[0]
    raise RuntimeError(f"tool {spec.tool!r} not offered; tools/list returned {names}")


async def open_path(spec: PathSpec, log_file: IO[bytes]) -> LivePath:
    # From the checkout's root so that `python -m bastion` finds the package when it is not installed.
    client = await McpPipeClient.spawn(spec.argv, log_file, cwd=REPO_ROOT)
    try:
        await asyncio.wait_for(client.handshake(), HANDSHAKE_TIMEOUT_S)
        names = await asyncio.wait_for(client.tool_names(), HANDSHAKE_TIMEOUT_S)
        return LivePath(spec, client, resolve_tool(spec, names))
    except BaseException:
        await client.close(grace_seconds=1.0)
        raise


async def measure_round(path: LivePath, calls: int, timeout_s: float) -> None:
    path.sequential.add(await asyncio.wait_for(path.client.sequential_calls(path.tool, calls), timeout_s))
    path.windowed.add(await asyncio.wait_for(path.client.windowed_calls(path.tool, calls, WINDOW), timeout_s))


@contextlib.contextmanager
def collector_paused():
    """Keep the client's garbage collector out of the timed calls; it would add jitter to every path."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def run_paths(specs: list[PathSpec], options: argparse.Namespace, logs_dir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    live: list[LivePath] = []
    with contextlib.ExitStack() as log_files:
        try:
            await measure_live_paths(specs, options, logs_dir, log_files, live, results)
        finally:
            for path in live:
                await path.client.close()
    return {name: results[name] for name in [spec.name for spec in specs] if name in results}


async def measure_live_paths(specs: list[PathSpec], options: argparse.Namespace, logs_dir: Path,
                             log_files: contextlib.ExitStack, live: list[LivePath],
                             results: dict[str, Any]) -> None:
    for spec in specs:
        log_file = log_files.enter_context(open(logs_dir / f"{spec.name}.stderr", "wb"))
        try:
            live.append(await open_path(spec, log_file))
            log(f"[bench] {spec.name}: ready (tool {live[-1].tool!r})")
        except Exception as error:  # noqa: BLE001 - any failure to start skips the path
            reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            if spec.name not in OPTIONAL_PATHS:
                raise RuntimeError(f"{spec.name} path failed: {reason}\n{stderr_tail(log_file)}") from error
            log(f"[bench] {spec.name}: SKIPPED, handshake failed ({reason})\n{stderr_tail(log_file)}")
            results[spec.name] = {"status": "skipped", "reason": f"handshake failed: {reason}"}

    timeout_s = max(60.0, options.calls * 0.05)
    for path in live:
        await measure_round(path, options.warmup, timeout_s)
        path.sequential, path.windowed = Accumulated(), Accumulated()  # warm-up is not measured
        path.cpu_at_start = path.client.cpu_seconds()

    per_round = max(1, options.calls // options.rounds)
    with collector_paused():
        for round_index in range(options.rounds):
            calls = per_round if round_index < options.rounds - 1 else options.calls - per_round * round_index
            for path in list(live):
                try:
                    await measure_round(path, calls, timeout_s)
                except Exception as error:  # noqa: BLE001
                    if path.spec.name not in OPTIONAL_PATHS:
                        raise
                    log(f"[bench] {path.spec.name}: dropped mid-run ({type(error).__name__}: {error})")
                    results[path.spec.name] = {"status": "failed", "reason": f"{type(error).__name__}: {error}"}
                    live.remove(path)
                    await path.client.close(grace_seconds=1.0)
            log(f"[bench] round {round_index + 1}/{options.rounds} done")

    for path in live:
        rss = path.client.rss_bytes()
        results[path.spec.name] = {
            "status": "ok",
            "tool": path.tool,
            "sequential": path.sequential.summary(),
            "inflight": path.windowed.summary(),
            # CPU and RSS of the process the client talks to: the echo server on the direct path, the
            # relay or gateway on the others (without the echo server behind it).
            "cpu_us_per_call": path.cpu_us_per_call(),
            "rss_mb": None if rss is None else rss / MB,
        }


async def measure_idle_rss(python: str, bastion: list[str], workdir: Path, logs_dir: Path) -> dict[str, Any]:
    """Bastion's own RSS with ten echo servers federated, after the handshake and a tools/list."""
    names = [f"echo{index:02d}" for index in range(RSS_SERVER_COUNT)]
    config = write_config(workdir, "bastion-10.json", python, names)
    with open(logs_dir / "bastion-rss.stderr", "wb") as log_file:
        try:
            client = await McpPipeClient.spawn([*bastion, "run", str(config)], log_file, cwd=REPO_ROOT)
        except OSError as error:
            return {"status": "skipped", "reason": f"could not start bastion: {error}"}
        try:
            await asyncio.wait_for(client.handshake(), HANDSHAKE_TIMEOUT_S)
            tools = await asyncio.wait_for(client.tool_names(), HANDSHAKE_TIMEOUT_S)
            await asyncio.sleep(1.0)  # let start-up garbage settle so the figure is the idle footprint
            rss = client.rss_bytes()
        except Exception as error:  # noqa: BLE001
            reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            log(f"[bench] bastion idle RSS: SKIPPED ({reason})\n{stderr_tail(log_file)}")
            return {"status": "skipped", "reason": reason}
        finally:
            await client.close()
    return {"status": "ok", "servers": RSS_SERVER_COUNT, "tools": len(tools),
            "rss_mb": None if rss is None else rss / MB}


# ----------------------------------------------------------------------------------------------------
# Targets and output
# ----------------------------------------------------------------------------------------------------

def figure(paths: dict[str, Any], name: str, mode: str, key: str) -> float | None:
    entry = paths.get(name)
    if not entry or entry.get("status") != "ok":
        return None
    return entry[mode][key]


def added_latency_ratio(paths: dict[str, Any], baseline: str) -> tuple[float | None, str]:
    """(bastion − direct) / (baseline − direct) on sequential p50 latency."""
    direct = figure(paths, "direct", "sequential", "p50_ms")
    bastion = figure(paths, "bastion", "sequential", "p50_ms")
    other = figure(paths, baseline, "sequential", "p50_ms")
    if direct is None or bastion is None or other is None:
        return None, "needs direct, bastion and " + baseline
    if other - direct <= 0:
        return None, f"{baseline} measured no slower than direct; the ratio is undefined in this run"
    return (bastion - direct) / (other - direct), ""


def throughput_ratio(paths: dict[str, Any], name: str) -> tuple[float | None, str]:
    direct = figure(paths, "direct", "inflight", "calls_per_s")
    other = figure(paths, name, "inflight", "calls_per_s")
    if direct is None or other is None:
        return None, f"needs direct and {name}"
    return other / direct, ""


def target_row(name: str, value: float | None, note: str, target: str, met: bool | None) -> dict[str, Any]:
    status = "SKIP" if value is None else ("PASS" if met else "MISS")
    return {"name": name, "value": value, "target": target, "status": status, "note": note}


def evaluate_targets(paths: dict[str, Any], idle_rss: dict[str, Any] | None) -> list[dict[str, Any]]:
    vs_relay, relay_note = added_latency_ratio(paths, "relay")
    vs_fastmcp, fastmcp_note = added_latency_ratio(paths, "fastmcp")
    tput, tput_note = throughput_ratio(paths, "bastion")
    rss = idle_rss.get("rss_mb") if idle_rss and idle_rss.get("status") == "ok" else None
    rss_note = "" if rss is not None else (idle_rss or {}).get("reason", "needs the bastion path")
    return [
        target_row("added latency vs relay: (bastion-direct)/(relay-direct), p50", vs_relay, relay_note,
                   f"<= {TARGET_ADDED_VS_RELAY:g}", vs_relay is not None and vs_relay <= TARGET_ADDED_VS_RELAY),
        target_row("added latency vs FastMCP: (bastion-direct)/(fastmcp-direct), p50", vs_fastmcp, fastmcp_note,
                   f"<= {TARGET_ADDED_VS_FASTMCP:g}",
                   vs_fastmcp is not None and vs_fastmcp <= TARGET_ADDED_VS_FASTMCP),
        target_row(f"throughput with {WINDOW} in flight: bastion/direct", tput, tput_note,
                   f">= {TARGET_THROUGHPUT_VS_DIRECT:g}", tput is not None and tput >= TARGET_THROUGHPUT_VS_DIRECT),
        target_row(f"bastion idle RSS, {RSS_SERVER_COUNT} servers federated (MB)", rss, rss_note,
                   f"< {TARGET_IDLE_RSS_MB:g}", rss is not None and rss < TARGET_IDLE_RSS_MB),
    ]


def context_ratios(paths: dict[str, Any]) -> dict[str, float | None]:
    """Ratios that are not targets but put the targets in context."""
    direct = figure(paths, "direct", "sequential", "p50_ms")
    out: dict[str, float | None] = {}
    for name in ("relay", "bastion", "bastion-off", "fastmcp"):
        value = figure(paths, name, "sequential", "p50_ms")
        out[f"{name}_added_p50_ms"] = None if value is None or direct is None else value - direct
        out[f"{name}_inflight_throughput_vs_direct"] = throughput_ratio(paths, name)[0]
    relay_added = out["relay_added_p50_ms"]
    for name in ("bastion", "bastion-off"):  # the policy-off path is reported against the same goals, as context
        own = out[f"{name}_added_p50_ms"]
        out[f"{name}_added_vs_relay"] = None if own is None or not relay_added or relay_added <= 0 else own / relay_added
    relay_cpu, bastion_cpu = (cpu_per_call(paths, name) for name in ("relay", "bastion"))
    out["bastion_cpu_per_call_vs_relay"] = (
        None if relay_cpu is None or bastion_cpu is None or relay_cpu <= 0 else bastion_cpu / relay_cpu)
    return out


def cpu_per_call(paths: dict[str, Any], name: str) -> float | None:
    entry = paths.get(name)
    return entry.get("cpu_us_per_call") if entry and entry.get("status") == "ok" else None


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def render_table(report: dict[str, Any]) -> str:
    lines = [
        f"Data-plane benchmark: {report['calls']} calls per mode per path, {WINDOW} in flight for the "
        f"windowed mode, {report['rounds']} interleaved rounds, {report['machine']['cpus']} CPUs, "
        f"Python {report['machine']['python']}",
        "",
        f"{'path':<11} {'seq p50 ms':>10} {'seq p99 ms':>10} {'seq calls/s':>11} "
        f"{'32 p50 ms':>10} {'32 p99 ms':>10} {'32 calls/s':>11} {'added p50 ms':>12} {'CPU us/call':>11} "
        f"{'RSS MB':>7}",
    ]
    direct_p50 = figure(report["paths"], "direct", "sequential", "p50_ms")
    for name, entry in report["paths"].items():
        if entry["status"] != "ok":
            lines.append(f"{name:<11} {entry['status'].upper()}: {entry['reason']}")
            continue
        seq, win = entry["sequential"], entry["inflight"]
        added = None if direct_p50 is None else seq["p50_ms"] - direct_p50
        lines.append(
            f"{name:<11} {seq['p50_ms']:>10.3f} {seq['p99_ms']:>10.3f} {seq['calls_per_s']:>11.0f} "
            f"{win['p50_ms']:>10.3f} {win['p99_ms']:>10.3f} {win['calls_per_s']:>11.0f} "
            f"{fmt(added):>12} {fmt(entry['cpu_us_per_call'], '.0f'):>11} {fmt(entry['rss_mb'], '.1f'):>7}")
    idle = report.get("bastion_idle_rss")
    if idle is not None:
        lines += ["", "Bastion idle RSS with 10 echo servers federated: "
                  + (f"{idle['rss_mb']:.1f} MB ({idle['tools']} tools listed)" if idle["status"] == "ok"
                     else f"SKIPPED ({idle['reason']})")]
    lines += ["", f"{'target':<68} {'value':>8} {'goal':>7}  result"]
    for row in report["targets"]:
        value = fmt(row["value"], ".2f" if row["value"] is None or row["value"] >= 1 else ".3f")
        note = f"  ({row['note']})" if row["note"] else ""
        lines.append(f"{row['name']:<68} {value:>8} {row['target']:>7}  {row['status']}{note}")
    context = report["context"]
    lines += ["", "context (not targets):"]
    for name in ("relay", "bastion", "bastion-off", "fastmcp"):
        if context[f"{name}_inflight_throughput_vs_direct"] is not None:
            lines.append(f"  {name} throughput with {WINDOW} in flight / direct: "
                         f"{context[f'{name}_inflight_throughput_vs_direct']:.2f}")
    for name in ("bastion", "bastion-off"):
        if context[f"{name}_added_vs_relay"] is not None:
            lines.append(f"  {name} added latency / relay added latency: {context[f'{name}_added_vs_relay']:.2f}")
    if context["bastion_cpu_per_call_vs_relay"] is not None:
        lines.append(f"  bastion CPU per call / relay CPU per call: {context['bastion_cpu_per_call_vs_relay']:.2f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=None,
                        help="tools/call per mode per path (default 3000; 300 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a short run: fewer calls, rounds and warm-up")
    parser.add_argument("--paths", default=",".join(ALL_PATHS),
                        help=f"comma-separated subset of {','.join(ALL_PATHS)} (direct is always needed "
                             "for the ratios)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 6; 2 with --quick)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the fixtures")
    parser.add_argument("--bastion", default=None,
                        help="the bastion executable (default: the one next to --python, else "
                             "`python -m bastion` from this checkout)")
    args = parser.parse_args(argv)
    args.paths = [name.strip() for name in args.paths.split(",") if name.strip()]
    unknown = sorted(set(args.paths) - set(ALL_PATHS))
    if unknown:
        parser.error(f"--paths: unknown path(s) {unknown}; choose from {', '.join(ALL_PATHS)}")
    args.paths = [name for name in ALL_PATHS if name in args.paths]
    if args.calls is None:
        args.calls = 300 if args.quick else 3000
    if args.rounds is None:
        args.rounds = 2 if args.quick else 6
    if args.calls < 1 or args.rounds < 1:
        parser.error("--calls and --rounds must be at least 1")
    args.rounds = min(args.rounds, args.calls)
    args.warmup = 30 if args.quick else 300
    return args


async def run(options: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bastion-bench-") as tmp:
        workdir = Path(tmp)
        # The bastion paths audit every call: into the run's own folder, not the user's audit trail.
        os.environ["XDG_STATE_HOME"] = str(workdir / "state")
        bastion = bastion_command(options.python, options.bastion)
        specs = path_specs(options.paths, options.python, bastion, workdir)
        paths = await run_paths(specs, options, workdir)
        idle_rss = None
        if "bastion" in options.paths:
            idle_rss = await measure_idle_rss(options.python, bastion, workdir, workdir)
    return {
        "calls": options.calls,
        "rounds": options.rounds,
        "window": WINDOW,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "paths": paths,
        "bastion_idle_rss": idle_rss,
        "targets": evaluate_targets(paths, idle_rss),
        "context": context_ratios(paths),
    }


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    report = asyncio.run(run(options))
    if options.json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
