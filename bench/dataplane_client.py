"""One lightweight raw JSON-RPC client over stdio pipes, shared by every benchmark path.

Every path is measured through this same client so that its own cost cancels out of the ratios: it
writes one orjson line per request, and a single reader task matches answers to waiting futures by id.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

LEGACY_PROTOCOL_VERSION = "2025-11-25"
LINE_LIMIT = 1 << 24  # tools/list through a gateway can be long; asyncio's 64 KiB default is not enough


class McpCallError(RuntimeError):
    """The peer answered a request with a JSON-RPC error, or went away before answering."""


@dataclass(frozen=True)
class CallTiming:
    """Per-call latencies (nanoseconds) and the wall time the whole batch took."""

    latencies_ns: list[int]
    elapsed_ns: int


class McpPipeClient:
    """A child process spoken to in newline-delimited JSON-RPC over its stdin/stdout."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._reader = asyncio.create_task(self._read_answers())

    @classmethod
    async def spawn(cls, argv: list[str], stderr_log: IO[bytes], cwd: Path | None = None) -> McpPipeClient:
        # A session of its own lets teardown reach the grandchildren (the echo servers behind a proxy).
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr_log,
            limit=LINE_LIMIT,
            cwd=cwd,
            start_new_session=True,
        )
        return cls(process)

    async def _read_answers(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        try:
            while line := await stdout.readline():
                if line.strip():
                    await self._dispatch(orjson.loads(line))
        finally:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self.process.wait(), 1.0)
            self._fail_pending(McpCallError(f"process closed its stdout (exit code {self.process.returncode})"))

    async def _dispatch(self, message: dict[str, Any]) -> None:
        if "method" in message:
            if "id" in message:
                # The client declares no capabilities, so any server-to-client request is refused at once
                # rather than left to stall the path being measured.
                await self._send({"jsonrpc": "2.0", "id": message["id"],
                                  "error": {"code": -32601, "message": "Method not found"}})
            return
        future = self._pending.pop(message.get("id"), None)  # type: ignore[arg-type]
        if future is None or future.done():
            return
        if "error" in message:
            future.set_exception(McpCallError(orjson.dumps(message["error"]).decode()))
        else:
            future.set_result(message.get("result"))

    def _fail_pending(self, error: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()

    async def _send(self, message: dict[str, Any]) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(orjson.dumps(message) + b"\n")
        await stdin.drain()

    async def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        self._next_id += 1
        request_id = self._next_id
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)
        return await future

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)

    async def handshake(self) -> dict[str, Any]:
        """The legacy lifecycle: initialize, then notifications/initialized."""
        result = await self.request("initialize", {
            "protocolVersion": LEGACY_PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "bastion-bench", "version": "1.0.0"},
        })
        await self.notify("notifications/initialized")
        return result

    async def tool_names(self) -> list[str]:
        result = await self.request("tools/list", {})
        return [tool["name"] for tool in result.get("tools", [])]

    async def timed_echo(self, tool: str, text: str) -> int:
        """One tools/call round trip; returns its latency in nanoseconds after checking the echo."""
        started = time.perf_counter_ns()
        result = await self.request("tools/call", {"name": tool, "arguments": {"text": text}})
        latency = time.perf_counter_ns() - started
        if result["content"][0]["text"] != text:
            raise McpCallError(f"echo mismatch: sent {text!r}, got {result['content'][0]['text']!r}")
        return latency

    async def sequential_calls(self, tool: str, count: int) -> CallTiming:
        latencies = []
        started = time.perf_counter_ns()
        for index in range(count):
            latencies.append(await self.timed_echo(tool, f"seq-{index}"))
        return CallTiming(latencies, time.perf_counter_ns() - started)

    async def windowed_calls(self, tool: str, count: int, window: int) -> CallTiming:
        """``count`` calls with ``window`` always outstanding: each worker issues its next call as soon as
        its previous one is answered."""
        latencies: list[int] = []
        issued = iter(range(count))

        async def worker() -> None:
            for index in issued:
                latencies.append(await self.timed_echo(tool, f"win-{index}"))

        started = time.perf_counter_ns()
        await asyncio.gather(*(worker() for _ in range(min(window, count))))
        return CallTiming(latencies, time.perf_counter_ns() - started)

    def rss_bytes(self) -> int | None:
        return read_vm_rss(self.process.pid)

    def cpu_seconds(self) -> float | None:
        return read_cpu_seconds(self.process.pid)

    async def close(self, grace_seconds: float = 3.0) -> None:
        """Close stdin (the stdio way to say goodbye), then make sure the whole process group is gone."""
        process = self.process
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), grace_seconds)
        except asyncio.TimeoutError:
            pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                await asyncio.wait_for(process.wait(), grace_seconds)
            except asyncio.TimeoutError:
                continue
        self._reader.cancel()
        try:
            await self._reader
        except (asyncio.CancelledError, McpCallError):
            pass


def read_vm_rss(pid: int) -> int | None:
    """Resident set size of one process (not its children), from /proc."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def read_cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time one process (not its children) has used so far, from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; the fields after its closing one are fixed.
    fields = stat[stat.rindex(")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")
