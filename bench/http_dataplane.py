"""HTTP data-plane benchmark: what `bastion serve` costs per call, against a floor and a peer, in one run.

Every path ends at the same echo server (bench/fixtures/echo_server.py) reached over stdio, and every path is
driven by the same cheap raw HTTP/1.1 client (asyncio streams, keep-alive, requests pre-framed as bytes):

  direct          the echo server over pipes, no HTTP (the base that "added" latency is counted from)
  null            a raw ASGI app on uvicorn + httptools that answers each call itself: the client and the
                  HTTP stack alone, no hop behind them (context, not a target)
  floor           bench/fixtures/asgi_relay.py: a raw ASGI JSON-RPC relay on the same stack, each POST relayed to
                  the echo server over stdio (the floor for an HTTP hop in Python)
  bastion-modern  `bastion serve` (a plain mcpServers file: the default policy and audit trail on, echo in
                  autoApprove), 2026-07-28 stateless POSTs with their Mcp-Method/Mcp-Name headers
  bastion-legacy  the same process, 2025-11-25 Streamable HTTP in an Mcp-Session-Id session
  fastmcp-legacy  FastMCP's HTTP proxy (create_proxy, default settings) in a 2025-11-25 session
  fastmcp-modern  the same proxy spoken to in 2026-07-28; skipped with the reason if it does not answer
  bastion-modern-jwt  bastion-modern with an auth table: every POST carries an RS256 bearer token (one for all the
                  clients, as one agent's) checked against an issuer on 127.0.0.1 (tests/auth/resource_server_issuer.py)

Sequential calls, then 64 concurrent clients (each its own connection, and its own session where the era has
sessions), in rounds that alternate between the paths. Then a fresh `bastion serve`'s RSS (without its echo
server) before and after 1,000 legacy sessions are opened and left idle.
Only ratios taken within one run are meaningful.

Usage: .venv/bin/python bench/http_dataplane.py [--calls N] [--quick] [--paths ...] [--sessions N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataplane import Accumulated, bastion_command, collector_paused, fmt, log  # noqa: E402
from dataplane_client import CallTiming, McpPipeClient  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
FIXTURES = BENCH_DIR / "fixtures"
ECHO_SERVER = FIXTURES / "echo_server.py"
ALL_PATHS = ("direct", "null", "floor", "bastion-modern", "bastion-legacy", "fastmcp-legacy", "fastmcp-modern",
             "bastion-modern-jwt")
OPTIONAL_PATHS = ("bastion-modern", "bastion-legacy", "fastmcp-legacy", "fastmcp-modern", "bastion-modern-jwt")
CLIENTS = 64
START_TIMEOUT_S = 60.0
MB = 1024 * 1024
MODERN, LEGACY = "2026-07-28", "2025-11-25"
MODERN_META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"}}

TARGET_ADDED_VS_FLOOR = 1.5
TARGET_ADDED_VS_FASTMCP = 0.1
TARGET_THROUGHPUT_VS_FLOOR = 0.5


# ----------------------------------------------------------------------------------------------------
# A cheap HTTP/1.1 client: one keep-alive connection, pre-framed requests, JSON or SSE answers
# ----------------------------------------------------------------------------------------------------

class HttpError(RuntimeError):
    pass


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
        self.reader, self.writer, self.port = reader, writer, port
        self.host = f"127.0.0.1:{port}".encode()

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(*await cls._connect(port), port)

    @staticmethod
    async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
        writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    def close(self) -> None:
        self.writer.close()

    async def post(self, head: bytes, body: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        request = b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)
        self.writer.write(request)
        try:
            raw = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionResetError) as error:
            if isinstance(error, asyncio.IncompleteReadError) and error.partial:
                raise
            # The server closed the idle keep-alive connection (uvicorn's default allows 5 s, a busy machine's round
            # of the other paths takes longer): sent again on a new one, as any HTTP client does.
            self.writer.close()
            self.reader, self.writer = await self._connect(self.port)
            self.writer.write(request)
            raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw[:-4].split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if b"content-length" in headers:
            payload = await self.reader.readexactly(int(headers[b"content-length"]))
        elif headers.get(b"transfer-encoding") == b"chunked":
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(chunk[:-2])
            payload = b"".join(parts)
        else:
            payload = b""
        return status, headers, payload


def answer_of(headers: dict[bytes, bytes], payload: bytes) -> dict[str, Any]:
    """The JSON-RPC answer in a JSON body or in an SSE stream that carries it."""
    if headers.get(b"content-type", b"").startswith(b"text/event-stream"):
        for line in reversed(payload.splitlines()):
            if line.startswith(b"data:"):
                message = orjson.loads(line[5:])
                if "id" in message:
                    return message
        raise HttpError(f"no answer in the SSE stream: {payload[:200]!r}")
    return orjson.loads(payload)


@dataclass
class Style:
    """How one path's requests are framed: the extra headers of its era, whether it has sessions."""

    era: str | None  # None: no MCP headers (the relay does not look at them)
    tool: str = "echo"
    authorization: bytes = b""  # an Authorization header's value, sent with every request

    def head(self, host: bytes, method: str, name: str | None, session: bytes | None) -> bytes:
        lines = [b"POST /mcp HTTP/1.1", b"Host: " + host, b"Content-Type: application/json",
                 b"Accept: application/json, text/event-stream"]
        if self.era == MODERN:
            lines += [b"MCP-Protocol-Version: " + MODERN.encode(), b"Mcp-Method: " + method.encode()]
            if name:
                lines.append(b"Mcp-Name: " + name.encode())
        elif self.era == LEGACY and session is not None:
            lines += [b"MCP-Protocol-Version: " + LEGACY.encode(), b"Mcp-Session-Id: " + session]
        if self.authorization:
            lines.append(b"Authorization: " + self.authorization)
        return b"\r\n".join(lines) + b"\r\n"

    def params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {**params, "_meta": MODERN_META} if self.era == MODERN else params


