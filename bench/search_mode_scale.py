"""Search mode at scale, end to end: `bastion run` federating one server with thousands of tools and an echo server.

What a client of a large federation notices, measured through the real gateway over pipes:

  first answer   how long the first search-mode tools/list takes on a cold embedding cache (the gateway
                 starts indexing then, and answers once BM25 and the static vectors are in)
  searches       search_tools round trips while MiniLM still embeds the catalog in the background
  relay          echo tools/call round trips before the index exists (baseline) and while it is being
                 embedded: what the background work costs the data plane, as ratios within this run
  shutdown       how long the gateway takes to exit when stdin closes mid-embedding
  with MiniLM    a second gateway, on a state directory of its own (a cold embedding cache), embeds the
                 whole catalog: how long until it says on stderr that MiniLM's vectors are in (the
                 build time end to end), then search_tools round trips are timed and its resident
                 memory is read

The catalog is bench/routing_catalog.py's synthetic one made from the BFCL tools. The derived MiniLM model
is copied from the user's cache when it is there, so the run measures indexing rather than a one-off
derivation. Absolute times drift between runs and machines; the ratios are taken within one run.

Usage: .venv/bin/python bench/search_mode_scale.py [--size 10000] [--calls 5000] [--searches 30] [--no-with-minilm]
                                                  [--minilm-searches 200] [--embedding-tokens 128] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataplane_client import McpPipeClient  # noqa: E402
from bastion.search.evaluate import percentile_ms  # noqa: E402
from routing_catalog import synthetic_catalog  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
FIXTURES = BENCH_DIR / "fixtures"
# The index-build target, set against both the first answer (what a client waits for) and the whole
# build (MiniLM's vectors included).
BUILD_TARGET_S = 30.0
MINILM_IN = b"MiniLM's vectors are in"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def mcp_tools(base: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    """Tool definitions a server can list: names kept to MCP's characters and unique."""
    tools, seen = [], set()
    for tool in synthetic_catalog(base, size):
        name = _UNSAFE.sub("_", tool["name"])[:60]
        while name in seen:
            name = f"{name[:56]}_{len(seen) % 1000}"
        seen.add(name)
        tools.append({"name": name, "description": tool.get("description", ""),
                      "inputSchema": tool.get("inputSchema") or {"type": "object"}})
    return tools


