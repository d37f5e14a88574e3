"""A long fault run: the mixed load of bench/load.py (both eras, through HAProxy to three replicas on Redis) for
``--minutes`` while faults are injected one at a time, in a seeded random order, at random gaps; then the checks.

Faults (each names what it observes; the kind of each is in FAULTS):

  server_kill     SIGKILL a replica's counting server while a call waits on it: that call fails at once, the
                  replica's next calls are answered again
  server_stop     SIGSTOP a replica's counting server (its stdin stops being read) and burst calls at it: the pipe
                  fills, past ``http.max_in_flight_per_server`` calls are refused with -32000 and retryAfterSeconds,
                  the rest are answered once SIGCONT lets it read again
  big_results     a 10 MB result (answered whole) and a 100 MB one (over ``max_message_bytes``: a clear error)
  sse_stall       a handshake-era session subscribed to a resource whose GET stream is never read, while the
                  server announces 3 MB of updates: the other clients keep being answered
  resource_burst  subscribers on one replica and concurrent writers announcing updates of one resource: each
                  subscriber gets every update, each writer's in the order it sent them
  audit_full      the audit trail of one replica (on a small tmpfs this run mounts) on a full disk, then freed:
                  the replica says the trail is written again
  gateway_kill    SIGKILL one replica's gateway process alone (its servers and sandboxes stay, spawned and not
                  released): they all end on their own; the replica is started again
  replica_kill    SIGKILL a replica's whole process group: HAProxy takes it out; started again, taken back
  redis_restart   Redis stopped and started again on its port

A clock jump is not injected: moving one process's clock needs libfaketime preloaded into it at its start (and the
system clock is every process's on the machine); see docs/testing.md.

Sampled every few seconds: each replica's gateway open file descriptors (/proc/PID/fd), its process tree (the gateway,
its servers, their sandboxes) and RSS; HAProxy's and Redis's fds and RSS; processes of this run whose parent died
(PPID 1, bwrap or servers). Checks at the end: no request hung (every load request answered or ended with an error
within its deadline: a JSON-RPC error, an HTTP status, or a connection cut while a replica or Redis was down), no
wrong answer, no error outside a fault's window, every fault's own expectations met, no call ran twice, fds and
processes back to their baseline once the faults settled, no orphan, and each replica's RSS slope after warm-up
under a bound (over a span of at least ``--rss-min-span`` minutes). Prints the summary (text, or JSON with
``--json``; ``--out FILE`` writes the JSON too) and exits 1 when a check fails.

Usage: .venv/bin/python bench/fault_run.py [--minutes 30] [--seed N] [--clients 12] [--gap 20,60] [--faults a,b]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import httpx2  # noqa: E402

from load import LOAD_HTTP, Legacy, Modern, Plan, Run, Tally, Wrong, check_marks  # noqa: E402
from tests.replicas.cluster import IDENTITIES, Cluster, Replica  # noqa: E402

FAULTS = ("server_kill", "server_stop", "big_results", "sse_stall", "resource_burst", "audit_full", "gateway_kill",
          "replica_kill", "redis_restart")
REQUEST_BOUND = 120.0  # a probe's request not answered in this long is a hang (the load's own: load.CLIENT_TIMEOUT)
FAULT_BOUND = 300.0  # one fault, with its settling, must end in this long, however loaded the machine
GRACE = 30.0  # errors this long after a fault ended still belong to it (retries, a replica catching up)
SETTLE_BOUND = 120.0  # after the run, fds and processes must be back to their baseline within this long
FD_SLACK = 16  # fds a replica may hold beyond its baseline at rest (pooled Redis and balancer connections)
BIG, OVER = 10_000_000, 100_000_000
STALL_EVENTS, STALL_PAD = 3000, 4000  # resource updates sent to a stream never read: 12 MB, far past socket buffers
AUDIT_DISK = "size=256m,mode=0700"
REDIS_POOL = 32  # state.max_connections, the default the replicas run with (bastion/state/config.py)


# --- what the processes hold, from /proc --------------------------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def parents() -> dict[int, int]:
    """pid -> parent pid of every live process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None and fields[0] != "Z":
            found[int(entry.name)] = int(fields[1])
    return found


def descendants(root: int, tree: dict[int, int] | None = None) -> list[int]:
    tree = parents() if tree is None else tree
    children: dict[int, list[int]] = {}
    for pid, ppid in tree.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def tcp_peers() -> dict[str, tuple[int, int]]:
    """socket inode -> (local port, remote port) of every TCP socket on the machine."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                found[fields[9]] = (int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16))
    return found


_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
               "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


def sockets_besides(pid: int, redis_port: int | None) -> dict[str, int]:
    """A process's sockets other than its Redis connections, counted by what they are: ``tcp :LOCAL->:REMOTE
    STATE`` (the listening port and client ports folded), ``unix``, or ``unknown``: what to look at when they are
    not back at rest."""
    tcp: dict[str, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                local, remote = (int(f.rsplit(":", 1)[1], 16) for f in fields[1:3])
                tcp[fields[9]] = f"{local}->{remote} {_TCP_STATES.get(fields[3], fields[3])}"
    unix: set[str] = set()
    with contextlib.suppress(OSError):
        unix = {row.split()[6] for row in Path("/proc/net/unix").read_text().splitlines()[1:] if len(row.split()) > 6}
    kinds: dict[str, int] = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return kinds
    for name in names:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            if not target.startswith("socket:["):
                continue
            inode = target[8:-1]
            if inode in tcp:
                if redis_port is not None and tcp[inode].split(" ")[0].endswith(f"->{redis_port}"):
                    continue
                what = "tcp " + tcp[inode]
            else:
                what = "unix" if inode in unix else "unknown"
            kinds[what] = kinds.get(what, 0) + 1
    return kinds


def fd_kinds(pid: int, redis_port: int | None, peers: dict[str, tuple[int, int]]) -> dict[str, int]:
    """A process's open fds by what they are: ``redis`` (TCP connections to Redis: a pool, bounded by
    ``state.max_connections``), ``socket`` (other sockets), ``pipe``, ``file``, ``other``."""
    kinds = {"redis": 0, "socket": 0, "pipe": 0, "file": 0, "other": 0}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return kinds
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            ports = peers.get(target[8:-1])
            kinds["redis" if ports is not None and ports[1] == redis_port else "socket"] += 1
        elif target.startswith("pipe:"):
            kinds["pipe"] += 1
        elif target.startswith("/"):
            kinds["file"] += 1
        else:
            kinds["other"] += 1
    return kinds


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def mentions(pid: int, tag: str) -> bool:
    """Whether a process's command line or environment names this run's folder (its servers and sandboxes do)."""
    if tag in cmdline(pid):
        return True
    try:
        return tag.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def orphans(tag: str, tree: dict[int, int]) -> list[str]:
    """This run's processes whose parent is init: left behind by a gateway that died."""
    return [f"{pid} {cmdline(pid)[:120]}" for pid, ppid in tree.items() if ppid == 1 and mentions(pid, tag)]


