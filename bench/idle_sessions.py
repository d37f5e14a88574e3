"""Idle handshake-era sessions across replicas: N sessions (10,000 by default) opened through HAProxy in front of
three `bastion serve --http` replicas (tests/replicas/cluster.py, on Redis when the gateway has a [state] table),
then left idle. Reports each replica's RSS before and after, the sessions HAProxy sent it (its stats: requests per
server), the memory per session (RSS delta / its sessions), and Redis's used memory before and after.

Usage: .venv/bin/python bench/idle_sessions.py [--sessions N] [--replicas 1|3] [--concurrency C] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402

from tests.replicas.cluster import IDENTITIES, Cluster  # noqa: E402

LEGACY = "2025-11-25"


def requests_per_replica(cluster: Cluster) -> dict[str, int]:
    """HAProxy's count of requests (HTTP sessions) each replica was sent, from its stats socket."""
    header, *rows = cluster.haproxy.command("show stat").strip().splitlines()
    columns = header.lstrip("# ").split(",")
    found = {}
    for row in rows:
        values = dict(zip(columns, row.split(",")))
        if values.get("pxname") == "replicas" and values.get("svname") not in ("BACKEND", "FRONTEND"):
            found[values["svname"]] = int(values["stot"])
    return found


def redis_used_memory(cluster: Cluster) -> int | None:
    if cluster.redis is None:
        return None
    import redis

    client = redis.Redis(host="127.0.0.1", port=cluster.redis.port)
    try:
        return int(client.info("memory")["used_memory"])
    finally:
        client.close()


async def open_sessions(cluster: Cluster, count: int, concurrency: int) -> tuple[int, list[str]]:
    """Open ``count`` sessions (initialize, then notifications/initialized); the number opened and what failed."""
    failures: list[str] = []
    opened = 0
    numbers = iter(range(count))
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(http: httpx2.AsyncClient) -> None:
        nonlocal opened
        for n in numbers:
            headers = {"x-api-key": cluster.keys[IDENTITIES[n % len(IDENTITIES)]], "content-type": "application/json",
                       "accept": "application/json, text/event-stream", "mcp-protocol-version": LEGACY}
            try:
                response = await http.post(cluster.url, headers=headers, json={
                    "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                        "protocolVersion": LEGACY, "capabilities": {},
                        "clientInfo": {"name": "idle", "version": "1"}}})
                if response.status_code != 200:
                    failures.append(f"initialize: HTTP {response.status_code} {response.text[:200]}")
                    continue
                opened += 1
                done = await http.post(cluster.url, headers={**headers,
                                                             "mcp-session-id": response.headers["mcp-session-id"]},
                                       json={"jsonrpc": "2.0", "method": "notifications/initialized"})
                if done.status_code != 202:
                    failures.append(f"notifications/initialized: HTTP {done.status_code} {done.text[:200]}")
            except httpx2.HTTPError as failure:
                failures.append(f"{type(failure).__name__}: {failure}")

    async with httpx2.AsyncClient(timeout=120, limits=limits) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    return opened, failures


def measure(cluster: Cluster, sessions: int, concurrency: int) -> dict[str, Any]:
    rss_before = {r.name: r.rss_kib() for r in cluster.replicas}
    sent_before = requests_per_replica(cluster)
    redis_before = redis_used_memory(cluster)
    started = time.monotonic()
    opened, failures = asyncio.run(open_sessions(cluster, sessions, concurrency))
    seconds = time.monotonic() - started
    rss_after = {r.name: r.rss_kib() for r in cluster.replicas}
    sent = {name: count - sent_before.get(name, 0) for name, count in requests_per_replica(cluster).items()}
    redis_after = redis_used_memory(cluster)
    replicas = {}
    for name in rss_before:
        # Each session is two requests (initialize, then notifications/initialized): the replica that answered the
        # initialize holds the session; without shared sessions the second may go elsewhere. Half the requests a
        # replica got is its share of the sessions, within one.
        its_sessions = sent[name] / 2
        delta = rss_after[name] - rss_before[name]
        replicas[name] = {"rss_before_mib": rss_before[name] / 1024, "rss_after_mib": rss_after[name] / 1024,
                          "sessions": its_sessions,
                          "kib_per_session": delta / its_sessions if its_sessions else None}
    return {"sessions": sessions, "opened": opened, "seconds": seconds, "failures": len(failures),
            "failure_examples": failures[:10], "replicas": replicas, "redis": cluster.redis is not None,
            "redis_used_before_mib": None if redis_before is None else redis_before / 2**20,
            "redis_used_after_mib": None if redis_after is None else redis_after / 2**20,
            "redis_bytes_per_session": None if redis_before is None or not opened
            else (redis_after - redis_before) / opened}


def render(report: dict[str, Any]) -> str:
    lines = [f"{report['opened']}/{report['sessions']} idle legacy sessions opened through HAProxy in "
             f"{report['seconds']:.1f} s, {report['failures']} failures"
             f"{', on Redis' if report['redis'] else ''}"]
    for name, figures in report["replicas"].items():
        per = figures["kib_per_session"]
        lines.append(f"  {name}: {figures['sessions']:.0f} sessions, RSS {figures['rss_before_mib']:.1f} -> "
                     f"{figures['rss_after_mib']:.1f} MiB, {'-' if per is None else f'{per:.1f}'} KiB per session")
    if report["redis"]:
        lines.append(f"  Redis used memory {report['redis_used_before_mib']:.1f} -> "
                     f"{report['redis_used_after_mib']:.1f}"
                     f" MiB, {report['redis_bytes_per_session']:.0f} bytes per session")
    lines.extend(f"  failure: {f}" for f in report["failure_examples"])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--replicas", type=int, choices=(1, 3), default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    # Room for every session: four identities hold them all, and one replica may hold them all.
    http = {"max_sessions": max(10_000, args.sessions), "max_sessions_per_identity": max(10_000, args.sessions)}
    with Cluster(Path(tempfile.mkdtemp(prefix="bastion-idle-")), replicas_count=args.replicas, http=http) as cluster:
        report = measure(cluster, args.sessions, args.concurrency)
    print(json.dumps(report) if args.json else render(report))


if __name__ == "__main__":
    main()