async def timed_request(client: McpPipeClient, method: str, params: dict[str, Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = await client.request(method, params)
    return result, time.perf_counter() - started


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    base = [orjson.loads(line) for line in (args.data / "tools.jsonl").read_bytes().splitlines() if line.strip()]
    queries = [orjson.loads(line)["query"] for line in (args.data / "queries.jsonl").read_bytes().splitlines() if line.strip()]
    tools = mcp_tools(base, args.size)
    (work / "tools.json").write_bytes(orjson.dumps(tools))
    config = work / "bastion.json"
    config.write_bytes(orjson.dumps({
        "servers": {
            "many": {"command": sys.executable, "args": [str(FIXTURES / "catalog_server.py"), str(work / "tools.json")],
                     "sandbox": {"read_only": [str(work)]}, "startup_timeout": 120},
            "echo": {"command": sys.executable, "args": [str(FIXTURES / "echo_server.py")]},
        },
        "tools": {"exposure": "search", "embedding_tokens": args.embedding_tokens},
        # What is measured is search mode and the relay beside it: the policy would make each echo wait for a person.
        "policy": "off",
    }))
    cache, state = work / "cache", work / "state"
    models = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bastion" / "models"
    derived = models.is_dir() and any(models.glob("*.onnx"))
    if derived:
        shutil.copytree(models, cache / "bastion" / "models")
    os.environ.update(XDG_CACHE_HOME=str(cache), XDG_STATE_HOME=str(state))

    bastion = str(Path(sys.executable).parent / "bastion")
    with (work / "bastion.stderr").open("wb") as stderr:
        client = await McpPipeClient.spawn([bastion, "run", str(config), "-q"], stderr)
        try:
            await client.handshake()
            log(f"{len(tools)} tools; relay baseline: {args.calls} echo calls before any index exists")
            idle = await client.sequential_calls("echo__echo", args.calls)
            listing, first_answer_s = await timed_request(client, "tools/list", {})
            listed = sorted(tool["name"] for tool in listing["tools"])
            log(f"first search-mode tools/list after {first_answer_s:.1f} s: {listed}")
            search_s = []
            for query in queries[:: max(1, len(queries) // args.searches)][: args.searches]:
                found, took = await timed_request(client, "tools/call", {
                    "name": "search_tools", "arguments": {"query": query, "k": 5}})
                if found.get("isError") or not found["structuredContent"]["tools"]:
                    raise RuntimeError(f"search_tools found nothing for {query!r}: {found}")
                search_s.append(took)
            log(f"relay while indexing: {args.calls} echo calls")
            busy = await client.sequential_calls("echo__echo", args.calls)
            closing = time.perf_counter()
            await client.close(grace_seconds=60)
            shutdown_s = time.perf_counter() - closing
            status = client.process.returncode
        finally:
            await client.close()
    idle_s, busy_s = ([ns / 1e9 for ns in timing.latencies_ns] for timing in (idle, busy))
    minilm_in_s, minilm_s, rss_mb = (await searches_with_minilm(args, bastion, config, queries, work)
                                     if args.with_minilm else (None, [], None))
    return {
        "tools": len(tools), "model_derived_beforehand": derived, "exit_status": status,
        "first_answer_s": first_answer_s, "first_answer_vs_target": first_answer_s / BUILD_TARGET_S,
        "search_ms_p50": percentile_ms(search_s, 50), "search_ms_max": max(search_s) * 1e3,
        "relay_idle_ms": {"p50": percentile_ms(idle_s, 50), "p99": percentile_ms(idle_s, 99)},
        "relay_indexing_ms": {"p50": percentile_ms(busy_s, 50), "p99": percentile_ms(busy_s, 99)},
        "shutdown_s": shutdown_s,
        "embedding_tokens": args.embedding_tokens, "minilm_in_s": minilm_in_s,
        "minilm_search_ms_p50": percentile_ms(minilm_s, 50) if minilm_s else None,
        "minilm_search_ms_p99": percentile_ms(minilm_s, 99) if minilm_s else None,
        "rss_mb_with_minilm": rss_mb,
    }


async def searches_with_minilm(args: argparse.Namespace, bastion: str, config: Path, queries: list[str],
                               work: Path) -> tuple[float, list[float], float | None]:
    """How long a gateway on a cold embedding cache took from its first search-mode request to MiniLM's
    vectors for the whole catalog (s, to within the 0.1 s this polls its stderr at),
    search_tools latencies (s) once it has, and its resident memory afterwards (MiB, without its servers)."""
    stderr_path = work / "bastion-second.stderr"
    os.environ["XDG_STATE_HOME"] = str(work / "state-second")
    shutil.rmtree(work / "cache" / "bastion" / "embeddings", ignore_errors=True)  # cold vectors, derived model kept
    with stderr_path.open("wb") as stderr:
        client = await McpPipeClient.spawn([bastion, "run", str(config)], stderr)
        try:
            await client.handshake()
            started = time.monotonic()  # the first search-mode request starts the indexing
            await client.request("tools/list", {})
            log("second gateway: waiting for MiniLM to finish the catalog")
            while MINILM_IN not in stderr_path.read_bytes():
                if time.monotonic() > started + args.minilm_timeout:
                    raise RuntimeError(f"MiniLM did not finish within {args.minilm_timeout:.0f} s")
                await asyncio.sleep(0.1)
            minilm_in_s = time.monotonic() - started
            timings = []
            for query in queries[1::max(1, len(queries) // args.minilm_searches)][: args.minilm_searches]:
                _, took = await timed_request(client, "tools/call", {
                    "name": "search_tools", "arguments": {"query": query, "k": 5}})
                timings.append(took)
            rss = client.rss_bytes()
            return minilm_in_s, timings, (rss / 2**20 if rss is not None else None)
        finally:
            await client.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=REPO_ROOT.parent / "shared/data/routing/bfcl")
    ap.add_argument("--size", type=int, default=10_000, help="tools the big server lists")
    ap.add_argument("--calls", type=int, default=5000, help="echo calls per relay phase")
    ap.add_argument("--searches", type=int, default=30, help="search_tools calls while indexing")
    ap.add_argument("--with-minilm", action=argparse.BooleanOptionalAction, default=True,
                    help="also time searches once MiniLM's vectors are in (waits for the whole embedding)")
    ap.add_argument("--minilm-searches", type=int, default=200, help="search_tools calls timed with MiniLM")
    ap.add_argument("--minilm-timeout", type=float, default=600, help="seconds to wait for MiniLM's vectors")
    ap.add_argument("--embedding-tokens", type=int, default=128, help="the configuration's tools.embedding_tokens")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bastion-scale-") as work:
        report = asyncio.run(run(args, Path(work)))
    idle, busy = report["relay_idle_ms"], report["relay_indexing_ms"]
    report["relay_p50_ratio"] = busy["p50"] / idle["p50"]
    report["relay_p99_ratio"] = busy["p99"] / idle["p99"]
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(f"{report['tools']} tools in search mode (cold embedding cache"
          f"{'' if report['model_derived_beforehand'] else ', MiniLM derived during the run'})")
    print(f"first tools/list      {report['first_answer_s']:8.2f} s   {report['first_answer_vs_target']:.2f}x of the "
          f"{BUILD_TARGET_S:.0f} s target")
    print(f"search_tools          {report['search_ms_p50']:8.1f} ms  p50 (max {report['search_ms_max']:.1f} ms), while indexing")
    print(f"relay p50             {busy['p50']:8.3f} ms  while indexing vs {idle['p50']:.3f} ms before: "
          f"{report['relay_p50_ratio']:.2f}x")
    print(f"relay p99             {busy['p99']:8.3f} ms  while indexing vs {idle['p99']:.3f} ms before: "
          f"{report['relay_p99_ratio']:.2f}x")
    print(f"exit on stdin EOF     {report['shutdown_s']:8.2f} s   (status {report['exit_status']})")
    if report["minilm_in_s"] is not None:
        print(f"MiniLM's vectors in   {report['minilm_in_s']:8.1f} s   after the first search-mode request, cold cache, "
              f"{report['embedding_tokens']} word pieces a tool ({report['minilm_in_s'] / BUILD_TARGET_S:.2f}x of the "
              f"{BUILD_TARGET_S:.0f} s build target)")
    if report["minilm_search_ms_p50"] is not None:
        print(f"search_tools, MiniLM  {report['minilm_search_ms_p50']:8.1f} ms  p50, p99 {report['minilm_search_ms_p99']:.1f} ms "
              f"(whole catalog embedded; the index alone is timed by bench/routing_bfcl.py)")
    if report["rss_mb_with_minilm"] is not None:
        print(f"gateway RSS           {report['rss_mb_with_minilm']:8.0f} MB  with the whole index in memory (servers not counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