def system_bwrap_orphans(tree: dict[int, int]) -> int:
    """bwrap processes with PPID 1 on the whole machine (anyone's: reported, not checked)."""
    return sum(1 for pid, ppid in tree.items() if ppid == 1 and Path(cmdline(pid).split(" ", 1)[0]).name == "bwrap")


def system_zombies() -> int:
    """Zombies whose parent is init on the whole machine: where init does not reap (a container's), every orphan
    that ends stays one; reported, not checked."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            count += fields[0] == "Z" and fields[1] == "1"
    return count


def server_pid(replica: Replica) -> int | None:
    """The counting server's own Python process under a replica (inside its sandbox, when it has one)."""
    assert replica.process is not None
    for pid in descendants(replica.process.pid):
        line = cmdline(pid)
        if "counting_server.py" in line and Path(line.split(" ", 1)[0]).name != "bwrap":
            return pid
    return None


def snapshot(cluster: Cluster, tag: str, started: float) -> dict[str, Any]:
    tree = parents()
    peers = tcp_peers()
    redis_port = cluster.redis.port if cluster.redis is not None else None
    replicas = {}
    for replica in cluster.replicas:
        pid = replica.process.pid if replica.process is not None and replica.process.poll() is None else None
        replicas[replica.name] = None if pid is None else {
            "pid": pid, "fds": fd_count(pid), "fd_kinds": fd_kinds(pid, redis_port, peers),
            "processes": 1 + len(descendants(pid, tree)), "rss_kib": rss_kib(pid)}
    others = {}
    for name, process in (("haproxy", cluster.haproxy.process if cluster.haproxy else None),
                          ("redis", cluster.redis.process if cluster.redis else None)):
        pid = process.pid if process is not None and process.poll() is None else None
        others[name] = None if pid is None else {"pid": pid, "fds": fd_count(pid), "rss_kib": rss_kib(pid)}
    return {"seconds": round(time.monotonic() - started, 1), "replicas": replicas, **others,
            "orphans": orphans(tag, tree), "system_bwrap_orphans": system_bwrap_orphans(tree),
            "system_init_zombies": system_zombies()}


class Sampler:
    """Samples on a thread of its own every ``every`` seconds, so that a stalled event loop does not stop it."""

    def __init__(self, cluster: Cluster, tag: str, started: float, every: float) -> None:
        self.cluster, self.tag, self.started, self.every = cluster, tag, started, every
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            with contextlib.suppress(Exception):  # a process ending between two reads of /proc
                self.samples.append(snapshot(self.cluster, self.tag, self.started))

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- the load's errors, by kind -----------------------------------------------------------------------------------

TIMEOUTS = ("ReadTimeout", "WriteTimeout", "PoolTimeout", "ConnectTimeout", "TimeoutException", "TimeoutError")
CUTS = ("RemoteProtocolError", "ReadError", "WriteError", "ConnectError", "a stream with no answer",
        "the stream ended without an answer", "CloseError")


def error_kind(what: str) -> str:
    """hung (no answer within the deadline), jsonrpc (an error answer), http (a status), cut (the connection ended
    without an answer), wrong (an answer that is not the right one)."""
    if what.startswith(TIMEOUTS):
        return "hung"
    if "error {" in what or "'error': {'code'" in what:  # an error answer, also where another was awaited
        return "jsonrpc"
    if "HTTP " in what:
        return "http"
    if any(cut in what for cut in CUTS):
        return "cut"
    return "wrong"


class FaultLoad(Run):
    """The load of bench/load.py; its samples are this run's Sampler's (a replica may be down when the load ends)."""

    def sample(self) -> None:
        pass


class TimedTally(Tally):
    """The load's tally, each error with the time it happened, to be set against the faults' windows."""

    def __init__(self) -> None:
        super().__init__()
        self.timeline: list[tuple[float, float, str, str]] = []  # (began, ended, kind, what)

    def error(self, kind: str, what: str, began: float | None = None) -> None:
        ended = time.monotonic()
        self.timeline.append((ended if began is None else began, ended, kind, what))
        super().error(kind, what, began)


# --- the faults ---------------------------------------------------------------------------------------------------