class HttpMcpClient:
    """One client of one path: its connection, its session where the era has one, its call framing."""

    def __init__(self, connection: Connection, style: Style) -> None:
        self.connection, self.style = connection, style
        self.session: bytes | None = None
        self.next_id = 0
        self.call_head = b""

    @classmethod
    async def open(cls, port: int, style: Style, *, list_tools: bool = True) -> HttpMcpClient:
        client = cls(await Connection.open(port), style)
        if style.era == LEGACY:
            status, headers, payload = await client.connection.post(style.head(client.connection.host, "", None, None),
                                                                    orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                                                                        "protocolVersion": LEGACY, "capabilities": {},
                                                                        "clientInfo": {"name": "bench", "version": "1"}}}))
            if status != 200 or b"mcp-session-id" not in headers:
                raise HttpError(f"initialize answered {status} without Mcp-Session-Id: {payload[:300]!r}")
            client.session = headers[b"mcp-session-id"]
            status, _, payload = await client.connection.post(
                style.head(client.connection.host, "", None, client.session),
                b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
            if status != 202:
                raise HttpError(f"notifications/initialized answered {status}: {payload[:300]!r}")
        if list_tools and style.era is not None:
            names = [tool["name"] for tool in (await client.request("tools/list", None, {}))["tools"]]
            if style.tool not in names:
                raise HttpError(f"tool {style.tool!r} not offered; tools/list returned {names}")
        client.call_head = style.head(client.connection.host, "tools/call", style.tool, client.session)
        return client

    async def request(self, method: str, name: str | None, params: dict[str, Any]) -> Any:
        self.next_id += 1
        head = self.style.head(self.connection.host, method, name, self.session)
        body = orjson.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": self.style.params(params)})
        status, headers, payload = await self.connection.post(head, body)
        if status != 200:
            raise HttpError(f"{method} answered {status}: {payload[:300]!r}")
        answer = answer_of(headers, payload)
        if "result" not in answer:
            raise HttpError(f"{method} answered {answer.get('error')}")
        return answer["result"]

    async def call(self) -> int:
        """One echo tools/call, checked; its latency in nanoseconds."""
        self.next_id += 1
        text = f"t{self.next_id}"
        body = orjson.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call", "params": self.style.params(
            {"name": self.style.tool, "arguments": {"text": text}})})
        started = time.perf_counter_ns()
        status, headers, payload = await self.connection.post(self.call_head, body)
        elapsed = time.perf_counter_ns() - started
        if status != 200:
            raise HttpError(f"tools/call answered {status}: {payload[:300]!r}")
        answer = answer_of(headers, payload)
        if answer.get("id") != self.next_id or answer.get("result", {}).get("content", [{}])[0].get("text") != text:
            raise HttpError(f"tools/call answered {payload[:300]!r}, not the echo of {text!r}")
        return elapsed

    def close(self) -> None:
        self.connection.close()


