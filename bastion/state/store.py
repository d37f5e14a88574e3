"""What every replica of a gateway must agree on, behind one small interface: ``StateStore``.

One gateway process keeps it in its memory (``MemoryStore``, the default, shared by all of its connections and
requests: a 2026-07-28 HTTP client's every POST is a connection of its own). Replicas of a gateway are each given a
``RedisStore`` on one Redis they all reach, so that what one replica records the others see; nothing that uses the
store changes. Every operation is atomic on its own: of concurrent callers, on any replica, each sees the state
before or after another's operation, never half of it.

The operations are the few shapes the gateway's state takes: single-use records (``claim``), values with an expiry
(``get``/``put``), maps of them (``map_*``: pins, a caller's taint), counters with a ceiling (``add``: session
quotas), token buckets (``take``: rate limits, one round trip for all of a call's buckets), sliding windows
(``hit``: guardrail budgets), numbered logs (``append``/``read_after``: SSE redelivery) and messages between
replicas (``publish``/``subscribe``). Times are seconds; a store measures them by one clock of its own (Redis's, for
a Redis store), so replicas whose clocks disagree agree about expiries and refills.

A store that cannot be reached raises ``StateUnavailable``: what needs the state to decide refuses (fails closed)
and says so, and the next operation tries again, so the gateway recovers by itself when the store is back.

Keys are the callers' own strings; a store prefixes them with its namespace. Imports nothing of Bastion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Protocol, Sequence


class StateUnavailable(Exception):
    """The shared state store cannot be reached (or answered wrongly); the message names the store and why."""


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket: ``rate`` tokens a second, at most ``burst`` held; a new bucket starts full."""

    key: str
    rate: float
    burst: float


@dataclass(frozen=True, slots=True)
class Taken:
    """What ``take`` did: ``wait`` 0 when every bucket gave a token, else the seconds until the one that refused
    (``refused``, its index in the buckets asked) has one, and no bucket gave any."""

    wait: float = 0.0
    refused: int = -1

    @property
    def granted(self) -> bool:
        return self.wait == 0.0


TAKEN = Taken()


class Subscription(Protocol):
    """Messages published to one channel from the moment ``subscribe`` returned, in the order published."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class StateStore(Protocol):
    # ------------------------------------------------------------------ single-use records
    async def claim(self, key: str, seconds: float) -> bool:
        """Record ``key`` for ``seconds`` unless it is recorded now: True for the caller that recorded it, False for
        every other until the record expires. Of any number of concurrent claims of one key, exactly one is True."""
        ...

    async def recorded(self, key: str) -> bool:
        """Whether ``key`` is recorded now (claimed or put, and its time not up)."""
        ...

    # ------------------------------------------------------------------ values
    async def get(self, key: str) -> bytes | None:
        ...

    async def put(self, key: str, value: bytes, seconds: float | None = None) -> None:
        """Set ``key`` to ``value``, expiring after ``seconds`` (never, with None)."""
        ...

    async def delete(self, key: str) -> bool:
        """Forget ``key`` (a value, a map, a counter, a log or a record): whether it was there."""
        ...

    # ------------------------------------------------------------------ maps
    async def map_get(self, key: str, field: str) -> bytes | None:
        ...

    async def map_all(self, key: str) -> dict[str, bytes]:
        ...

    async def map_put(self, key: str, values: dict[str, bytes], seconds: float | None = None) -> None:
        """Set these fields of the map at ``key``; with ``seconds``, the whole map expires that long from now."""
        ...

    async def map_delete(self, key: str, fields: Sequence[str]) -> None:
        ...

    # ------------------------------------------------------------------ counters
    async def add(self, key: str, delta: int, *, limit: int | None = None,
                  seconds: float | None = None) -> int | None:
        """Add ``delta`` to the counter at ``key`` (0 when absent) and return the new count; None, changing nothing,
        when the count would pass ``limit``. A count that reaches 0 or less is forgotten. With ``seconds``, the
        counter expires that long after its last change (a bound for holders that die without subtracting)."""
        ...

    # ------------------------------------------------------------------ rate
    async def take(self, buckets: Sequence[Bucket]) -> Taken:
        """Take one token from each bucket, or from none: all at once or nothing, in one round trip."""
        ...

    async def hit(self, key: str, limit: int, window: float) -> float:
        """Count one event in the sliding ``window`` at ``key`` unless ``limit`` are counted in it already: 0 when
        counted, else the seconds until the oldest leaves the window (nothing counted then)."""
        ...

    # ------------------------------------------------------------------ numbered logs
    async def append(self, key: str, value: bytes, *, keep: int, seconds: float) -> int:
        """Append ``value`` to the log at ``key`` and return its number (1, 2, ...: one more than the last). The log
        keeps its last ``keep`` entries and expires ``seconds`` after its last append."""
        ...

    async def read_after(self, key: str, after: int) -> tuple[int, list[tuple[int, bytes]]]:
        """The entries numbered after ``after``, oldest first, and the number of the oldest entry kept (0 when the
        log is empty or gone): a reader that asked for less than it missed entries that are no longer kept."""
        ...

    # ------------------------------------------------------------------ messages between replicas
    async def publish(self, channel: str, message: bytes) -> int:
        """Send ``message`` to everyone subscribed to ``channel`` now: how many received it, 0 when none did (on any
        replica; a Redis store counts each replica's one pub/sub connection once, however many subscribers it
        serves, so only 0 or not means the same on every store)."""
        ...

    async def subscribe(self, channel: str) -> Subscription:
        ...

    # ------------------------------------------------------------------ the store itself
    async def ping(self) -> None:
        """Return when the store answers; raise ``StateUnavailable`` saying why when it does not."""
        ...

    async def aclose(self) -> None:
        ...

    @property
    def shared(self) -> bool:
        """Whether other processes see this store (False for memory): what only one process may do (keep a file,
        for instance) may rely on it being False."""
        ...
