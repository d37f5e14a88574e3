"""Say on stderr that a slow step is running, and how long it took.

``with step("installing @modelcontextprotocol/server-memory"):`` (or ``async with``) is silent for a step that
ends within a second. One that runs longer is announced once it has run a second ("installing ……") and, when it
ends, how long it took. Both go through the ``bastion.progress`` logger at INFO, so they reach stderr wherever
the command's logging goes and never stdout, which is the protocol channel on stdio.

The announcement is made by a timer (a daemon thread in ``with``, ``loop.call_later`` in ``async with``), never
by sleeping, so it neither holds the event loop nor the step's own thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from types import TracebackType
from typing import Callable

log = logging.getLogger("bastion.progress")

ANNOUNCE_AFTER_SECONDS = 1.0

# Who wants to know, in the task (or thread) that runs a step, what it is doing now: told each step's label when it
# starts and None when it ends (the gateway's supervisor of a server: what that server's start is doing, for the
# clients and `bastion servers`). A context variable, so each server's start tells its own supervisor only.
_WATCHER: contextvars.ContextVar[Callable[[str | None], None] | None] = contextvars.ContextVar(
    "bastion.progress.watcher", default=None)


def watch(doing: Callable[[str | None], None]) -> None:
    """Tell ``doing`` of every step run from now on in this task (or thread, and the tasks it starts)."""
    _WATCHER.set(doing)


class Step:
    """One step's announcement; made by :func:`step`."""

    def __init__(self, label: str, announce_after: float = ANNOUNCE_AFTER_SECONDS, logger: logging.Logger = log):
        self.label = label
        self.announce_after = announce_after
        self._log = logger
        self._started = 0.0
        self._announced = False
        self._finished = False
        self._lock = threading.Lock()
        self._cancel_timer = lambda: None
        self._watcher: Callable[[str | None], None] | None = None

    # -- sync ---------------------------------------------------------------------------------------------------
    def __enter__(self) -> "Step":
        self._started = time.monotonic()
        self._tell_watcher(self.label)
        timer = threading.Timer(self.announce_after, self._announce)
        timer.daemon = True  # a step still running at exit must not hold the process
        timer.start()
        self._cancel_timer = timer.cancel
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._finish(kind)

    # -- async --------------------------------------------------------------------------------------------------
    async def __aenter__(self) -> "Step":
        self._started = time.monotonic()
        self._tell_watcher(self.label)
        handle = asyncio.get_running_loop().call_later(self.announce_after, self._announce)
        self._cancel_timer = handle.cancel
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._finish(kind)

    # -- both ---------------------------------------------------------------------------------------------------
    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    @property
    def announced(self) -> bool:
        return self._announced

    def _announce(self) -> None:
        # Logged under the lock so that whoever sees ``announced`` also sees the line it announces.
        with self._lock:
            if self._finished:
                return
            self._log.info("%s…", self.label)
            self._announced = True

    def _tell_watcher(self, label: str | None) -> None:
        watcher = self._watcher = _WATCHER.get() if label is not None else self._watcher
        if watcher is not None:
            watcher(label)

    def _finish(self, kind: type[BaseException] | None) -> None:
        self._cancel_timer()
        self._tell_watcher(None)
        elapsed = self.elapsed
        with self._lock:
            self._finished = True
            announced = self._announced
        # A step that held its thread or the loop past the second (so the timer could not fire in time) is still
        # reported at its end: what matters to the reader is that something took this long.
        if not announced and elapsed < self.announce_after:
            return
        if kind is None:
            self._log.info("%s: done in %s", self.label, _seconds(elapsed))
        elif issubclass(kind, (asyncio.CancelledError, KeyboardInterrupt)):
            self._log.info("%s: stopped after %s", self.label, _seconds(elapsed))
        else:
            self._log.info("%s: failed after %s", self.label, _seconds(elapsed))


def step(label: str, *, announce_after: float = ANNOUNCE_AFTER_SECONDS) -> Step:
    """A context manager (``with`` or ``async with``) announcing ``label`` if it runs over ``announce_after``."""
    return Step(label, announce_after)


def _seconds(elapsed: float) -> str:
    if elapsed < 60:
        return f"{elapsed:.1f} s"
    minutes, seconds = divmod(int(elapsed), 60)
    return f"{minutes} min {seconds:02d} s"