@dataclass
class Faults:
    cluster: Cluster
    rng: random.Random
    audit_disk: Path | None
    audit_replica: str | None
    no_disk_reason: str = ""
    serial: int = 0

    def key(self, n: int = 0) -> str:
        return self.cluster.keys[IDENTITIES[n % len(IDENTITIES)]]

    def pick(self) -> Replica:
        return self.rng.choice(self.cluster.replicas)

    def direct(self, http: httpx2.AsyncClient, replica: Replica, n: int = 0) -> Modern:
        return Modern(http, replica.base + "/mcp", self.key(n))

    async def answered(self, replica: Replica, tag: str) -> float:
        """Echo calls straight to a replica until one is answered with its tag; the seconds that took."""
        began = time.monotonic()
        async with httpx2.AsyncClient(timeout=REQUEST_BOUND) as http:
            while True:
                with contextlib.suppress(Wrong, httpx2.HTTPError, KeyError, ValueError):
                    message = await self.direct(http, replica).call("count__echo", {"tag": tag})
                    if message.get("result", {}).get("content", [{}])[0].get("text") == tag:
                        return time.monotonic() - began
                if time.monotonic() - began > FAULT_BOUND / 2:
                    raise AssertionError(f"{replica.name} answered no call for {FAULT_BOUND / 2:.0f} s")
                await asyncio.sleep(0.2)

    async def server_kill(self, tag: str) -> dict[str, Any]:
        replica = self.pick()
        async with httpx2.AsyncClient(timeout=REQUEST_BOUND) as http:
            call = asyncio.create_task(self.direct(http, replica).call("count__slow", {"tag": tag, "seconds": 60}))
            await wait_for_mark(self.cluster, f"start {replica.name} {tag}", call)
            pid = server_pid(replica)
            assert pid is not None, f"no counting server under {replica.name}"
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            try:
                message = await asyncio.wait_for(call, REQUEST_BOUND)
                outcome = f"error {message['error']}" if "error" in message else f"answered {message}"
            except (Wrong, httpx2.HTTPError) as failure:
                outcome = f"{type(failure).__name__}: {failure}"
            failed_after = time.monotonic() - killed
        problems = [] if outcome.startswith("error") else [f"the call on the killed server: {outcome[:200]}"]
        back = await self.answered(replica, f"{tag}-after")
        return {"replica": replica.name, "call": outcome[:200], "call_failed_after_s": round(failed_after, 2),
                "answered_again_after_s": round(back, 2), "problems": problems}

    async def server_stop(self, tag: str) -> dict[str, Any]:
        replica = self.pick()
        pid = server_pid(replica)
        assert pid is not None, f"no counting server under {replica.name}"
        stop_seconds = self.rng.uniform(4, 10)
        tags = [f"{tag}-{n}-" + "x" * 4000 for n in range(100)]  # 400 KB of arguments: far past a pipe's 64 KiB
        os.kill(pid, signal.SIGSTOP)
        while (state := _stat(pid)) is not None and state[0] not in "Tt":  # stopped before the first call is sent
            await asyncio.sleep(0.01)
        try:
            async with httpx2.AsyncClient(timeout=REQUEST_BOUND, limits=httpx2.Limits(max_connections=200)) as http:
                calls = [asyncio.create_task(self.direct(http, replica, n).call("count__echo", {"tag": t}))
                         for n, t in enumerate(tags)]
                await asyncio.wait(calls, timeout=stop_seconds)
                refused_while_stopped = sum(1 for c in calls if c.done())
                state_while_stopped = (_stat(pid) or ["gone"])[0]
                os.kill(pid, signal.SIGCONT)
                await asyncio.wait(calls, timeout=REQUEST_BOUND)
        finally:
            os.kill(pid, signal.SIGCONT)
        counts = {"answered": 0, "refused_retry_after": 0}
        problems = []
        for call, t in zip(calls, tags):
            if not call.done():
                problems.append("a call never answered after SIGCONT")
                call.cancel()
                continue
            try:
                message = call.result()
            except (Wrong, httpx2.HTTPError) as failure:
                problems.append(f"{type(failure).__name__}: {str(failure)[:160]}")
                continue
            if "error" in message:
                error = message["error"]
                if error.get("code") == -32000 and (error.get("data") or {}).get("retryAfterSeconds"):
                    counts["refused_retry_after"] += 1
                else:
                    problems.append(f"error {str(error)[:160]}")
            elif message["result"]["content"][0]["text"] == t:
                counts["answered"] += 1
            else:
                problems.append("a wrong answer")
        if counts["refused_retry_after"] == 0:
            problems.append("no call was refused with retryAfterSeconds while the server read nothing")
        return {"replica": replica.name, "stopped_s": round(stop_seconds, 1),
                "done_while_stopped": refused_while_stopped,
                "state_while_stopped": state_while_stopped, **counts, "problems": problems[:10]}

    async def big_results(self, tag: str) -> dict[str, Any]:
        problems = []
        found: dict[str, Any] = {}
        async with httpx2.AsyncClient(timeout=REQUEST_BOUND) as http:
            client = Modern(http, self.cluster.url, self.key())
            began = time.monotonic()
            message = await client.call("count__big", {"size": BIG})
            found["10MB_s"] = round(time.monotonic() - began, 2)
            text = message.get("result", {}).get("content", [{}])[0].get("text", "")
            if len(text) != BIG:
                problems.append(f"the 10 MB result: {str(message)[:200]}")
            began = time.monotonic()
            try:
                message = await client.call("count__big", {"size": OVER})
                found["over_limit"] = str(message.get("error", "answered whole"))[:200]
                if "error" not in message or not message["error"].get("message"):
                    problems.append("the 100 MB result was not refused with a clear error")
            except Wrong as failure:  # an HTTP status is a clear answer too
                found["over_limit"] = str(failure)[:200]
            found["100MB_s"] = round(time.monotonic() - began, 2)
        return {**found, "problems": problems}

    async def open_session(self, http: httpx2.AsyncClient, replica: Replica, uri: str) -> Legacy:
        session = Legacy(http, replica.base + "/mcp", self.key(1))
        await session.open()
        return session

    async def subscribe(self, session: Legacy, uri: str) -> None:
        message = await session.request("resources/subscribe", {"uri": uri})
        if "error" in message:
            raise Wrong(f"resources/subscribe: error {message['error']}")

    async def sse_stall(self, tag: str) -> dict[str, Any]:
        replica = self.pick()
        uri = "count://stall"
        async with httpx2.AsyncClient(timeout=REQUEST_BOUND) as http:
            session = await self.open_session(http, replica, uri)
            stalled = await asyncio.to_thread(open_unread_stream, replica, session.headers())
            try:
                await self.subscribe(session, uri)
                began = time.monotonic()
                message = await self.direct(http, replica).call("count__announce", {
                    "tag": tag, "uri": uri, "writer": "s", "count": STALL_EVENTS, "pad": STALL_PAD})
                announced = time.monotonic() - began
                other = await self.answered(replica, f"{tag}-other")
                ended = await asyncio.to_thread(stream_ends, stalled, 30.0)
            finally:
                stalled.close()
                with contextlib.suppress(Wrong, httpx2.HTTPError):
                    await session.close()
        problems = [] if "result" in message else [f"announce: {str(message)[:200]}"]
        # Told why (the stream ended past http.stream_buffer_messages, saying so) or nothing lost: a session the
        # replicas share feeds its GET stream from its log in the store as the client reads, so it may be whole.
        if not ended["told_why"] and ended["bytes_read_late"] < STALL_EVENTS * STALL_PAD:
            problems.append(f"the stream never read lost events without saying why: {ended}")
        return {"replica": replica.name, "announce_s": round(announced, 2), "other_call_s": round(other, 2),
                "stalled_stream": ended, "problems": problems}

    async def resource_burst(self, tag: str) -> dict[str, Any]:
        replica = self.pick()
        uri = "count://burst"
        writers, each, subscribers = 4, 25, 3
        async with httpx2.AsyncClient(timeout=REQUEST_BOUND) as http:
            sessions = [await self.open_session(http, replica, uri) for _ in range(subscribers)]
            heard: list[list[tuple[str, int]]] = [[] for _ in sessions]
            opened = [asyncio.Event() for _ in sessions]
            readers = [asyncio.create_task(listen(http, s, uri, got, ready))
                       for s, got, ready in zip(sessions, heard, opened)]
            try:
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in opened)), REQUEST_BOUND)
                for session in sessions:
                    await self.subscribe(session, uri)
                answers = await asyncio.gather(*(self.direct(http, replica, w).call(
                    "count__announce", {"tag": f"{tag}-w{w}", "uri": uri, "writer": f"w{w}", "count": each})
                    for w in range(writers)))
                deadline = time.monotonic() + REQUEST_BOUND
                while any(len(got) < writers * each for got in heard) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
            finally:
                for reader in readers:
                    reader.cancel()
                await asyncio.gather(*readers, return_exceptions=True)
                for session in sessions:
                    with contextlib.suppress(Wrong, httpx2.HTTPError):
                        await session.close()
        problems = [f"announce: {str(a)[:160]}" for a in answers if "result" not in a]
        for n, got in enumerate(heard):
            for w in range(writers):
                sequence = [seq for writer, seq in got if writer == f"w{w}"]
                if sequence != list(range(each)):
                    problems.append(f"subscriber {n} heard writer w{w} as {sequence[:30]}")
        return {"replica": replica.name, "heard": [len(got) for got in heard], "problems": problems[:10]}

    async def audit_full(self, tag: str) -> dict[str, Any]:
        if self.audit_disk is None or self.audit_replica is None:
            return {"skipped": self.no_disk_reason, "problems": []}
        replica = self.cluster.replica(self.audit_replica)
        said_before = replica.log().count("the audit trail is written again")
        filler = await asyncio.to_thread(fill, self.audit_disk)
        held = self.rng.uniform(3, 8)
        try:
            await asyncio.sleep(held)
            failing = "the audit trail cannot be written" in replica.log()
        finally:
            filler.unlink()
        began = time.monotonic()
        while replica.log().count("the audit trail is written again") <= said_before:
            await self.answered(replica, f"{tag}-{int(time.monotonic() - began)}")
            if time.monotonic() - began > FAULT_BOUND / 2:
                return {"replica": replica.name, "problems": ["the trail was never written again"]}
            await asyncio.sleep(0.2)
        return {"replica": replica.name, "full_s": round(held, 1), "said_it_cannot_write": failing,
                "written_again_after_s": round(time.monotonic() - began, 2), "problems": []}

    async def gateway_kill(self, tag: str) -> dict[str, Any]:
        replica = self.pick()
        assert replica.process is not None
        left = descendants(replica.process.pid)
        os.kill(replica.process.pid, signal.SIGKILL)  # the gateway alone: what it spawned is not released by it
        await asyncio.to_thread(replica.process.wait)
        began = time.monotonic()
        while (alive := [p for p in left if _stat(p) not in (None,) and _stat(p)[0] != "Z"]) and \
                time.monotonic() - began < 30:
            await asyncio.sleep(0.1)
        problems = [f"left behind: {p} {cmdline(p)[:100]}" for p in alive]
        for pid in alive:  # ended here so that the run goes on; counted as a problem above
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        ended_after = time.monotonic() - began
        restart = await self.restart(replica)
        return {"replica": replica.name, "processes_left": len(left), "all_ended_after_s": round(ended_after, 2),
                **restart, "problems": problems}

    async def replica_kill(self, tag: str) -> dict[str, Any]:
        replica = self.pick()
        await asyncio.to_thread(replica.kill)
        return {"replica": replica.name, **await self.restart(replica), "problems": []}

    async def restart(self, replica: Replica) -> dict[str, Any]:
        assert self.cluster.haproxy is not None
        began = time.monotonic()
        await asyncio.to_thread(self.cluster.haproxy.wait_states, {replica.name: "DOWN"})
        out = time.monotonic() - began
        await asyncio.to_thread(replica.start)
        await asyncio.to_thread(self.cluster.haproxy.wait_states, {replica.name: "UP"})
        return {"taken_out_after_s": round(out, 2), "back_after_s": round(time.monotonic() - began, 2)}

    async def redis_restart(self, tag: str) -> dict[str, Any]:
        if self.cluster.redis is None:
            return {"skipped": "no Redis", "problems": []}
        began = time.monotonic()
        await asyncio.to_thread(self.cluster.redis.stop)
        await asyncio.sleep(self.rng.uniform(0.5, 3))
        await asyncio.to_thread(self.cluster.redis.start)
        down = time.monotonic() - began
        back = max([await self.answered(r, f"{tag}-{r.name}") for r in self.cluster.replicas])
        return {"down_s": round(down, 2), "replicas_answer_after_s": round(back, 2), "problems": []}


