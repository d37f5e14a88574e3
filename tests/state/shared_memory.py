"""A ``MemoryStore`` that says it is shared: two gateways built in one process on one of these are two replicas
on one store, for the code that keeps its records in the store only when replicas share it. ``down`` makes every
operation raise ``StateUnavailable`` as a store that cannot be reached does (a real one: tests/redis_server.py), and
every operation lets other tasks run before it, as a round trip to a real store does."""

from __future__ import annotations

import asyncio
from typing import Any

from bastion.state import MemoryStore, StateUnavailable

_OPERATIONS = ("claim", "recorded", "get", "put", "delete", "map_get", "map_all", "map_put", "map_delete", "add",
               "take", "hit", "append", "read_after", "publish", "subscribe", "ping")


class SharedMemoryStore(MemoryStore):
    down = False

    @property
    def shared(self) -> bool:
        return True

    def __getattribute__(self, name: str) -> Any:
        found = object.__getattribute__(self, name)
        if name not in _OPERATIONS:
            return found
        store = self

        async def over_the_network(*args: Any, **kwargs: Any) -> Any:
            # Another task runs between a caller's operations, as it does while a real store's answer travels.
            await asyncio.sleep(0)
            if object.__getattribute__(store, "down"):
                raise StateUnavailable("the shared state store at test:0 cannot be reached (connection refused)")
            return await found(*args, **kwargs)
        return over_the_network
