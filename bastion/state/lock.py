"""A lock between replicas on one ``StateStore``: for a document that must change as a whole (read, change, write)
where per-field writes cannot keep two writers from losing each other's change.

The lock is a ``claim`` with an expiry, so a replica that dies holding it blocks the others for at most that long.
A holder slower than the expiry may overlap the next one: keep what is done under it short (a read and a write).
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator

from bastion.state.store import StateStore, StateUnavailable

HOLD_SECONDS = 10.0  # how long a lock outlives a holder that died
WAIT_SECONDS = 15.0  # how long a caller waits for a lock before it gives up (a little more than HOLD_SECONDS)


@asynccontextmanager
async def locked(store: StateStore, key: str, *, hold: float = HOLD_SECONDS,
                 wait: float = WAIT_SECONDS) -> AsyncIterator[None]:
    """Hold the lock ``key`` of ``store`` for the block; ``StateUnavailable`` when the store cannot be reached or the
    lock stays held by another for ``wait`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    pause = 0.002
    while not await store.claim(key, hold):
        if loop.time() >= deadline:
            raise StateUnavailable(f"the lock {key!r} of the shared state stayed held by another replica for "
                                   f"{wait:g} s; try again")
        await asyncio.sleep(pause)  # backing off: another replica holds it for one read and one write
        pause = min(pause * 2, 0.05)
    try:
        yield
    finally:
        await store.delete(key)