async def wait_for_mark(cluster: Cluster, line: str, call: asyncio.Task) -> None:
    """Until the counting servers' marks hold ``line`` (read from where the file ends now, so a long run's file is not
    read whole every time); fails if the call ends first or nothing comes."""
    offset = max(0, cluster.marks.stat().st_size - 65536) if cluster.marks.exists() else 0
    deadline = time.monotonic() + REQUEST_BOUND
    while time.monotonic() < deadline:
        if call.done():
            raise AssertionError(f"the call ended before the server got it: {call.result()}")
        with cluster.marks.open("rb") as marks:
            marks.seek(offset)
            if line.encode() in marks.read():
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no mark {line!r}")


async def listen(http: httpx2.AsyncClient, session: Legacy, uri: str, got: list[tuple[str, int]],
                 ready: asyncio.Event) -> None:
    """A session's GET stream: every resources/updated of ``uri`` it carries, as (writer, seq)."""
    async with http.stream("GET", session.url, headers={**session.headers(), "accept": "text/event-stream"}) as stream:
        if stream.status_code != 200:
            raise Wrong(f"GET stream: HTTP {stream.status_code}")
        ready.set()
        async for line in stream.aiter_lines():
            if line.startswith("data:") and line[5:].strip():
                message = json.loads(line[5:])
                params = message.get("params") or {}
                if message.get("method") == "notifications/resources/updated" and params.get("uri") == uri:
                    meta = params.get("_meta") or {}
                    got.append((meta.get("writer"), meta.get("seq")))


