"""Load and soak through a real load balancer: mixed MCP traffic against 1 or 3 `bastion serve --http` replicas
behind HAProxy (tests/replicas/cluster.py starts them, with Redis for their shared state when the gateway has it).

Clients (asyncio + httpx2 on loopback), each an identity of its own API key, in both eras:

  2026-07-28  stateless POSTs: tools/call echo, tools/list, a long call (slow, 1 s), a cancellation (a slow call
              whose connection the client closes), an approval (write: input_required, then the retry with the
              person's yes and the requestState, which may land on another replica)
  2025-11-25  sessions (initialize, then requests with Mcp-Session-Id; closed with DELETE and opened again every
              50 operations): the same calls, the cancellation by notifications/cancelled, the approval by
              answering the elicitation/create the call's stream carries (a POST that may reach another replica)

Every answer is checked (the echo of the token the client chose, the tool list), and afterwards the counting
server's marks: every answered call ran exactly once, no call ran twice, no cancelled call ran to its end.
Reports requests/s, p50/p99 per kind, errors (the target is 0), each replica's RSS sampled every N operations
(with its slope after warm-up) and the CPU seconds every process used (replicas with their servers, HAProxy,
Redis, this client), so that per-core throughput can be read on a machine with fewer cores than processes.

Usage: .venv/bin/python bench/load.py [--minutes M | --operations N] [--replicas 1|3] [--clients C]
                                      [--eras modern,legacy] [--mix mixed|calls] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402

from tests.replicas.cluster import IDENTITIES, Cluster, read_marks  # noqa: E402

MODERN, LEGACY = "2026-07-28", "2025-11-25"
ACCEPT = {"action": "accept", "content": {"approve": True}}
TOOLS = {"count__echo", "count__slow", "count__write"}
# What each client does, by weight: mostly short calls and lists, some long calls, cancellations and approvals.
MIXES = {"mixed": (("echo", 60), ("list", 20), ("slow", 6), ("cancel", 6), ("approve", 8)),
         # Throughput alone (the scaling figure): short calls and lists, nothing that waits.
         "calls": (("echo", 80), ("list", 20))}
SLOW_SECONDS = 1.0
CANCELLED_SECONDS = 20.0  # far past when the client gives up on it: a "done" mark would be a cancellation lost
SESSION_OPERATIONS = 50
LOAD_TAG = re.compile(r"[ml]\d+-\d+-[a-z]+$")  # the tags this generator gives its calls (see Run.client)
CLIENT_TIMEOUT = 120.0  # a request the balancer or a replica never answers fails the run instead of hanging it


class Wrong(Exception):
    """An answer that is not the right one (an error, a wrong text, a refused status)."""


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    operations: Counter = field(default_factory=Counter)
    requests: int = 0
    errors: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    answered: dict[str, str] = field(default_factory=dict)  # token -> the tool whose call answered it
    cancelled: set[str] = field(default_factory=set)
    samples: list[dict[str, Any]] = field(default_factory=list)

    def error(self, kind: str, what: str, began: float | None = None) -> None:
        """An operation of ``kind`` failed; ``began`` is when it started (time.monotonic()), if known."""
        self.errors[kind] += 1
        if len(self.examples) < 20:
            self.examples.append(f"{kind}: {what}"[:400])


def parse(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a POST, sent as JSON or as the last message of an SSE stream."""
    if response.status_code != 200:
        raise Wrong(f"HTTP {response.status_code}: {response.text[:200]}")
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in reversed(response.text.splitlines()):
            if line.startswith("data:") and '"id"' in line:
                return json.loads(line[5:])
        raise Wrong(f"a stream with no answer: {response.text[:200]!r}")
    return response.json()


def result_of(message: dict[str, Any]) -> dict[str, Any]:
    if "result" not in message:
        raise Wrong(f"error {message.get('error')}")
    return message["result"]


def text_of(message: dict[str, Any]) -> str:
    return result_of(message)["content"][0]["text"]


