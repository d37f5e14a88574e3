"""What each running gateway says of its servers, for ``bastion servers`` in another terminal, and how that command
asks one for a retry.

Each ``bastion run`` / ``bastion serve`` keeps a status file, ``$XDG_STATE_HOME/bastion/running/PID.json``: its
configuration, each server's state (ready, starting, failed, restarting), why, its protocol era, sandbox, restarts
and last stderr lines, and the federated catalog's tools (their definitions, for the web console's token costs and
pin states). It is rewritten whole (a reader never sees half of one) whenever a server's state changes, and when the
catalog or a server's stderr has changed (looked at every ``WATCH_SECONDS``), on a thread, and removed when the
gateway stops; one whose process is gone (killed) is ignored and removed by the next reader. What it holds is
bounded: ``STDERR_KEPT`` lines of ``LINE_KEPT`` characters per server, ``CATALOG_KEPT`` tools of at most
``DEFINITION_KEPT`` bytes each and ``DEFINITIONS_KEPT`` together (a tool past either is listed without its
definition).

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
from dataclasses import dataclass, field
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
WATCH_SECONDS = 2.0
STDERR_KEPT = 20
LINE_KEPT = 1000
CATALOG_KEPT = 5000
DEFINITION_KEPT = 64 * 1024
DEFINITIONS_KEPT = 8 * 1024 * 1024


def running_dir() -> Path:
    return state_dir() / "running"


@dataclass(frozen=True, slots=True)
class RunningGateway:
    """One live gateway's status file, as read."""

    pid: int
    config: str | None
    servers: dict[str, dict[str, Any]]
    path: Path
    # the catalog's tools: server, name (the server's own), exposed (the client's), definition (None past
    # DEFINITION_KEPT bytes); and whether tools past CATALOG_KEPT were left out
    catalog: list[dict[str, Any]] = field(default_factory=list)
    catalog_cut: bool = False


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
        catalog = record.get("catalog")
        found.append(RunningGateway(pid, record.get("config"), servers if isinstance(servers, dict) else {}, path,
                                    [t for t in catalog if isinstance(t, dict)] if isinstance(catalog, list) else [],
                                    bool(record.get("catalog_cut"))))
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


def ask_reload(gateway: RunningGateway) -> None:
    """Ask ``gateway`` to read its configuration again (SIGHUP; raises OSError when it cannot be asked)."""
    os.kill(gateway.pid, signal.SIGHUP)


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


class StatusBoard:
    """Keeps this process's status file up to date with its gateway's servers, and takes retry requests.

    ``upstreams``: the gateway's servers by name (each with ``status``, ``failure``, ``last_stderr``,
    ``failed_starts``, ``gave_up``, ``retry()`` and an ``on_status`` hook this sets); ``catalog``: the federated
    catalog (``version``, ``tools()``), None to leave it out."""

    def __init__(self, upstreams: Mapping[str, Any], config: str | None, directory: Path | None = None, *,
                 catalog: Any = None) -> None:
        self._upstreams = upstreams
        self._catalog = catalog
        self._seen: tuple[Any, ...] = ()
        self._watcher: asyncio.Task[None] | None = None
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
        self._watcher = asyncio.create_task(self._watch())
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
        for task in (self._writer, self._watcher):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(_remove_quietly, self._path)

    def record(self) -> dict[str, Any]:
        return whole(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        """The record, with the catalog's tools as the catalog holds them now (a list it replaces, never changes):
        turned into entries by ``whole``, on the writer's thread, not on the event loop."""
        record: dict[str, Any] = {"pid": self._pid, "pid_started": process_started(self._pid), "config": self._config,
                                  "servers": {name: describe(upstream) for name, upstream in self._upstreams.items()}}
        if self._catalog is not None:
            record["catalog"] = self._catalog.tools()
        return record

    def _fingerprint(self) -> tuple[Any, ...]:
        """What changes without a change of state: the catalog's version and each server's latest stderr line."""
        version = getattr(self._catalog, "version", None)
        return (version, *(_last_stderr(upstream) for upstream in self._upstreams.values()))

    async def _watch(self) -> None:
        # Polled, not hooked: a server's stderr and the catalog change on paths that must stay free of this.
        while not self._closed:
            await asyncio.sleep(WATCH_SECONDS)
            seen = self._fingerprint()
            if seen != self._seen:
                self._seen = seen
                self._dirty.set()

    async def _write_when_changed(self) -> None:
        while not self._closed:
            await self._dirty.wait()
            self._dirty.clear()  # a change while this one is written is written next
            try:
                snapshot = self.snapshot()
                await asyncio.to_thread(lambda: self._write(orjson.dumps(whole(snapshot), option=orjson.OPT_INDENT_2)))
            except (OSError, TypeError) as exc:  # TypeError: a definition JSON cannot hold (never from a server's JSON)
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
        entry["stderr"] = _kept(upstream.last_stderr[-STDERR_QUOTED:])
    else:
        entry["stderr"] = _kept(getattr(upstream, "stderr_tail", None) or [])
    entry["era"] = getattr(upstream, "protocol_version", None)
    entry["restarts"] = max(0, getattr(upstream, "starts", 0) - 1)
    entry["sandbox"] = sandbox_of(getattr(upstream, "config", None))
    return entry


def _kept(lines: list[str]) -> list[str]:
    return [line[:LINE_KEPT] for line in lines[-STDERR_KEPT:]]


def _last_stderr(upstream: Any) -> Any:
    tail = getattr(upstream, "stderr_tail", None) or upstream.last_stderr
    return (len(tail), tail[-1]) if tail else None


def sandbox_of(config: Any) -> str | None:
    """How a server runs, in a few words: remote (no process), unsandboxed, or its sandbox profile and egress."""
    if config is None:
        return None
    if getattr(config, "url", None) is not None:
        return "remote: no local process"
    sandbox = getattr(config, "sandbox", None)
    if sandbox is None or sandbox.profile == "none":
        return "none"
    network = f"egress to {', '.join(sandbox.network)}" if sandbox.network else "network off"
    runtime = ", gVisor" if getattr(sandbox, "runtime", "bubblewrap") == "gvisor" else ""
    return f"{sandbox.profile}{runtime}, {network}"


def whole(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The status file's record from a ``snapshot``: its catalog's tools as entries, at most ``CATALOG_KEPT``, their
    definitions together at most ``DEFINITIONS_KEPT`` bytes (the tools past it are listed without theirs)."""
    tools = snapshot.get("catalog")
    if tools is None:
        return snapshot
    entries, room = [], DEFINITIONS_KEPT
    for tool in list(tools)[:CATALOG_KEPT]:
        entry = catalog_entry(tool, min(room, DEFINITION_KEPT))
        room -= entry["bytes"] if entry["definition"] is not None else 0
        entries.append(entry)
    return {**snapshot, "catalog": entries, "catalog_cut": len(tools) > CATALOG_KEPT}


def catalog_entry(tool: Any, most: int = DEFINITION_KEPT) -> dict[str, Any]:
    """One tool of the catalog in the status file; its definition left out past ``most`` bytes."""
    definition = dict(tool.definition)
    size = len(orjson.dumps(definition))
    return {"server": tool.server, "name": tool.original_name, "exposed": tool.exposed_name,
            "definition": definition if size <= most else None, "bytes": size}


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
