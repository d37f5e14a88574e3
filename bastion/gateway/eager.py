"""The future an upstream's answer arrives in.

Every client request runs in an asyncio Task of its own (``bastion.frontends.connection``), so ``asyncio.timeout``,
``TaskGroup``, anyio and the clients built on them work in an interceptor. The Task that forwards a request
awaits an ``Answer``, which the upstream's data callback settles. A ``RawAnswer`` is the same, for a caller
that takes a success result as the bytes it arrived in (``RawResponse``) rather than decoded: the pipeline
asks for one when nothing in its chain reads the result (``bastion.gateway.pipeline.passes_raw``).
"""

from __future__ import annotations

import asyncio
from typing import Any


class Answer(asyncio.Future):  # type: ignore[type-arg]
    """A future for one upstream answer, decoded before it is set."""

    keeps_raw = False

    def settle(self, value: Any) -> None:
        """Set the answer, unless the wait was already given up (cancelled or answered)."""
        if not self.done():
            self.set_result(value)


class RawAnswer(Answer):
    """An ``Answer`` that takes a ``RawResponse`` as it is."""

    keeps_raw = True