class Modern:
    """2026-07-28: every request a POST of its own, authenticated by itself."""

    era = "modern"

    def __init__(self, http: httpx2.AsyncClient, url: str, key: str) -> None:
        self.http, self.url, self.key = http, url, key
        self.ids = itertools.count(1)

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def request(self, method: str, params: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        meta = {"io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
        headers = {"x-api-key": self.key, "content-type": "application/json",
                   "accept": "application/json, text/event-stream", "mcp-protocol-version": MODERN,
                   "mcp-method": method, **({"mcp-name": name} if name else {})}
        body = {"jsonrpc": "2.0", "id": next(self.ids), "method": method, "params": {**params, "_meta": meta}}
        return parse(await self.http.post(self.url, headers=headers, json=body))

    async def call(self, tool: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return await self.request("tools/call", {"name": tool, "arguments": arguments, **extra}, tool)

    async def cancel(self, token: str, tally: Tally) -> None:
        """Start a long call and close its connection: how 2026-07-28 cancels over HTTP. Its own client, so that
        closing the connection is the whole cancellation (a pool would keep it, or hand it back)."""
        async with httpx2.AsyncClient(timeout=CLIENT_TIMEOUT) as own:
            started = asyncio.create_task(Modern(own, self.url, self.key).call(
                "count__slow", {"tag": token, "seconds": CANCELLED_SECONDS}))
            await asyncio.wait([started], timeout=0.3)
            if started.done():
                raise Wrong(f"a {CANCELLED_SECONDS:.0f} s call answered at once: {started.result()}")
            started.cancel()
            await asyncio.gather(started, return_exceptions=True)

    async def approve(self, token: str, tally: Tally) -> None:
        """A write: input_required, then the same call with the yes and the requestState (a new POST, which the
        balancer may send to another replica)."""
        tally.requests += 1
        asked = result_of(await self.call("count__write", {"tag": token}))
        if asked.get("resultType") != "input_required":
            raise Wrong(f"write {token} was not asked about: {asked}")
        tally.requests += 1
        ran = await self.call("count__write", {"tag": token}, requestState=asked["requestState"],
                              inputResponses={"approval": ACCEPT})
        if (text := text_of(ran)) != token:
            raise Wrong(f"approved write {token} answered {text!r}")
        tally.answered[token] = "write"


class Legacy:
    """2025-11-25: one session (initialize, then Mcp-Session-Id on every request), which any replica may get."""

    era = "legacy"

    def __init__(self, http: httpx2.AsyncClient, url: str, key: str) -> None:
        self.http, self.url, self.key = http, url, key
        self.ids = itertools.count(1)
        self.session: str | None = None

    def headers(self) -> dict[str, str]:
        return {"x-api-key": self.key, "content-type": "application/json",
                "accept": "application/json, text/event-stream", "mcp-protocol-version": LEGACY,
                **({"mcp-session-id": self.session} if self.session else {})}

    async def open(self) -> None:
        response = await self.http.post(self.url, headers=self.headers(), json={
            "jsonrpc": "2.0", "id": next(self.ids), "method": "initialize", "params": {
                "protocolVersion": LEGACY, "capabilities": {"elicitation": {}},
                "clientInfo": {"name": "bench-load", "version": "1"}}})
        result_of(parse(response))
        self.session = response.headers["mcp-session-id"]
        sent = await self.http.post(self.url, headers=self.headers(),
                                    json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        if sent.status_code != 202:
            raise Wrong(f"notifications/initialized: HTTP {sent.status_code} {sent.text[:200]}")

    async def close(self) -> None:
        if self.session is not None:
            response = await self.http.delete(self.url, headers=self.headers())
            self.session = None
            if response.status_code not in (200, 202, 204):
                raise Wrong(f"DELETE: HTTP {response.status_code} {response.text[:200]}")

    async def request(self, method: str, params: dict[str, Any], name: str | None = None,
                      request_id: int | None = None) -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "id": request_id or next(self.ids), "method": method, "params": params}
        return parse(await self.http.post(self.url, headers=self.headers(), json=body))

    async def call(self, tool: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return await self.request("tools/call", {"name": tool, "arguments": arguments, **extra})

    async def cancel(self, token: str, tally: Tally) -> None:
        """A long call, then notifications/cancelled naming it (on another POST, which may reach another replica):
        the call's POST ends without an answer."""
        request_id = next(self.ids)
        started = asyncio.create_task(self.http.post(self.url, headers=self.headers(), json={
            "jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "count__slow", "arguments": {"tag": token, "seconds": CANCELLED_SECONDS}}}))
        await asyncio.wait([started], timeout=0.3)
        sent = await self.http.post(self.url, headers=self.headers(), json={
            "jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}})
        tally.requests += 1
        if sent.status_code != 202:
            started.cancel()
            raise Wrong(f"notifications/cancelled: HTTP {sent.status_code} {sent.text[:200]}")
        ended = await started
        if ended.status_code not in (200, 202) or '"result"' in ended.text:
            raise Wrong(f"a cancelled call answered: HTTP {ended.status_code} {ended.text[:200]}")

    async def approve(self, token: str, tally: Tally) -> None:
        """A write: its stream carries elicitation/create, answered yes by a POST of its own in the session (which may
        reach another replica); then the call's answer."""
        request_id = next(self.ids)
        tally.requests += 1
        async with self.http.stream("POST", self.url, headers=self.headers(), json={
                "jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                "params": {"name": "count__write", "arguments": {"tag": token}}}) as response:
            streamed = response.headers.get("content-type", "").startswith("text/event-stream")
            if response.status_code != 200 or not streamed:
                body = (await response.aread())[:200]
                raise Wrong(f"write {token}: HTTP {response.status_code} {body!r}, not a stream")
            asked = False
            async for line in response.aiter_lines():
                if not line.startswith("data:") or not line[5:].strip():
                    continue  # an event's other fields, or the priming event's empty data
                message = json.loads(line[5:])
                if message.get("method") == "elicitation/create" and "id" in message:
                    asked = True
                    tally.requests += 1
                    said = await self.http.post(self.url, headers=self.headers(), json={
                        "jsonrpc": "2.0", "id": message["id"], "result": ACCEPT})
                    if said.status_code != 202:
                        raise Wrong(f"the yes to {token}: HTTP {said.status_code} {said.text[:200]}")
                elif message.get("id") == request_id:
                    if not asked:
                        raise Wrong(f"write {token} was not asked about: {message}")
                    if (text := text_of(message)) != token:
                        raise Wrong(f"approved write {token} answered {text!r}")
                    tally.answered[token] = "write"
                    return
        raise Wrong(f"write {token}: the stream ended without an answer")


async def operation(client: Modern | Legacy, kind: str, token: str, tally: Tally) -> None:
    """One operation of the mix, its answer checked; raises Wrong when it is not right."""
    if kind == "echo":
        tally.requests += 1
        if (text := text_of(await client.call("count__echo", {"tag": token}))) != token:
            raise Wrong(f"echo {token} answered {text!r}")
        tally.answered[token] = "echo"
    elif kind == "list":
        tally.requests += 1
        names = {tool["name"] for tool in result_of(await client.request("tools/list", {}))["tools"]}
        if not TOOLS <= names:
            raise Wrong(f"tools/list lacks {TOOLS - names}")
    elif kind == "slow":
        tally.requests += 1
        if (text := text_of(await client.call("count__slow", {"tag": token, "seconds": SLOW_SECONDS}))) != token:
            raise Wrong(f"slow {token} answered {text!r}")
        tally.answered[token] = "slow"
    elif kind == "cancel":
        tally.requests += 1
        tally.cancelled.add(token)
        await client.cancel(token, tally)
    elif kind == "approve":  # write needs a person's yes, which the client gives
        await client.approve(token, tally)
    else:
        raise AssertionError(kind)


@dataclass
class Plan:
    clients: int
    eras: tuple[str, ...]
    deadline: float | None  # monotonic time to stop at, or None: stop after `operations`
    operations: int
    sample_every: int
    mix: str = "mixed"
    seed: int = 31


class Run:
    def __init__(self, cluster: Cluster, plan: Plan) -> None:
        self.cluster, self.plan = cluster, plan
        self.tally = Tally()
        self.done = 0
        self.tokens = itertools.count()
        self.started = time.monotonic()

    def more(self) -> bool:
        if self.plan.deadline is not None:
            return time.monotonic() < self.plan.deadline
        return next(self.tokens) < self.plan.operations  # one ticket per operation, shared by all clients

    def sample(self) -> None:
        self.tally.samples.append({"operations": self.done, "seconds": time.monotonic() - self.started,
                                   "rss_kib": {r.name: r.rss_kib() for r in self.cluster.replicas}})

    async def client(self, index: int, http: httpx2.AsyncClient) -> None:
        era = self.plan.eras[index % len(self.plan.eras)]
        identity = IDENTITIES[index % len(IDENTITIES)]
        rng = random.Random(self.plan.seed * 1000 + index)
        kinds, weights = zip(*MIXES[self.plan.mix])
        client = (Modern if era == "modern" else Legacy)(http, self.cluster.url, self.cluster.keys[identity])
        in_session = 0
        serial = itertools.count()
        while self.more():
            kind = rng.choices(kinds, weights)[0]
            token = f"{era[0]}{index}-{next(serial)}-{kind}"
            began = time.monotonic()
            try:
                if era == "legacy" and client.session is None:
                    self.tally.requests += 2
                    await client.open()
                await operation(client, kind, token, self.tally)
                self.tally.latencies[f"{era} {kind}"].append(time.monotonic() - began)
                in_session += 1
                if era == "legacy" and in_session >= SESSION_OPERATIONS:
                    self.tally.requests += 1
                    in_session = 0
                    await client.close()
            except (Wrong, httpx2.HTTPError, KeyError, ValueError) as failure:
                self.tally.error(f"{era} {kind}", f"{type(failure).__name__}: {failure}", began)
                if era == "legacy":
                    client.session, in_session = None, 0  # a session that failed once is not trusted again
            self.tally.operations[f"{era} {kind}"] += 1
            self.done += 1
            if self.done % self.plan.sample_every == 0:
                self.sample()
        if era == "legacy":
            try:
                await client.close()
            except (Wrong, httpx2.HTTPError) as failure:
                self.tally.error("legacy close", str(failure))

    async def go(self) -> None:
        limits = httpx2.Limits(max_connections=self.plan.clients * 2, max_keepalive_connections=self.plan.clients)
        async with httpx2.AsyncClient(timeout=CLIENT_TIMEOUT, limits=limits) as http:
            self.sample()
            self.started = time.monotonic()
            await asyncio.gather(*(self.client(i, http) for i in range(self.plan.clients)))
            self.elapsed = time.monotonic() - self.started
            self.sample()


def check_marks(cluster: Cluster, tally: Tally, settle_seconds: float = 60.0) -> dict[str, Any]:
    """What the counting servers ran, against what the clients were answered: every answered call ran once, none
    twice, no cancelled call ran to its end, and every cancelled call that reached a server was cancelled there
    (waited for: a cancellation is a notification that may still be on its way)."""
    deadline = time.monotonic() + settle_seconds
    while True:
        marks = [m for m in read_marks(cluster.marks) if LOAD_TAG.match(m[2])]  # this load's, not a test's before
        ends: Counter = Counter(token for event, _, token in marks if event in ("run", "done"))
        starts = {token for event, _, token in marks if event == "start"}
        stopped = {token for event, _, token in marks if event == "cancelled"}
        unsettled = {t for t in tally.cancelled if t in starts and t not in stopped and ends[t] == 0}
        if not unsettled or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return {
        "answered": len(tally.answered),
        "answered_not_run": sorted(t for t in tally.answered if ends[t] == 0)[:20],
        "run_twice": sorted(t for t, n in ends.items() if n > 1)[:20],
        "cancelled": len(tally.cancelled),
        "cancelled_but_finished": sorted(t for t in tally.cancelled if ends[t])[:20],
        "cancelled_never_stopped": sorted(unsettled)[:20],
        "cancelled_reached_server": len(tally.cancelled & starts),
        "ran_unasked": sorted(t for t in ends if t not in tally.answered and t not in tally.cancelled)[:20],
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def slope_kib_per_minute(samples: list[dict[str, Any]], name: str) -> float:
    """Least-squares slope of one replica's RSS over time, in KiB a minute."""
    xs = [s["seconds"] / 60 for s in samples]
    ys = [s["rss_kib"][name] for s in samples]
    if len(xs) < 2 or max(xs) == min(xs):
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes and their descendants' that ended, from /proc/PID/stat."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    return total / ticks


def session_pids(leader: int) -> list[int]:
    """Every live process of the session a replica leads (the gateway, its servers and their sandboxes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == leader:  # the session id
                found.append(int(entry.name))
    return found


def cpu_figures(cluster: Cluster) -> dict[str, float]:
    figures = {f"replica {r.name}": cpu_seconds(session_pids(r.process.pid)) for r in cluster.replicas}
    figures["haproxy"] = cpu_seconds([cluster.haproxy.process.pid])
    if cluster.redis is not None and cluster.redis.process is not None:
        figures["redis"] = cpu_seconds([cluster.redis.process.pid])
    figures["client"] = cpu_seconds([os.getpid()])
    return figures


def run_load(cluster: Cluster, plan: Plan) -> dict[str, Any]:
    before = cpu_figures(cluster)
    run = Run(cluster, plan)
    asyncio.run(run.go())
    after = cpu_figures(cluster)
    cpu = {name: after[name] - before.get(name, 0.0) for name in after}
    tally = run.tally
    warm = [s for s in tally.samples if s["operations"] >= tally.samples[-1]["operations"] * 0.25]
    everything = [t for values in tally.latencies.values() for t in values]
    replica_cpu = sum(v for k, v in cpu.items() if k.startswith("replica"))
    return {
        "replicas": len(cluster.replicas), "clients": plan.clients, "eras": list(plan.eras), "mix": plan.mix,
        "redis": cluster.redis is not None, "seconds": run.elapsed, "operations": sum(tally.operations.values()),
        "requests": tally.requests, "requests_per_s": tally.requests / run.elapsed,
        "p50_ms": percentile(everything, 0.5) * 1000, "p99_ms": percentile(everything, 0.99) * 1000,
        "by_kind": {kind: {"count": len(values), "p50_ms": percentile(values, 0.5) * 1000,
                           "p99_ms": percentile(values, 0.99) * 1000}
                    for kind, values in sorted(tally.latencies.items())},
        "errors": sum(tally.errors.values()), "errors_by_kind": dict(tally.errors), "error_examples": tally.examples,
        "marks": check_marks(cluster, tally),
        "cpu_seconds": cpu, "requests_per_replica_cpu_second": tally.requests / replica_cpu if replica_cpu else 0.0,
        "requests_per_cpu_second_all": tally.requests / sum(cpu.values()) if sum(cpu.values()) else 0.0,
        "rss_samples": tally.samples,
        "rss_after_warmup_kib": {r.name: {"first": warm[0]["rss_kib"][r.name], "last": warm[-1]["rss_kib"][r.name],
                                          "max": max(s["rss_kib"][r.name] for s in warm),
                                          "slope_kib_per_min": slope_kib_per_minute(warm, r.name)}
                                 for r in cluster.replicas},
    }


def render(report: dict[str, Any]) -> str:
    lines = [f"{report['replicas']} replica(s) behind HAProxy{' on Redis' if report['redis'] else ''}, "
             f"{report['mix']} traffic of {report['clients']} clients ({', '.join(report['eras'])}): "
             f"{report['operations']} operations, "
             f"{report['requests']} requests in {report['seconds']:.1f} s = {report['requests_per_s']:.0f} requests/s, "
             f"p50 {report['p50_ms']:.1f} ms, p99 {report['p99_ms']:.1f} ms, errors {report['errors']}"]
    for kind, figures in report["by_kind"].items():
        lines.append(f"  {kind:16} {figures['count']:7d}  p50 {figures['p50_ms']:8.1f} ms  "
                     f"p99 {figures['p99_ms']:8.1f} ms")
    lines.append("  CPU seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in report["cpu_seconds"].items()))
    lines.append(f"  requests per replica CPU-second {report['requests_per_replica_cpu_second']:.0f}, per CPU-second "
                 f"of everything {report['requests_per_cpu_second_all']:.0f}")
    for name, rss in report["rss_after_warmup_kib"].items():
        lines.append(f"  RSS {name} after warm-up: {rss['first'] / 1024:.1f} -> {rss['last'] / 1024:.1f} MiB "
                     f"(max {rss['max'] / 1024:.1f}), slope {rss['slope_kib_per_min']:+.0f} KiB/min")
    lines.append("  marks: " + json.dumps(report["marks"]))
    lines.extend(f"  error: {e}" for e in report["error_examples"])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, help="run this long (default: --operations)")
    parser.add_argument("--operations", type=int, default=3000, help="operations in all, when --minutes is not given")
    parser.add_argument("--replicas", type=int, choices=(1, 3), default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--eras", default="modern,legacy")
    parser.add_argument("--mix", choices=sorted(MIXES), default="mixed",
                        help="mixed: calls, lists, long calls, cancellations, approvals; calls: short calls and lists")
    parser.add_argument("--sample-every", type=int, default=500, help="RSS sampled every this many operations")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    eras = tuple(e.strip() for e in args.eras.split(",") if e.strip())
    if not set(eras) <= {"modern", "legacy"}:
        parser.error("--eras: modern and/or legacy")
    folder = Path(tempfile.mkdtemp(prefix="bastion-load-"))
    with Cluster(folder, replicas_count=args.replicas, http=LOAD_HTTP) as cluster:
        print(f"cluster up: {cluster.url} ({folder})", file=sys.stderr)
        deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
        report = run_load(cluster, Plan(args.clients, eras, deadline, args.operations, args.sample_every,
                                           args.mix))
    print(json.dumps(report) if args.json else render(report))


# Room for the load itself: every client an identity of four, each holding sessions on every replica.
LOAD_HTTP = {"max_sessions_per_identity": 1000}

if __name__ == "__main__":
    main()