def open_unread_stream(replica: Replica, headers: dict[str, str]) -> socket.socket:
    """A session's GET stream on a socket with a small receive buffer that this run never reads past its headers."""
    stream = socket.socket()
    stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stream.settimeout(REQUEST_BOUND)
    stream.connect(("127.0.0.1", replica.port))
    lines = ["GET /mcp HTTP/1.1", f"host: 127.0.0.1:{replica.port}",
             *(f"{k}: {v}" for k, v in {**headers, "accept": "text/event-stream"}.items()
               if k != "content-type")]
    stream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = stream.recv(1)
        if not chunk:
            raise AssertionError(f"the GET stream closed at once: {head!r}")
        head += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        raise AssertionError(f"the GET stream: {head[:200]!r}")
    return stream


def stream_ends(stream: socket.socket, seconds: float) -> dict[str, Any]:
    """Read the stalled stream now, for at most ``seconds`` (heartbeats keep an open one alive): whether the gateway
    ended it, and whether its last event says why."""
    deadline = time.monotonic() + seconds
    read, tail, how = 0, b"", "still open"
    try:
        while time.monotonic() < deadline:
            stream.settimeout(max(0.1, deadline - time.monotonic()))
            chunk = stream.recv(65536)
            if not chunk:
                how = "ended by the gateway"
                break
            read += len(chunk)
            tail = (tail + chunk)[-4096:]
    except socket.timeout:
        pass
    except OSError as error:
        how = f"reset: {error}"
    return {"how": how, "bytes_read_late": read, "told_why": b"stream_buffer_messages" in tail}


def fill(disk: Path) -> Path:
    """A file that takes every free byte of the disk; deleting it frees them."""
    import errno

    filler = disk / "filler"
    with filler.open("wb", buffering=0) as out:
        for size in (1 << 20, 65536, 4096, 256, 1):
            block = b"\0" * size
            try:
                while out.write(block):
                    pass
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
    return filler


def schedule(rng: random.Random, kinds: list[str]) -> Callable[[], str]:
    """The next fault: every kind once per round, each round in a new random order."""
    queue: list[str] = []

    def next_kind() -> str:
        if not queue:
            queue.extend(rng.sample(kinds, len(kinds)))
        return queue.pop(0)
    return next_kind


@dataclass
class Options:
    minutes: float = 30.0
    seed: int = 0
    clients: int = 12
    gap: tuple[float, float] = (20.0, 60.0)
    faults: tuple[str, ...] = FAULTS
    warmup_seconds: float = 20.0
    sample_seconds: float = 5.0
    rss_slope_kib_per_min: float = 1024.0
    rss_min_span_minutes: float = 5.0
    rss_warmup_seconds: float = 120.0