# ----------------------------------------------------------------------------------------------------
# The processes behind the paths
# ----------------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def process_cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class Server:
    """One HTTP server process the paths talk to."""

    name: str
    process: subprocess.Popen
    port: int
    log_path: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 15)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()


async def start_server(name: str, argv: list[str], port: int | None, logs: Path) -> Server:
    """Start ARGV and wait until it accepts connections (a port of 0: until it says where, as bastion serve does)."""
    log_path = logs / f"{name}.stderr"
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=log_path.open("wb"), cwd=REPO_ROOT, start_new_session=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    server = Server(name, process, port or 0, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}\n{tail(log_path)}")
            if not port:
                found = re.search(r"serving MCP on http://127\.0\.0\.1:(\d+)/mcp", log_path.read_text(errors="replace"))
                if found:
                    server.port = int(found.group(1))
                    return server
            else:
                with contextlib.suppress(OSError):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    return server
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{name} did not start within {START_TIMEOUT_S:.0f} s\n{tail(log_path)}")
    except BaseException:
        server.stop()
        raise


def tail(path: Path, lines: int = 8) -> str:
    text = path.read_text(errors="replace").strip().splitlines()[-lines:] if path.exists() else []
    return "\n".join("    | " + line for line in text) or "    | (no stderr output)"


def bastion_config(workdir: Path, python: str, auth: dict[str, Any] | None = None) -> Path:
    config = workdir / ("bastion-http-auth.json" if auth else "bastion-http.json")
    config.write_bytes(orjson.dumps({
        "mcpServers": {"echo": {"command": python, "args": [str(ECHO_SERVER)], "autoApprove": ["echo"]}},
        # 64 clients with a call each: the per-server bound must not refuse the 64th. Every client (and the idle
        # sessions of the memory figure, 1000 by default) is one loopback address, or one API key: one caller, whose
        # session quota must not refuse the 101st.
        "http": {"max_in_flight_per_server": 4 * CLIENTS, "max_sessions_per_address": 10000,
                 "max_sessions_per_identity": 10000},
        **({"auth": auth} if auth else {}),
    }, option=orjson.OPT_INDENT_2))
    return config


# ----------------------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------------------

