"""Run a request without an asyncio Task: its coroutine started in the caller and resumed by whoever answers it,
or, when nothing needs to see it on the way, no coroutine at all.

A request read from a pipe is forwarded by its coroutine. As an ordinary Task, that coroutine would wait a
turn of the event loop before it starts, and another after its upstream answer arrives, each through a
scheduled callback; on a hop whose whole cost is tens of microseconds those turns are a large part of it. A
``RequestRunner`` runs the coroutine at once, up to its first suspension (as Python 3.12's eager tasks do),
and when it waits on an ``Answer`` the answer's ``settle`` resumes it directly. Any other awaitable (events,
sleeps, other futures) wakes it through the loop, exactly as a Task would be woken.

A runner is not a Task: while it runs there is no current task, so code on a request's path must not rely
on ``asyncio.current_task()`` (``asyncio.timeout`` and ``TaskGroup`` do; ``wait_for``, ``gather``, locks,
events, queues and futures do not).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Callable

log = logging.getLogger("bastion.gateway")


class Answer(asyncio.Future):  # type: ignore[type-arg]
    """A future for one upstream answer. A runner waiting on it is resumed inside ``settle``; anything else
    awaiting it (a Task) is woken as by any future."""

    # A class default rather than an __init__ of our own: the C constructor alone is half the cost.
    resume: Callable[[], None] | None = None

    def settle(self, value: Any) -> None:
        """Set the answer, unless the wait was already given up (cancelled or answered)."""
        if self.done():
            return
        self.set_result(value)
        resume, self.resume = self.resume, None
        if resume is not None:
            resume()


class RequestRunner:
    """Drives one coroutine to its end: ``cancel()`` and ``finished()`` stand in for a Task's."""

    __slots__ = ("_coroutine", "_loop", "_waiting", "_must_cancel", "_finished")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> None:
        self._coroutine: Coroutine[Any, Any, Any] | None = coroutine
        self._loop = loop
        self._waiting: asyncio.Future[Any] | None = None
        self._must_cancel = False
        self._finished: asyncio.Future[None] | None = None
        self._step()

    @property
    def done(self) -> bool:
        return self._coroutine is None

    def finished(self) -> asyncio.Future[None]:
        """A future done when the coroutine has ended, however it ended."""
        if self._finished is None:
            self._finished = self._loop.create_future()
            if self._coroutine is None:
                self._finished.set_result(None)
        return self._finished

    def cancel(self) -> None:
        """Raise CancelledError in the coroutine where it waits (at once if it waits on a future that can still
        be cancelled, else at its next step)."""
        if self._coroutine is None:
            return
        if self._waiting is not None and self._cancel_waiting(self._waiting):
            return
        self._must_cancel = True

    def _step(self, *_: Any) -> None:
        coroutine = self._coroutine
        if coroutine is None:
            return
        self._waiting = None
        try:
            if self._must_cancel:
                self._must_cancel = False
                yielded = coroutine.throw(asyncio.CancelledError())
            else:
                yielded = coroutine.send(None)
        except (StopIteration, asyncio.CancelledError):
            self._end()
            return
        except Exception:  # noqa: BLE001 - the coroutine's own error; it must not break the caller's transport
            self._end()
            log.exception("a request ended with an unhandled error")
            return
        if yielded is None:  # a bare yield (asyncio.sleep(0)): once round the loop
            self._loop.call_soon(self._step)
            return
        yielded._asyncio_future_blocking = False
        self._waiting = yielded
        if type(yielded) is Answer:
            yielded.resume = self._step
        else:
            yielded.add_done_callback(self._step)
        if self._must_cancel and self._cancel_waiting(yielded):
            self._must_cancel = False

    def _cancel_waiting(self, waiting: asyncio.Future[Any]) -> bool:
        if not waiting.cancel():
            return False
        if type(waiting) is Answer and waiting.resume is not None:
            waiting.resume = None  # a cancelled answer resumes nobody: go round the loop instead
            self._loop.call_soon(self._step)
        return True

    def _end(self) -> None:
        self._coroutine = None
        self._waiting = None
        if self._finished is not None and not self._finished.done():
            self._finished.set_result(None)


class DirectCall:
    """A request passed as it is to one server, whose answer goes straight back to the client: no coroutine.

    When no interceptor stands between a client and a server, forwarding a call is two lookups and two frames,
    and the coroutine chain a pipeline needs (frontend, pipeline, router, upstream) would cost more than the rest
    of the hop together. A ``DirectCall`` sits in the upstream's correlator where an ``Answer`` would, and in
    the connection's table of running requests where a ``RequestRunner`` would, with the same ``done``,
    ``cancel()`` and ``finished()``.

    ``deliver(origin_id, answer)`` gets the client's id for the call and the server's answer: a ``RawResponse``
    (a result that only passes through), an ``ErrorResponse`` (including the errors Bastion makes for a crash or a
    timeout), or ``None`` when the client cancelled the call and is owed no answer. One ``deliver`` serves all of a
    connection's calls.
    """

    __slots__ = ("_deliver", "_abandon", "origin_id", "pending", "resume", "done")

    def __init__(self, deliver: Callable[[Any, Any], None], abandon: Callable[[Any], None], origin_id: Any) -> None:
        self._deliver = deliver
        self._abandon = abandon  # given ``pending``: forget the call and tell the server it is given up
        self.origin_id = origin_id
        self.pending: Any = None  # the upstream's record of the call
        # (server, params as sent) when a modern server may answer ``input_required`` and the call must be retried
        # there; kept for no other call, since every object a call holds in flight is more for the garbage
        # collector to walk.
        self.resume: tuple[str, dict[str, Any]] | None = None
        self.done = False

    def settle(self, answer: Any) -> None:
        if self.done:
            return
        self.done = True
        self.pending = None  # it refers back to this call: without this the pair waits for the garbage collector
        self._deliver(self.origin_id, answer)

    def cancel(self) -> None:
        if self.done:
            return
        self.done = True
        pending, self.pending = self.pending, None
        self._abandon(pending)
        self._deliver(self.origin_id, None)

    def finished(self) -> asyncio.Future[None]:
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        finished.set_result(None)
        return finished