async def inject(faults: Faults, options: Options, deadline: float, windows: list[dict[str, Any]]) -> None:
    rng = random.Random(options.seed + 1)
    next_kind = schedule(rng, list(options.faults))
    await asyncio.sleep(rng.uniform(*options.gap) / 2)
    while time.monotonic() < deadline:
        kind = next_kind()
        faults.serial += 1
        tag = f"fault{faults.serial}-{kind}"
        window: dict[str, Any] = {"kind": kind, "start": time.monotonic()}
        windows.append(window)
        print(f"fault {faults.serial}: {kind}", file=sys.stderr, flush=True)
        try:
            window["result"] = await asyncio.wait_for(getattr(faults, kind)(tag), FAULT_BOUND)
        except Exception as failure:  # noqa: BLE001 - a fault that could not be made or settled is a finding
            window["result"] = {"problems": [f"{type(failure).__name__}: {str(failure)[:300]}"]}
        window["end"] = time.monotonic()
        print(f"  {json.dumps(window['result'])[:300]}", file=sys.stderr, flush=True)
        await asyncio.sleep(rng.uniform(*options.gap))


async def warm_up(cluster: Cluster, options: Options) -> None:
    """Every kind of operation for a while before the baseline, so that pools and caches have their size."""
    run = FaultLoad(cluster, Plan(options.clients, ("modern", "legacy"), time.monotonic() + options.warmup_seconds, 0,
                            10**9, seed=options.seed))
    await run.go()
    async with httpx2.AsyncClient(timeout=REQUEST_BOUND) as http:
        await Modern(http, cluster.url, cluster.keys[IDENTITIES[0]]).call("count__big", {"size": BIG})


async def load_with_faults(cluster: Cluster, faults: Faults, options: Options) -> tuple[Run, list[dict[str, Any]]]:
    deadline = time.monotonic() + options.minutes * 60
    run = FaultLoad(cluster, Plan(options.clients, ("modern", "legacy"), deadline, 0, 10**9, seed=options.seed))
    run.tally = TimedTally()
    windows: list[dict[str, Any]] = []
    injector = asyncio.create_task(inject(faults, options, deadline, windows))
    await asyncio.wait_for(run.go(), options.minutes * 60 + FAULT_BOUND + REQUEST_BOUND)
    await asyncio.wait_for(injector, FAULT_BOUND + 60)
    return run, windows


