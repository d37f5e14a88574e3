"""What every replica of a gateway must agree on, behind one small interface: keys recorded for a while.

One gateway process keeps them in its memory (``MemoryState``), shared by all of its connections and requests (a
2026-07-28 HTTP client's every POST is a connection of its own). Gateways scaled out to several replicas are each
given an implementation backed by one store they all reach (a key-value server's atomic set-if-absent with an
expiry, say), so that what one replica recorded the others see; nothing that uses it changes.

Kept here now: which approvals (``requestState``) were used, so that one approval runs one call, and with
``policy.approval.reuse_seconds``, which calls a person approved within that window (bastion/policy/approval.py,
bastion/policy/interceptors.py). Imports nothing of Bastion.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

_PRUNE_FLOOR = 256  # below this many records, expired ones are left to be found by their next check


class SharedState(Protocol):
    async def claim(self, key: str, seconds: float) -> bool:
        """Record ``key`` for ``seconds`` unless it is recorded now, as one atomic check-and-set: True for the caller
        that recorded it, False for every other until the record expires. Of any number of concurrent claims of one
        key, from any replica that shares the state, exactly one is True."""
        ...

    async def recorded(self, key: str) -> bool:
        """Whether ``key`` is recorded now (claimed, and its time not up)."""
        ...


class MemoryState:
    """``SharedState`` in this process's memory: shared by every connection of the gateway, not by other processes.

    A claim checks and records without yielding to the event loop, under a lock for callers on other threads, so of
    concurrent claims of one key exactly one wins. Expired records are dropped whenever the table has doubled since
    it was last swept, so it stays about the size of what is live.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()
        self._sweep_at = _PRUNE_FLOOR

    async def claim(self, key: str, seconds: float) -> bool:
        now = self._clock()
        with self._lock:
            if self._until.get(key, now) > now:
                return False
            self._until[key] = now + seconds
            if len(self._until) >= self._sweep_at:
                self._until = {k: until for k, until in self._until.items() if until > now}
                self._sweep_at = max(_PRUNE_FLOOR, 2 * len(self._until))
            return True

    async def recorded(self, key: str) -> bool:
        with self._lock:
            return self._until.get(key, float("-inf")) > self._clock()