@dataclass
class LivePath:
    name: str
    pid: int | None  # the process whose CPU per call is reported (not its echo server)
    sequential_client: Any
    concurrent_clients: list[Any]
    sequential: Accumulated = field(default_factory=Accumulated)
    concurrent: Accumulated = field(default_factory=Accumulated)
    client_cpu_s: float = 0.0
    server_cpu_at_start: float | None = None

    async def run_sequential(self, calls: int) -> None:
        cpu = time.process_time()
        started = time.perf_counter_ns()
        latencies = [await self.sequential_client.call() for _ in range(calls)]
        self.sequential.add(CallTiming(latencies, time.perf_counter_ns() - started))
        self.client_cpu_s += time.process_time() - cpu

    async def run_concurrent(self, calls: int) -> None:
        per_client = max(1, calls // len(self.concurrent_clients))
        cpu = time.process_time()
        started = time.perf_counter_ns()

        async def one(client: Any) -> list[int]:
            return [await client.call() for _ in range(per_client)]

        results = await asyncio.gather(*(one(client) for client in self.concurrent_clients))
        self.concurrent.add(CallTiming([ns for batch in results for ns in batch], time.perf_counter_ns() - started))
        self.client_cpu_s += time.process_time() - cpu

    def calls(self) -> int:
        return len(self.sequential.latencies_ns) + len(self.concurrent.latencies_ns)

    def summary(self) -> dict[str, Any]:
        server_cpu = None
        if self.pid is not None and self.server_cpu_at_start is not None:
            now = process_cpu_seconds(self.pid)
            server_cpu = None if now is None else (now - self.server_cpu_at_start) / self.calls() * 1e6
        rss = process_rss_bytes(self.pid) if self.pid is not None else None
        modes = {"sequential": self.sequential.summary()}
        if self.concurrent.latencies_ns:
            modes["concurrent"] = self.concurrent.summary()
        return {"status": "ok", **modes,
                "server_cpu_us_per_call": server_cpu, "client_cpu_us_per_call": self.client_cpu_s / self.calls() * 1e6,
                "rss_mb": None if rss is None else rss / MB}


class DirectClient:
    """The echo server over pipes, through the stdio benchmark's client: the base of every added latency."""

    def __init__(self, client: McpPipeClient) -> None:
        self.client = client

    async def call(self) -> int:
        timing = await self.client.sequential_calls("echo", 1)
        return timing.latencies_ns[0]


async def open_clients(port: int, style: Style, count: int) -> list[HttpMcpClient]:
    clients: list[HttpMcpClient] = []
    try:
        for _ in range(count):  # one at a time: 64 handshakes at once would only measure the start
            clients.append(await asyncio.wait_for(HttpMcpClient.open(port, style), START_TIMEOUT_S))
    except BaseException:
        for client in clients:
            client.close()
        raise
    return clients


STYLES: dict[str, Style] = {
    "null": Style(None), "floor": Style(None),
    "bastion-modern": Style(MODERN, "echo__echo"), "bastion-legacy": Style(LEGACY, "echo__echo"),
    "fastmcp-legacy": Style(LEGACY), "fastmcp-modern": Style(MODERN),
}


async def measure_idle_sessions(port: int, pid: int, sessions: int) -> dict[str, Any]:
    """Bastion's RSS before and after opening SESSIONS legacy sessions that then stay idle."""
    await asyncio.sleep(1.0)
    before = process_rss_bytes(pid)
    connections = [await Connection.open(port) for _ in range(16)]
    style = Style(LEGACY)
    ids: set[bytes] = set()

    async def opener(connection: Connection, count: int) -> None:
        for _ in range(count):
            status, headers, payload = await connection.post(style.head(connection.host, "", None, None), orjson.dumps(
                {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "idle", "version": "1"}}}))
            if status != 200:
                raise HttpError(f"initialize of an idle session answered {status}: {payload[:300]!r}")
            session = headers[b"mcp-session-id"]
            ids.add(session)
            status, _, _ = await connection.post(style.head(connection.host, "", None, session),
                                                 b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
            if status != 202:
                raise HttpError(f"notifications/initialized of an idle session answered {status}")

    try:
        share, extra = divmod(sessions, len(connections))
        await asyncio.gather(*(opener(c, share + (i < extra)) for i, c in enumerate(connections)))
        await asyncio.sleep(2.0)
        after = process_rss_bytes(pid)
    finally:
        for connection in connections:
            connection.close()
    if before is None or after is None:
        return {"status": "skipped", "reason": "no /proc figures for the bastion process"}
    return {"status": "ok", "sessions": len(ids), "rss_before_mb": before / MB, "rss_after_mb": after / MB,
            "per_session_kb": (after - before) / len(ids) / 1024}


async def run(options: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    servers: list[Server] = []
    issuers: list[Any] = []  # the authorization server of bastion-modern-jwt, in this loop
    live: list[LivePath] = []
    idle: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="bastion-http-bench-") as tmp:
        workdir = Path(tmp)
        os.environ["XDG_STATE_HOME"] = str(workdir / "state")  # the audit trail of the run, not the user's
        python = options.python
        echo = [python, str(ECHO_SERVER)]
        direct_log = open(workdir / "direct.stderr", "wb")
        pipe_client: McpPipeClient | None = None
        try:
            wanted = options.paths
            by_server: dict[str, Server] = {}
            styles = dict(STYLES)
            auth_table: dict[str, Any] | None = None
            if "bastion-modern-jwt" in wanted:
                sys.path.insert(0, str(REPO_ROOT))
                from tests.auth.resource_server_issuer import RESOURCE, Issuer
                issuer = await Issuer().start()
                issuers.append(issuer)
                auth_table = {"resource": RESOURCE, "issuers": [{"issuer": issuer.issuer}], "scopes": ["mcp"]}
                styles["bastion-modern-jwt"] = Style(MODERN, "echo__echo", b"Bearer " + issuer.token().encode())

            async def server_for(kind: str) -> Server:
                if kind not in by_server:
                    if kind in ("bastion", "bastion-jwt"):
                        config = bastion_config(workdir, python, auth_table if kind == "bastion-jwt" else None)
                        argv = [*bastion_command(python, options.bastion), "serve", str(config), "--http", "127.0.0.1:0"]
                        by_server[kind] = await start_server(kind, argv, None, workdir)
                    else:
                        port = free_port()
                        fixture = {"null": [python, str(FIXTURES / "asgi_relay.py"), str(port), "--null"],
                                   "floor": [python, str(FIXTURES / "asgi_relay.py"), str(port), *echo],
                                   "fastmcp": [python, str(FIXTURES / "fastmcp_http_proxy.py"), str(port), *echo]}[kind]
                        by_server[kind] = await start_server(kind, fixture, port, workdir)
                    servers.append(by_server[kind])
                return by_server[kind]

            for name in wanted:
                try:
                    if name == "direct":
                        pipe_client = await McpPipeClient.spawn(echo, direct_log, cwd=REPO_ROOT)
                        await asyncio.wait_for(pipe_client.handshake(), START_TIMEOUT_S)
                        live.append(LivePath(name, pipe_client.process.pid, DirectClient(pipe_client), []))
                    else:
                        server = await server_for("bastion-jwt" if name.endswith("-jwt") else name.split("-")[0])
                        style = styles[name]
                        sequential = await asyncio.wait_for(HttpMcpClient.open(server.port, style), START_TIMEOUT_S)
                        concurrent = await open_clients(server.port, style, options.clients)
                        live.append(LivePath(name, server.process.pid, sequential, concurrent))
                    log(f"[bench] {name}: ready")
                except Exception as error:  # noqa: BLE001 - a path that cannot start is skipped with its reason
                    reason = f"{type(error).__name__}: {error}"
                    if name not in OPTIONAL_PATHS:
                        raise RuntimeError(f"{name} path failed: {reason}") from error
                    log(f"[bench] {name}: SKIPPED ({reason})")
                    results[name] = {"status": "skipped", "reason": reason}

            for path in list(live):  # warm-up, not measured
                try:
                    await path.run_sequential(options.warmup)
                    if path.concurrent_clients:
                        await path.run_concurrent(options.warmup)
                except (OSError, asyncio.IncompleteReadError, HttpError) as error:
                    # A peer that drops a connection under load is reported as skipped, with why, not the run lost.
                    reason = f"failed in its warm-up: {type(error).__name__}: {error}"
                    if path.name not in OPTIONAL_PATHS:
                        raise RuntimeError(f"{path.name} path {reason}") from error
                    log(f"[bench] {path.name}: SKIPPED ({reason})")
                    results[path.name] = {"status": "skipped", "reason": reason}
                    live.remove(path)
                    continue
                path.sequential, path.concurrent, path.client_cpu_s = Accumulated(), Accumulated(), 0.0
                path.server_cpu_at_start = process_cpu_seconds(path.pid) if path.pid else None

            per_round = max(1, options.calls // options.rounds)
            with collector_paused():
                for round_index in range(options.rounds):
                    for path in list(live):
                        try:
                            await asyncio.wait_for(path.run_sequential(per_round), options.timeout)
                            if path.concurrent_clients:
                                await asyncio.wait_for(path.run_concurrent(per_round), options.timeout)
                        except Exception as error:  # noqa: BLE001
                            if path.name not in OPTIONAL_PATHS:
                                raise
                            log(f"[bench] {path.name}: dropped mid-run ({type(error).__name__}: {error})")
                            results[path.name] = {"status": "failed", "reason": f"{type(error).__name__}: {error}"}
                            live.remove(path)
                    log(f"[bench] round {round_index + 1}/{options.rounds} done")
            for path in live:
                results[path.name] = path.summary()
            for path in live:
                for client in [path.sequential_client, *path.concurrent_clients]:
                    if isinstance(client, HttpMcpClient):
                        client.close()

            if "bastion" in by_server and options.sessions > 0:
                # A fresh gateway, so that the sessions cannot reuse memory the timed calls left free.
                try:
                    argv = [*bastion_command(python, options.bastion), "serve", str(bastion_config(workdir, python)),
                            "--http", "127.0.0.1:0"]
                    fresh = await start_server("bastion-idle", argv, None, workdir)
                    servers.append(fresh)
                    warm = await HttpMcpClient.open(fresh.port, STYLES["bastion-legacy"])
                    await warm.call()
                    warm.close()
                    idle = await asyncio.wait_for(measure_idle_sessions(fresh.port, fresh.process.pid,
                                                                        options.sessions), options.timeout)
                except Exception as error:  # noqa: BLE001
                    idle = {"status": "failed", "reason": f"{type(error).__name__}: {error}"}
                log(f"[bench] idle sessions: {idle}")
        finally:
            if pipe_client is not None:
                await pipe_client.close()
            direct_log.close()
            for server in servers:
                server.stop()
            for issuer_server in issuers:
                await issuer_server.stop()
    paths = {name: results[name] for name in options.paths if name in results}
    return {
        "calls": options.calls, "rounds": options.rounds, "clients": options.clients,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "paths": paths, "idle_sessions": idle, "targets": evaluate_targets(paths), "context": context(paths),
    }


# ----------------------------------------------------------------------------------------------------
# Targets and output
# ----------------------------------------------------------------------------------------------------

def value(paths: dict[str, Any], name: str, mode: str, key: str) -> float | None:
    entry = paths.get(name)
    return entry[mode][key] if entry and entry.get("status") == "ok" and mode in entry else None


def added(paths: dict[str, Any], name: str) -> float | None:
    base, own = value(paths, "direct", "sequential", "p50_ms"), value(paths, name, "sequential", "p50_ms")
    return None if base is None or own is None else own - base


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or denominator is None or denominator <= 0 else numerator / denominator


def peer_of(paths: dict[str, Any], era: str) -> str:
    """FastMCP in the same era when it answered in it, else in the legacy one."""
    same = f"fastmcp-{era}"
    return same if paths.get(same, {}).get("status") == "ok" else "fastmcp-legacy"


def evaluate_targets(paths: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for era in ("modern", "legacy"):
        name = f"bastion-{era}"
        peer = peer_of(paths, era)
        checks: list[tuple[str, float | None, str, Callable[[float], bool]]] = [
            (f"{name} added latency / floor's, p50", ratio(added(paths, name), added(paths, "floor")),
             f"<= {TARGET_ADDED_VS_FLOOR:g}", lambda v: v <= TARGET_ADDED_VS_FLOOR),
            (f"{name} added latency / {peer}'s, p50", ratio(added(paths, name), added(paths, peer)),
             f"<= {TARGET_ADDED_VS_FASTMCP:g}", lambda v: v <= TARGET_ADDED_VS_FASTMCP),
            (f"{name} throughput, {CLIENTS} clients / floor's",
             ratio(value(paths, name, "concurrent", "calls_per_s"), value(paths, "floor", "concurrent", "calls_per_s")),
             f">= {TARGET_THROUGHPUT_VS_FLOOR:g}", lambda v: v >= TARGET_THROUGHPUT_VS_FLOOR),
        ]
        for label, figure, goal, met in checks:
            status = "SKIP" if figure is None else ("PASS" if met(figure) else "MISS")
            rows.append({"name": label, "value": figure, "target": goal, "status": status})
    return rows


def context(paths: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in ALL_PATHS[1:]:
        out[f"{name}_added_p50_ms"] = added(paths, name)
        out[f"{name}_throughput_vs_floor"] = ratio(value(paths, name, "concurrent", "calls_per_s"),
                                                   value(paths, "floor", "concurrent", "calls_per_s"))
    return out


def render_table(report: dict[str, Any]) -> str:
    clients = report["clients"]
    lines = [f"HTTP data-plane benchmark: {report['calls']} calls per mode per path, {clients} concurrent clients, "
             f"{report['rounds']} interleaved rounds, {report['machine']['cpus']} CPUs, Python {report['machine']['python']}",
             "",
             f"{'path':<18} {'seq p50 ms':>10} {'seq p99 ms':>10} {'seq calls/s':>11} {f'{clients} p50 ms':>10} "
             f"{f'{clients} calls/s':>11} {'added p50 ms':>12} {'srv CPU us':>10} {'cli CPU us':>10} {'RSS MB':>7}"]
    for name, entry in report["paths"].items():
        if entry["status"] != "ok":
            lines.append(f"{name:<18} {entry['status'].upper()}: {entry['reason']}")
            continue
        seq, many = entry["sequential"], entry.get("concurrent")
        lines.append(
            f"{name:<18} {seq['p50_ms']:>10.3f} {seq['p99_ms']:>10.3f} {seq['calls_per_s']:>11.0f} "
            f"{fmt(many and many['p50_ms']):>10} {fmt(many and many['calls_per_s'], '.0f'):>11} "
            f"{fmt(added(report['paths'], name)):>12} {fmt(entry['server_cpu_us_per_call'], '.0f'):>10} "
            f"{fmt(entry['client_cpu_us_per_call'], '.0f'):>10} {fmt(entry['rss_mb'], '.1f'):>7}")
    idle = report.get("idle_sessions")
    if idle is not None:
        lines.append("")
        if idle["status"] == "ok":
            lines.append(f"Bastion with {idle['sessions']} idle legacy sessions: RSS {idle['rss_before_mb']:.1f} -> "
                         f"{idle['rss_after_mb']:.1f} MB, {idle['per_session_kb']:.1f} KB per session")
        else:
            lines.append(f"Idle sessions: {idle['status'].upper()} ({idle['reason']})")
    lines += ["", f"{'target':<58} {'value':>8} {'goal':>7}  result"]
    for row in report["targets"]:
        lines.append(f"{row['name']:<58} {fmt(row['value'], '.3f'):>8} {row['target']:>7}  {row['status']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=None, help="tools/call per mode per path (default 3000; 256 with --quick)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5; 2 with --quick)")
    parser.add_argument("--clients", type=int, default=CLIENTS, help=f"concurrent clients (default {CLIENTS})")
    parser.add_argument("--sessions", type=int, default=None,
                        help="idle legacy sessions for the memory figure (default 1000; 100 with --quick; 0: skip)")
    parser.add_argument("--quick", action="store_true", help="a short run that checks the benchmark works")
    parser.add_argument("--paths", default=",".join(ALL_PATHS), help=f"comma-separated subset of {','.join(ALL_PATHS)}")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the fixtures")
    parser.add_argument("--bastion", default=None, help="the bastion executable (default: next to --python)")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.paths.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(ALL_PATHS))
    if unknown:
        parser.error(f"--paths: unknown path(s) {unknown}; choose from {', '.join(ALL_PATHS)}")
    args.paths = [name for name in ALL_PATHS if name in chosen]
    args.calls = args.calls or (256 if args.quick else 3000)
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.sessions = (100 if args.quick else 1000) if args.sessions is None else args.sessions
    if args.calls < 1 or args.rounds < 1 or args.clients < 1:
        parser.error("--calls, --rounds and --clients must be at least 1")
    args.warmup = 32 if args.quick else 256
    args.timeout = max(120.0, args.calls * 0.2)
    return args


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
