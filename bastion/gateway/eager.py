"""Start a coroutine at once, in the caller, and hand it to a Task only if it has to wait.

A request read from a pipe is forwarded by its coroutine; scheduled as an ordinary Task, that coroutine would
first wait a turn of the event loop, and with a cold cache after the wake-up that turn is a measurable part of
what one hop costs. Python 3.12's eager task factory does the same thing; this is the part of it Bastion needs.

While it runs eagerly the coroutine has no current task, so nothing it calls before its first suspension may
rely on ``asyncio.current_task()`` (``asyncio.timeout`` does; ``wait_for``, locks, events and futures do not).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Generator

_NOT_STARTED = object()


def start_eagerly(coroutine: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> asyncio.Task[Any] | None:
    """Run ``coroutine`` up to its first suspension now; return the Task that continues it, or None if it finished.

    An exception raised before the first suspension propagates to the caller, as a direct call's would.
    """
    try:
        yielded = coroutine.send(None)
    except StopIteration:
        return None
    return loop.create_task(_Resumed(coroutine, yielded))


class _Resumed(Coroutine[Any, Any, Any]):
    """A started coroutine, presented to a Task as if new: its first step returns what the eager step yielded.

    The Task then waits on that future exactly as it would have after running the step itself. A cancellation
    that reaches the Task before its first step is thrown into the coroutine at its suspension point, so the
    coroutine's own clean-up runs as it would in a Task of its own.
    """

    __slots__ = ("_coroutine", "_pending")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], yielded: Any) -> None:
        self._coroutine = coroutine
        self._pending = yielded

    def send(self, value: Any) -> Any:
        pending = self._pending
        if pending is not _NOT_STARTED:
            self._pending = _NOT_STARTED
            return pending
        return self._coroutine.send(value)

    def throw(self, exc: Any, value: Any = None, traceback: Any = None) -> Any:  # type: ignore[override]
        self._pending = _NOT_STARTED
        if value is None and traceback is None:
            return self._coroutine.throw(exc)
        return self._coroutine.throw(exc, value, traceback)

    def close(self) -> None:
        self._coroutine.close()

    def __await__(self) -> Generator[Any, None, Any]:
        raise TypeError("a resumed coroutine is driven by its Task alone")

    def __repr__(self) -> str:
        return f"<resumed {self._coroutine!r}>"
