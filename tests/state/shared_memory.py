"""A ``MemoryStore`` that says it is shared: two gateways built in one process on one of these are two replicas
on one store, for the code that keeps its records in the store only when replicas share it. ``down`` makes every
operation raise ``StateUnavailable`` as a store that cannot be reached does (a real one: tests/redis_server.py)."""

from __future__ import annotations

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
        if name in _OPERATIONS and object.__getattribute__(self, "down"):
            async def unreachable(*args: Any, **kwargs: Any) -> Any:
                raise StateUnavailable("the shared state store at test:0 cannot be reached (connection refused)")
            return unreachable
        return object.__getattribute__(self, name)
