"""What one operation of the state store (bastion/state/) costs: the memory store against the Redis store on a real
``redis-server`` on loopback (started and stopped here, tests/redis_server.py), per operation: one caller at a time
(latency: p50 and p99 in microseconds, and the operations a second that makes) and 64 callers at once (throughput).

The operations are what the gateway asks of its store on a decision: ``take`` of 3 buckets (a call's rate limits),
``claim`` (an approval used up), ``recorded`` (a reuse grant looked up), ``get``/``put``, ``map_put``, ``add``
(a session quota), ``hit`` (a guardrail budget), ``append`` (an SSE redelivery window) and ``publish``.

Usage: .venv/bin/python bench/state_store.py [--ops N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bastion.state import Bucket, MemoryStore  # noqa: E402
from bastion.state.redis_store import RedisStore  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

CONCURRENCY = 64
BUCKETS = [Bucket("rate:principal", 1e6, 1e9), Bucket("rate:tool", 1e6, 1e9), Bucket("rate:server", 1e6, 1e9)]


def operations(store: Any) -> dict[str, Callable[[int], Awaitable[Any]]]:
    return {
        "take (3 buckets)": lambda n: store.take(BUCKETS),
        "claim": lambda n: store.claim(f"used:{n}", 60),
        "recorded": lambda n: store.recorded("reuse:x"),
        "get": lambda n: store.get("value"),
        "put": lambda n: store.put("value", b"x" * 200, 60),
        "map_put": lambda n: store.map_put("pins", {f"tool{n % 50}": b"sha256:" + b"0" * 64}),
        "add": lambda n: store.add("quota", 1 if n % 2 else -1, limit=10**9, seconds=60),
        "hit": lambda n: store.hit(f"budget:{n % 100}", 10**9, 60),
        "append": lambda n: store.append("log", b"event" * 40, keep=100, seconds=60),
        "publish": lambda n: store.publish("channel", b"message"),
    }


async def measure(store: Any, ops: int) -> dict[str, dict[str, float]]:
    results = {}
    for name, operation in operations(store).items():
        for n in range(min(200, ops)):  # warm-up: scripts loaded, connections open
            await operation(n)
        latencies = []
        counter = itertools.count()
        for _ in range(ops):
            started = time.perf_counter_ns()
            await operation(next(counter))
            latencies.append(time.perf_counter_ns() - started)
        latencies.sort()

        async def worker(share: int) -> None:
            for _ in range(share):
                await operation(next(counter))

        started = time.perf_counter()
        await asyncio.gather(*(worker(ops // CONCURRENCY) for _ in range(CONCURRENCY)))
        concurrent = (ops // CONCURRENCY) * CONCURRENCY / (time.perf_counter() - started)
        results[name] = {
            "p50_us": latencies[len(latencies) // 2] / 1000,
            "p99_us": latencies[int(len(latencies) * 0.99)] / 1000,
            "sequential_ops_s": 1e9 / statistics.mean(latencies),
            "concurrent_ops_s": concurrent,
        }
    return results


async def main(ops: int) -> dict[str, Any]:
    memory = MemoryStore()
    figures = {"memory": await measure(memory, ops)}
    await memory.aclose()
    server = RedisServer().start()
    store = RedisStore(f"redis://127.0.0.1:{server.port}/0")
    try:
        figures["redis"] = await measure(store, ops)
    finally:
        await store.aclose()
        server.close()
    return figures


def table(figures: dict[str, Any]) -> str:
    lines = ["| operation | memory p50 µs | memory ops/s | Redis p50 µs | Redis p99 µs | Redis ops/s, 1 caller | "
             "Redis ops/s, 64 callers |", "|---|---|---|---|---|---|---|"]
    for name, redis in figures["redis"].items():
        memory = figures["memory"][name]
        lines.append(f"| `{name}` | {memory['p50_us']:.1f} | {memory['sequential_ops_s']:,.0f} | "
                     f"{redis['p50_us']:.0f} | {redis['p99_us']:.0f} | {redis['sequential_ops_s']:,.0f} | "
                     f"{redis['concurrent_ops_s']:,.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=5000)
    parser.add_argument("--json", action="store_true")
    arguments = parser.parse_args()
    found = asyncio.run(main(arguments.ops))
    print(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode() if arguments.json else table(found))
