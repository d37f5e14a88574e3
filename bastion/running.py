"""What each running gateway says of its servers, for ``bastion servers`` in another terminal, and how that command
asks one for a retry.

Each ``bastion run`` / ``bastion serve`` keeps a status file, ``$XDG_STATE_HOME/bastion/running/PID.json``: its
configuration, and each server's state (ready, starting, failed, restarting), why, and its last stderr lines when a
start failed. It is rewritten whole (a reader never sees half of one) whenever a server's state changes, on a thread,
and removed when the gateway stops; one whose process is gone (killed) is ignored and removed by the next reader.

``bastion servers retry NAME`` drops a request file beside it (``PID.retry-UNIQUE``, the server's name) and sends
the gateway SIGUSR1; the gateway reads the requests and starts those servers again at once. A pid alone could name a
later process that reused it: the status file records the process's start time, checked before any signal.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import orjson

from bastion.files import replace_atomically
from bastion.gateway.restarts import STDERR_QUOTED
from bastion.paths import state_dir
from bastion.policy.approval import process_started

log = logging.getLogger("bastion.running")

RETRY_SIGNAL = signal.SIGUSR1
_RETRY_MARK = ".retry-"


def running_dir() -> Path:
    return state_dir() / "running"


@dataclass(frozen=True, slots=True)
class RunningGateway:
    """One live gateway's status file, as read."""

    pid: int
    config: str | None
    servers: dict[str, dict[str, Any]]
    path: Path


def running_gateways(directory: Path | None = None) -> list[RunningGateway]:
    """The status files of the gateways that still run, oldest pid first; those of gone processes are removed."""
    directory = directory or running_dir()
    found = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        try:
            record = orjson.loads(path.read_bytes())
            pid = int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
            continue  # being replaced right now, or not one of ours
        if process_started(pid) != record.get("pid_started"):
            _remove_quietly(path)
            continue
        servers = record.get("servers")
        found.append(RunningGateway(pid, record.get("config"), servers if isinstance(servers, dict) else {}, path))
    return sorted(found, key=lambda g: g.pid)


def ask_retry(gateway: RunningGateway, server: str) -> None:
    """Ask ``gateway`` to start ``server`` again now (raises OSError when it cannot be asked)."""
    request = gateway.path.with_name(f"{gateway.pid}{_RETRY_MARK}{uuid.uuid4().hex}")
    request.write_text(server)
    try:
        os.kill(gateway.pid, RETRY_SIGNAL)
    except OSError:
        _remove_quietly(request)
        raise


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


class StatusBoard:
    """Keeps this process's status file up to date with its gateway's servers, and takes retry requests.

    ``upstreams``: the gateway's servers by name (each with ``status``, ``failure``, ``last_stderr``,
    ``failed_starts``, ``gave_up``, ``retry()`` and an ``on_status`` hook this sets)."""

    def __init__(self, upstreams: Mapping[str, Any], config: str | None, directory: Path | None = None) -> None:
        self._upstreams = upstreams
        self._config = config
        self._directory = directory or running_dir()
        self._pid = os.getpid()
        self._path = self._directory / f"{self._pid}.json"
        self._dirty = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        self.follow()
        self._writer = asyncio.create_task(self._write_when_changed())
        try:
            asyncio.get_running_loop().add_signal_handler(RETRY_SIGNAL, self._retry_requested)
        except (NotImplementedError, RuntimeError):  # no signals here (not the main thread): no retries by request
            pass

    def follow(self) -> None:
        """Watch every server now in the gateway's set (a reload adds and replaces some), and write the file again."""
        for upstream in self._upstreams.values():
            upstream.on_status = self._dirty.set
        self._dirty.set()

    async def close(self) -> None:
        self._closed = True
        try:
            asyncio.get_running_loop().remove_signal_handler(RETRY_SIGNAL)
            # Ignored, not back to its default (which ends the process): a retry asked of a gateway that is closing
            # (its status file read just before it went) must not kill it mid-shutdown.
            signal.signal(RETRY_SIGNAL, signal.SIG_IGN)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        await asyncio.to_thread(_remove_quietly, self._path)

    def record(self) -> dict[str, Any]:
        return {"pid": self._pid, "pid_started": process_started(self._pid), "config": self._config,
                "servers": {name: describe(upstream) for name, upstream in self._upstreams.items()}}

    async def _write_when_changed(self) -> None:
        while not self._closed:
            await self._dirty.wait()
            self._dirty.clear()  # a change while this one is written is written next
            try:
                await asyncio.to_thread(self._write, orjson.dumps(self.record(), option=orjson.OPT_INDENT_2))
            except OSError as exc:
                log.debug("the status file %s could not be written: %s", self._path, exc)

    def _write(self, data: bytes) -> None:
        # The user's own (0600 in a 0700 folder): a server's stderr lines may say more than the user would show
        # another account.
        replace_atomically(self._path, data)

    def _retry_requested(self) -> None:
        task = asyncio.ensure_future(self._take_retries())
        task.add_done_callback(_report_failure)

    async def _take_retries(self) -> None:
        for name in await asyncio.to_thread(_take_requests, self._directory, self._pid):
            upstream = self._upstreams.get(name)
            if upstream is None:
                log.warning("`bastion servers retry %s`: this gateway has no server %r", name, name)
            elif upstream.retry():
                log.info("server %s: starting it again, as `bastion servers retry` asked", name)
            else:
                log.info("`bastion servers retry %s`: server %s is %s; nothing to retry", name, name, upstream.status)


def _take_requests(directory: Path, pid: int) -> list[str]:
    names = []
    for request in directory.glob(f"{pid}{_RETRY_MARK}*"):
        try:
            names.append(request.read_text().strip())
        except OSError:
            continue
        _remove_quietly(request)
    return names


def _report_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("taking the retry requests failed: %r", error)


def describe(upstream: Any) -> dict[str, Any]:
    """One server's entry in the status file."""
    status = upstream.status
    entry: dict[str, Any] = {"status": status}
    if status != "ready":
        entry["reason"] = upstream.failure or getattr(upstream, "doing", None) or "starting"
    if status == "failed":
        entry["failed_starts"] = upstream.failed_starts
        entry["retried"] = "never: fix its configuration, then restart Bastion" if upstream.stopped else (
            "when asked" if upstream.gave_up else "after a backoff")
        entry["stderr"] = list(upstream.last_stderr[-STDERR_QUOTED:])
    return entry


def status_lines(gateways: list[RunningGateway], named: Callable[[str], bool] = lambda _: True) -> list[str]:
    """``bastion servers``' answer: one line per server of each running gateway, failed ones with why and what
    retries them."""
    lines = []
    for gateway in gateways:
        lines.append(f"gateway {gateway.pid} ({gateway.config or 'the demo configuration'}):")
        for name, entry in gateway.servers.items():
            if not named(name):
                continue
            status = entry.get("status", "?")
            line = f"  {name}: {status}"
            if status != "ready":
                line += f": {entry.get('reason', '')}"
            if status == "failed":
                line += f" ({entry.get('failed_starts')} failed start(s) in a row; restarted {entry.get('retried')})"
                line += "".join(f"\n      {text}" for text in entry.get("stderr") or ())
                if entry.get("retried") == "when asked":
                    line += f"\n    retry: bastion servers retry {name}"
            lines.append(line)
    return lines
