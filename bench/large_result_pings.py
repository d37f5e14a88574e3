"""Does a very large result stall the gateway's event loop? Ping latency while a 50 MB result passes.

`bastion serve --http` federates tests/fixtures/raw_server.py, whose ``big`` tool answers a text of the size asked
(a 50 MB JSON result). One client (a 2026-07-28 POST) asks for it and reads it; meanwhile another client, on its
own connection in a 2025-11-25 session, sends ``ping`` after ``ping`` and times each answer. A loop busy decoding or
encoding the big frame would hold every ping behind it.

Reported per configuration: the pings answered during the transfer, their p50, p99 and max latency, and the time
the big result took. ``off``: policy off and no guardrails (nothing reads the result: its bytes pass through);
``default``: the default policy and guardrails, which read results. The bound the issue sets is 50 ms for every
ping answered during the transfer.

Usage: .venv/bin/python bench/large_result_pings.py [--mib 50] [--rounds 3] [--configs off default] [--in-process]

To see which steps hold the loop: BENCH_SERVE_ENV='{"PYTHONASYNCIODEBUG": "1"}' (variables for `bastion serve`,
as JSON) and BENCH_KEEP_STDERR=1 (print the end of its stderr, where asyncio logs each step over 100 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2 as httpx

ROOT = Path(__file__).resolve().parent.parent
BASTION = str(Path(sys.executable).parent / "bastion")
RAW_SERVER = ROOT / "tests" / "fixtures" / "raw_server.py"
MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"}}


def serve(tmp: Path, config_kind: str, mib: int) -> tuple[subprocess.Popen, str]:
    settings: dict = {"servers": {"raw": {"command": sys.executable, "args": [str(RAW_SERVER), "bench-big"],
                                          "sandbox": {"profile": "none"}}},
                      "max_message_bytes": (mib + 16) * 1024 * 1024, "ready_timeout": 120,
                      "tools": {"exposure": "all"}}
    if config_kind == "off":
        settings["policy"] = "off"
        settings["guardrails"] = "off"
    else:
        settings["servers"]["raw"]["auto_approve"] = ["big", "echo"]
    config = tmp / f"{config_kind}.json"
    config.write_text(json.dumps(settings))
    stderr = tmp / f"{config_kind}.stderr"
    process = subprocess.Popen([BASTION, "serve", str(config), "--http", "127.0.0.1:0"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=stderr.open("wb"),
                               env={**os.environ, "PYTHONUNBUFFERED": "1",
                                    **json.loads(os.environ.get("BENCH_SERVE_ENV", "{}"))})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"serving MCP on (http://[^ ]+/mcp)", stderr.read_text())
        if found:
            return process, found.group(1)
        if process.poll() is not None:
            raise SystemExit(f"bastion serve exited: {stderr.read_text()}")
        time.sleep(0.1)
    process.kill()
    raise SystemExit("bastion serve did not start")


def big_call(url: str, size: int) -> tuple[float, int]:
    """Seconds the big result took, and its length."""
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
               "mcp-method": "tools/call", "mcp-name": "raw__big"}
    with httpx.Client(timeout=600) as http:
        started = time.perf_counter()
        answer = http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": "big", "method": "tools/call",
                                                        "params": {"name": "raw__big", "arguments": {"size": size},
                                                                   "_meta": MODERN_META}})
        took = time.perf_counter() - started
    text = answer.text
    if '"result"' not in text[:200] and '"result"' not in text[-200:]:
        raise SystemExit(f"the big call failed: {text[:300]}")
    return took, len(text)


PINGER = r"""
import json, sys, time
import httpx2 as httpx
url = sys.argv[1]
with httpx.Client(timeout=60) as http:
    base = {"accept": "application/json, text/event-stream"}
    init = http.post(url, headers=base, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "pinger", "version": "1"}}})
    headers = {**base, "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    print("ready", flush=True)
    pings, n = [], 0
    import select
    while not select.select([sys.stdin], [], [], 0.005)[0]:  # until the bench closes our stdin
        n += 1
        sent = time.perf_counter()
        answer = http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": n, "method": "ping"})
        pings.append((sent, time.perf_counter() - sent, answer.status_code == 200 and '"result"' in answer.text))
    print(json.dumps(pings), flush=True)
"""


def one_round(url: str, size: int) -> dict:
    """The pings of a process of their own (time.perf_counter is the system's monotonic clock, shared by both
    processes), so that reading the big result here holds no ping back in the client."""
    pinger = subprocess.Popen([sys.executable, "-c", PINGER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert pinger.stdout.readline().strip() == "ready"
    time.sleep(0.2)  # a few pings before, for the idle figure
    started = time.perf_counter()
    took, length = big_call(url, size)
    ended = time.perf_counter()
    pinger.stdin.close()
    pings = json.loads(pinger.stdout.readline())
    pinger.wait(60)
    if not all(ok for _, _, ok in pings):
        raise SystemExit("a ping was not answered")
    during = sorted(latency for sent, latency, _ in pings if started <= sent <= ended)
    idle = sorted(latency for sent, latency, _ in pings if sent < started)
    return {"pings": len(during), "p50_ms": 1000 * statistics.median(during) if during else None,
            "p99_ms": 1000 * during[min(len(during) - 1, int(len(during) * 0.99))] if during else None,
            "max_ms": 1000 * during[-1] if during else None,
            "idle_p50_ms": 1000 * statistics.median(idle) if idle else None,
            "result_s": took, "bytes": length}


async def _loop_lag(work, off_loop: bool) -> float:
    """The longest the loop went unanswered (ms) while ``work`` ran on it, or in a worker thread."""
    import asyncio

    lags: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - before - 0.001)

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0.01)
    if off_loop:
        await asyncio.to_thread(work)
    else:
        work()
    done.set()
    await ticker
    return 1000 * max(lags)


def in_process(mib: int) -> None:
    """Why a worker thread is no cure: the decoders hold the GIL for the whole frame, so the loop waits as long."""
    import asyncio

    import orjson

    from bastion.protocol import jsonrpc

    frame = orjson.dumps({"jsonrpc": "2.0", "id": 5, "result": {"content": [{"type": "text",
                                                                             "text": "x" * (mib << 20)}]}})
    cases = {"shape only (parse_raw_response)": lambda: jsonrpc.parse_raw_response(frame, 1 << 31),
             "orjson.loads": lambda: orjson.loads(frame),
             "json.loads": lambda: json.loads(frame)}
    for name, work in cases.items():
        for off_loop in (False, True):
            lag = asyncio.run(_loop_lag(work, off_loop))
            print(f"in-process {name:34s} {'worker thread' if off_loop else 'on the loop':13s} "
                  f"loop unanswered for up to {lag:.0f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", nargs="*", default=["off", "default"])
    parser.add_argument("--in-process", action="store_true", help="also time the decoders alone, on the loop and "
                        "in a worker thread")
    args = parser.parse_args()
    if args.in_process:
        in_process(args.mib)
    size = args.mib * 1024 * 1024
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.configs:
            process, url = serve(Path(tmp), kind, args.mib)
            try:
                for turn in range(args.rounds):
                    figures = one_round(url, size)
                    print(f"{kind:8s} round {turn + 1}: " + ", ".join(
                        f"{key} {value:.1f}" if isinstance(value, float) else f"{key} {value}"
                        for key, value in figures.items()), flush=True)
            finally:
                process.terminate()
                process.wait(60)
                if os.environ.get("BENCH_KEEP_STDERR"):
                    print((Path(tmp) / f"{kind}.stderr").read_text()[-6000:])


if __name__ == "__main__":
    main()
