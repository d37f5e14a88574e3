"""The shared state for code that blocks: a command of the CLI, a worker thread of the console.

A store's connections belong to one event loop; ``Blocking`` runs one on a thread of its own, and each ``run``
waits there for one coroutine. The store used through it must be used only through it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


class Blocking:
    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="bastion-state", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """The outcome of ``coroutine``, run on this runner's loop; the caller's thread waits for it."""
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("Blocking.run called on its own loop: it would wait for itself")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