def at_rest(cluster: Cluster, tag: str, started: float, baseline: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Waits until fds and processes are back to the baseline (or SETTLE_BOUND passes); the last look, and what is
    still off."""
    deadline = time.monotonic() + SETTLE_BOUND
    while True:
        now = snapshot(cluster, tag, started)
        off = []
        for name, base in baseline["replicas"].items():
            seen = now["replicas"].get(name)
            if seen is None:
                off.append(f"replica {name} is not running")
                continue
            # Redis connections are a pool that grows to its bound under a burst and stays: checked against the bound;
            # every other fd must be back to the baseline's count.
            pooled, base_pooled = seen["fd_kinds"]["redis"], base["fd_kinds"]["redis"]
            if seen["fds"] - pooled > base["fds"] - base_pooled + FD_SLACK:
                redis_port = cluster.redis.port if cluster.redis is not None else None
                off.append(f"replica {name}: {seen['fds'] - pooled} fds besides Redis connections, "
                           f"{base['fds'] - base_pooled} at the baseline ({seen['fd_kinds']}; its sockets "
                           f"{sockets_besides(seen['pid'], redis_port)})")
            if pooled > REDIS_POOL + 2:
                off.append(f"replica {name}: {pooled} connections to Redis, past its pool's {REDIS_POOL}")
            if seen["processes"] != base["processes"]:
                off.append(f"replica {name}: {seen['processes']} processes, {base['processes']} at the baseline")
        for name in ("haproxy",):  # Redis's fds are the replicas' pools, checked above
            if baseline.get(name) and now.get(name) and now[name]["fds"] > baseline[name]["fds"] + FD_SLACK:
                off.append(f"{name}: {now[name]['fds']} fds, {baseline[name]['fds']} at the baseline")
        if now["orphans"]:
            off.append(f"orphans: {now['orphans'][:5]}")
        if not off or time.monotonic() > deadline:
            return now, off
        time.sleep(1)


def slope(points: list[tuple[float, float]]) -> float:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if len(xs) < 3 or max(xs) == min(xs):
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def rss_figures(samples: list[dict[str, Any]], options: Options, end: float) -> dict[str, Any]:
    """Each replica's RSS after warm-up since its last start (a restarted replica starts a new series), as KiB a
    minute, and over how long; plus HAProxy's and Redis's."""
    figures: dict[str, Any] = {}
    names = sorted({n for s in samples for n in s["replicas"]}) + ["haproxy", "redis"]
    for name in names:
        series: list[tuple[float, int, int]] = []  # (seconds, pid, rss)
        for s in samples:
            seen = s["replicas"].get(name) if name in s["replicas"] else s.get(name)
            if seen and seen.get("rss_kib") is not None:
                series.append((s["seconds"], seen["pid"], seen["rss_kib"]))
        if not series:
            continue
        last_pid = series[-1][1]
        own = [p for p in series if p[1] == last_pid]
        first = own[0][0]
        warm = [(t / 60, rss) for t, _, rss in own if t >= first + options.rss_warmup_seconds and t <= end]
        span = (warm[-1][0] - warm[0][0]) if len(warm) > 1 else 0.0
        figures[name] = {"slope_kib_per_min": round(slope(warm), 1), "span_min": round(span, 2),
                         "first_kib": warm[0][1] if warm else None, "last_kib": warm[-1][1] if warm else None,
                         "max_kib": max((r for _, r in warm), default=None)}
    return figures


def judge(report: dict[str, Any], options: Options) -> list[str]:
    """The checks, each failure said in a sentence."""
    failures = []
    load = report["load"]
    for kind in ("hung", "wrong"):
        if load["errors_by_class"].get(kind):
            failures.append(f"{load['errors_by_class'][kind]} load request(s) {kind}: "
                            f"{[e for e in load['examples'] if e.startswith(kind + ' ')][:3]}")
    if load["outside_fault_windows"]:
        failures.append(f"{load['outside_fault_windows']} load error(s) outside every fault's window: "
                        f"{load['outside_examples'][:3]}")
    for window in report["faults"]:
        for problem in window["result"].get("problems", []):
            failures.append(f"fault {window['kind']}: {problem}")
    marks = report["marks"]
    if marks["run_twice"] or marks["answered_not_run"]:
        failures.append(f"calls run twice {marks['run_twice']} or answered without running "
                        f"{marks['answered_not_run']}")
    failures.extend(f"not back at rest: {what}" for what in report["at_rest"]["off"])
    for name, rss in report["rss"].items():
        if rss["span_min"] >= options.rss_min_span_minutes and rss["slope_kib_per_min"] > options.rss_slope_kib_per_min:
            failures.append(f"{name} RSS grows {rss['slope_kib_per_min']:.0f} KiB/min after warm-up "
                            f"(bound {options.rss_slope_kib_per_min:.0f})")
    missing = set(options.faults) - {w["kind"] for w in report["faults"]}
    if missing:
        failures.append(f"faults never injected (the run was too short): {sorted(missing)}")
    return failures


def summarize(run: Run, windows: list[dict[str, Any]], started: float) -> dict[str, Any]:
    tally: TimedTally = run.tally  # type: ignore[assignment]
    classes: dict[str, int] = {}
    by_fault: dict[str, dict[str, int]] = {}
    outside, examples, outside_examples = 0, [], []
    for began, at, kind, what in tally.timeline:
        cls = error_kind(what)
        classes[cls] = classes.get(cls, 0) + 1
        # A fault's error is one whose operation was under way during the fault (or its grace after): a call that
        # waited out its whole timeout (an approval asked for while Redis restarted) ends long after the window.
        owner = next((w["kind"] for w in reversed(windows)
                      if w["start"] <= at and began <= w.get("end", at) + GRACE), None)
        if owner is None:
            outside += 1
            outside_examples.append(f"{at - started:.0f}s {kind}: {what[:200]}")
        else:
            by_fault.setdefault(owner, {}).setdefault(cls, 0)
            by_fault[owner][cls] += 1
        if sum(1 for e in examples if e.startswith(cls + " ")) < 5:
            examples.append(f"{cls} {at - started:.0f}s {kind}: {what[:300]}")
    operations = sum(tally.operations.values())
    return {"operations": operations, "requests": tally.requests, "errors": len(tally.timeline),
            "answered_right": operations - len(tally.timeline), "errors_by_class": classes,
            "errors_by_fault": by_fault, "outside_fault_windows": outside, "outside_examples": outside_examples[:10],
            "examples": examples}


def fault_run(options: Options, folder: Path) -> dict[str, Any]:
    disk, reason = mount_audit_disk(folder / "audit-disk")
    try:
        report = run_on_cluster(options, folder, disk, reason)
    finally:
        if disk is not None:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    report["failures"] = judge(report, options)
    return report


def run_on_cluster(options: Options, folder: Path, disk: Path | None, reason: str) -> dict[str, Any]:
    tag = str(folder)
    audit_replica = "r3" if disk is not None else None
    started = time.monotonic()
    with Cluster(folder, replicas_count=3, http=LOAD_HTTP,
                 audit_paths={"r3": disk / "audit.jsonl"} if disk else {}) as cluster:
        print(f"cluster up: {cluster.url} ({folder}); seed {options.seed}", file=sys.stderr, flush=True)
        asyncio.run(warm_up(cluster, options))
        # The warm-up's tags come again in the run (same clients, same serials): its marks are set aside. The
        # servers open the file by name for each mark, so the next one makes a new file.
        if cluster.marks.exists():
            cluster.marks.rename(cluster.marks.with_suffix(".warmup"))
        baseline, _ = at_rest(cluster, tag, started, snapshot(cluster, tag, started))
        faults = Faults(cluster, random.Random(options.seed), disk, audit_replica, reason)
        loaded_at = time.monotonic()
        with Sampler(cluster, tag, started, options.sample_seconds) as sampler:
            run, windows = asyncio.run(load_with_faults(cluster, faults, options))
            load_end = time.monotonic() - started
            final, off = at_rest(cluster, tag, started, baseline)
        tally = run.tally
        report = {
            "seed": options.seed, "minutes": options.minutes, "clients": options.clients,
        "options_rss_warmup_s": options.rss_warmup_seconds,
            "load_seconds": round(time.monotonic() - loaded_at, 1),
            "loadavg_during": os.getloadavg(),
            "load": summarize(run, windows, started),
            "faults": [{"kind": w["kind"], "at_s": round(w["start"] - started, 1),
                        "took_s": round(w["end"] - w["start"], 1), "result": w["result"]} for w in windows],
            "faults_by_kind": {k: sum(1 for w in windows if w["kind"] == k) for k in options.faults},
            "marks": check_marks(cluster, tally, settle_seconds=10.0),
            "baseline": baseline, "at_rest": {"final": final, "off": off},
            "peaks": peaks(sampler.samples),
            "rss": rss_figures(sampler.samples, options, load_end),
            "samples": len(sampler.samples),
        }
    return report


def peaks(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The most each process held at any sample: fds, processes."""
    found: dict[str, dict[str, int]] = {}
    for s in samples:
        for name, seen in [*s["replicas"].items(), ("haproxy", s.get("haproxy")), ("redis", s.get("redis"))]:
            if seen:
                top = found.setdefault(name, {})
                for key in ("fds", "processes"):
                    if seen.get(key) is not None:
                        top[key] = max(top.get(key, 0), seen[key])
        system = found.setdefault("system", {})
        system["bwrap_orphans"] = max(system.get("bwrap_orphans", 0), s["system_bwrap_orphans"])
        system["init_zombies"] = max(system.get("init_zombies", 0), s["system_init_zombies"])
    return found


def mount_audit_disk(disk: Path) -> tuple[Path | None, str]:
    disk.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return None, "mounting a tmpfs needs root"
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", AUDIT_DISK, "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        return None, f"mount: {mounted.stderr.strip() or mounted.returncode}"
    return disk, ""


def render(report: dict[str, Any]) -> str:
    load = report["load"]
    lines = [f"fault run, seed {report['seed']}: {report['minutes']} min of load ({report['clients']} clients, both "
             f"eras, 3 replicas behind HAProxy on Redis), load average {report['loadavg_during'][0]:.1f} at the end",
             f"  {load['operations']} operations, {load['requests']} requests; {load['answered_right']} answered "
             f"right, {load['errors']} errors by class {load['errors_by_class']}, "
             f"{load['outside_fault_windows']} outside a fault's window",
             f"  faults: {report['faults_by_kind']}"]
    for window in report["faults"]:
        result = {k: v for k, v in window["result"].items() if k != "problems"}
        problems = window["result"].get("problems") or []
        lines.append(f"    {window['at_s']:7.1f}s {window['kind']:15} {window['took_s']:6.1f}s "
                     f"{json.dumps(result)[:160]}" + (f" PROBLEMS {problems[:2]}" if problems else ""))
    lines.append(f"  errors by fault: {json.dumps(load['errors_by_fault'])}")
    base, final = report["baseline"], report["at_rest"]["final"]
    for name in base["replicas"]:
        b, f = base["replicas"][name], final["replicas"].get(name) or {}
        lines.append(f"  {name}: fds {b['fds']} -> {f.get('fds')} (peak {report['peaks'].get(name, {}).get('fds')}; "
                     f"at the end {f.get('fd_kinds')}), processes {b['processes']} -> {f.get('processes')}")
    for name in ("haproxy", "redis"):
        if base.get(name) and final.get(name):
            lines.append(f"  {name}: fds {base[name]['fds']} -> {final[name]['fds']} "
                         f"(peak {report['peaks'].get(name, {}).get('fds')})")
    system = report["peaks"].get("system", {})
    lines.append(f"  orphans of this run at the end: {final['orphans']}; machine-wide, most seen: bwrap with PPID 1 "
                 f"{system.get('bwrap_orphans')}, zombies with PPID 1 {system.get('init_zombies')} "
                 f"({report['baseline']['system_init_zombies']} before the run)")
    for name, rss in report["rss"].items():
        if not rss["span_min"]:
            lines.append(f"  RSS {name}: no samples {report['options_rss_warmup_s']:.0f} s after its start")
            continue
        lines.append(f"  RSS {name}: slope {rss['slope_kib_per_min']:+.0f} KiB/min over {rss['span_min']:.1f} min "
                     f"after warm-up ({(rss['first_kib'] or 0) / 1024:.0f} -> {(rss['last_kib'] or 0) / 1024:.0f} "
                     f"MiB, max {(rss['max_kib'] or 0) / 1024:.0f})")
    lines.append(f"  marks: run twice {report['marks']['run_twice']}, answered not run "
                 f"{report['marks']['answered_not_run']}")
    lines.extend(f"  example: {e}" for e in load["examples"] if not e.startswith(("jsonrpc ", "http ")))
    lines.append("  checks: " + ("all passed" if not report["failures"] else "FAILED"))
    lines.extend(f"  FAIL {f}" for f in report["failures"])
    return "\n".join(lines)


def parse_options(argv: list[str] | None = None) -> tuple[Options, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, help="the random order and gaps of the faults (default: a new one)")
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--gap", default="20,60", help="seconds between faults, least and most")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"which faults ({', '.join(FAULTS)})")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of load before the baseline")
    parser.add_argument("--rss-min-span", type=float, default=5.0,
                        help="minutes of samples after warm-up a replica needs before its RSS slope is checked")
    parser.add_argument("--json", action="store_true", help="print the JSON summary instead of the text")
    parser.add_argument("--out", type=Path, help="write the JSON summary here too")
    args = parser.parse_args(argv)
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    if not faults or not set(faults) <= set(FAULTS):
        parser.error(f"--faults: some of {', '.join(FAULTS)}")
    low, high = (float(v) for v in args.gap.split(","))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    return Options(args.minutes, seed, args.clients, (low, high), faults, args.warmup,
                   rss_min_span_minutes=args.rss_min_span), args


def main(argv: list[str] | None = None) -> int:
    options, args = parse_options(argv)
    print(f"seed {options.seed}", file=sys.stderr, flush=True)
    folder = Path(tempfile.mkdtemp(prefix="bastion-faultrun-"))
    report = fault_run(options, folder)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report) if args.json else render(report))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
