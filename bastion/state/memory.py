"""``StateStore`` in this process's memory: the default, shared by every connection of one gateway, by no other
process. Each operation runs to its end without yielding to the event loop, under a lock for callers on other
threads, which makes it atomic. Expired entries are dropped whenever the table has doubled since it was last swept,
so it stays about the size of what is live."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from typing import Any, AsyncIterator, Callable, Sequence

from bastion.state.store import TAKEN, Bucket, Taken

_SWEEP_FLOOR = 256  # below this many entries, expired ones are left to be found by their next use
_NEVER = math.inf


class _Log:
    __slots__ = ("entries", "last")

    def __init__(self) -> None:
        self.entries: deque[tuple[int, bytes]] = deque()
        self.last = 0


class _Channel:
    """One in-process subscription: a queue ``publish`` fills without waiting."""

    def __init__(self, store: "MemoryStore", channel: str) -> None:
        self._store = store
        self._channel = channel
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    def deliver(self, message: bytes) -> None:
        self._queue.put_nowait(message)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            message = await self._queue.get()
            if message is None:
                return
            yield message

    async def aclose(self) -> None:
        self._store._unsubscribe(self._channel, self)
        self._queue.put_nowait(None)


class MemoryStore:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[str, tuple[Any, float]] = {}
        self._lock = threading.Lock()
        self._sweep_at = _SWEEP_FLOOR
        self._channels: dict[str, list[_Channel]] = {}

    @property
    def shared(self) -> bool:
        return False

    # ------------------------------------------------------------------ the table
    def _live(self, key: str, now: float) -> Any:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[1] <= now:
            del self._entries[key]
            return None
        return entry[0]

    def _set(self, key: str, value: Any, until: float, now: float) -> None:
        self._entries[key] = (value, until)
        if len(self._entries) >= self._sweep_at:
            self._entries = {k: entry for k, entry in self._entries.items() if entry[1] > now}
            self._sweep_at = max(_SWEEP_FLOOR, 2 * len(self._entries))

    @staticmethod
    def _until(now: float, seconds: float | None) -> float:
        return _NEVER if seconds is None else now + seconds

    # ------------------------------------------------------------------ single-use records
    async def claim(self, key: str, seconds: float) -> bool:
        now = self._clock()
        with self._lock:
            if self._live(key, now) is not None:
                return False
            self._set(key, b"1", now + seconds, now)
            return True

    async def recorded(self, key: str) -> bool:
        with self._lock:
            return self._live(key, self._clock()) is not None

    # ------------------------------------------------------------------ values
    async def get(self, key: str) -> bytes | None:
        with self._lock:
            value = self._live(key, self._clock())
        return value if isinstance(value, bytes) else None

    async def put(self, key: str, value: bytes, seconds: float | None = None) -> None:
        now = self._clock()
        with self._lock:
            self._set(key, bytes(value), self._until(now, seconds), now)

    async def delete(self, key: str) -> bool:
        now = self._clock()
        with self._lock:
            found = self._live(key, now) is not None
            self._entries.pop(key, None)
            return found

    # ------------------------------------------------------------------ maps
    async def map_get(self, key: str, field: str) -> bytes | None:
        with self._lock:
            found = self._live(key, self._clock())
            return found.get(field) if isinstance(found, dict) else None

    async def map_all(self, key: str) -> dict[str, bytes]:
        with self._lock:
            found = self._live(key, self._clock())
            return dict(found) if isinstance(found, dict) else {}

    async def map_put(self, key: str, values: dict[str, bytes], seconds: float | None = None) -> None:
        now = self._clock()
        with self._lock:
            found = self._live(key, now)
            until = self._entries[key][1] if isinstance(found, dict) and seconds is None else self._until(now, seconds)
            merged = dict(found) if isinstance(found, dict) else {}
            merged.update((field, bytes(value)) for field, value in values.items())
            self._set(key, merged, until, now)

    async def map_delete(self, key: str, fields: Sequence[str]) -> None:
        now = self._clock()
        with self._lock:
            found = self._live(key, now)
            if not isinstance(found, dict):
                return
            for field in fields:
                found.pop(field, None)
            if not found:
                del self._entries[key]

    # ------------------------------------------------------------------ counters
    async def add(self, key: str, delta: int, *, limit: int | None = None,
                  seconds: float | None = None) -> int | None:
        now = self._clock()
        with self._lock:
            found = self._live(key, now)
            count = (found if isinstance(found, int) else 0) + delta
            if limit is not None and delta > 0 and count > limit:
                return None
            if count <= 0:
                self._entries.pop(key, None)
            else:
                self._set(key, count, self._until(now, seconds), now)
            return count

    # ------------------------------------------------------------------ rate
    async def take(self, buckets: Sequence[Bucket]) -> Taken:
        now = self._clock()
        with self._lock:
            levels = []
            wait, refused = 0.0, -1
            for index, bucket in enumerate(buckets):
                found = self._live(bucket.key, now)
                tokens = (min(bucket.burst, found[0] + (now - found[1]) * bucket.rate)
                          if found is not None else bucket.burst)
                levels.append(tokens)
                if tokens < 1.0:
                    delay = (1.0 - tokens) / bucket.rate
                    if delay > wait:
                        wait, refused = delay, index
            if wait > 0:
                return Taken(wait, refused)
            for bucket, tokens in zip(buckets, levels):
                # Kept while it refills: a full bucket is the same as none, so it may expire then.
                self._set(bucket.key, (tokens - 1.0, now), now + bucket.burst / bucket.rate + 1.0, now)
            return TAKEN

    async def hit(self, key: str, limit: int, window: float) -> float:
        now = self._clock()
        with self._lock:
            found = self._live(key, now)
            times: deque[float] = found if isinstance(found, deque) else deque()
            while times and times[0] <= now - window:
                times.popleft()
            if len(times) >= limit:
                return max(times[0] + window - now, 1e-9) if times else window
            times.append(now)
            self._set(key, times, now + window, now)
            return 0.0

    # ------------------------------------------------------------------ numbered logs
    async def append(self, key: str, value: bytes, *, keep: int, seconds: float) -> int:
        now = self._clock()
        with self._lock:
            found = self._live(key, now)
            log = found if isinstance(found, _Log) else _Log()
            log.last += 1
            log.entries.append((log.last, bytes(value)))
            while len(log.entries) > keep:
                log.entries.popleft()
            self._set(key, log, now + seconds, now)
            return log.last

    async def read_after(self, key: str, after: int) -> tuple[int, list[tuple[int, bytes]]]:
        with self._lock:
            found = self._live(key, self._clock())
            if not isinstance(found, _Log) or not found.entries:
                return 0, []
            return found.entries[0][0], [entry for entry in found.entries if entry[0] > after]

    # ------------------------------------------------------------------ messages
    async def publish(self, channel: str, message: bytes) -> int:
        listeners = list(self._channels.get(channel, ()))
        for listener in listeners:
            listener.deliver(bytes(message))
        return len(listeners)

    async def subscribe(self, channel: str) -> _Channel:
        listener = _Channel(self, channel)
        self._channels.setdefault(channel, []).append(listener)
        return listener

    def _unsubscribe(self, channel: str, listener: _Channel) -> None:
        listeners = self._channels.get(channel)
        if listeners and listener in listeners:
            listeners.remove(listener)
            if not listeners:
                del self._channels[channel]

    # ------------------------------------------------------------------ the store itself
    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        for listeners in list(self._channels.values()):
            for listener in list(listeners):
                await listener.aclose()
