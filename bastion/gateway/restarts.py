"""When a server that ended is started again: exponential backoff from half a second up to 30 s, back to the
shortest after a run that lasted, jittered for a remote server (every gateway that lost it must not come back in the
same instant), and cut short when the credentials obtain what the last start lacked; and the lines of the server's
stderr that the message saying why it failed quotes."""

from __future__ import annotations

import asyncio
import random
from typing import Any

MAX_BACKOFF = 30.0
STABLE_AFTER = 30.0  # a server that ran this long before crashing restarts with the shortest backoff
STDERR_QUOTED = 5  # of a failure's last stderr lines, a failure message quotes this many


class Backoff:
    """The delays between one server's starts."""

    __slots__ = ("failures", "jitter")

    def __init__(self, *, jitter: bool) -> None:
        self.failures = 0  # the starts that failed in a row
        self.jitter = jitter

    def next_delay(self, ran_for: float) -> float:
        """The wait before the next start, after one that ran ``ran_for`` seconds."""
        if ran_for > STABLE_AFTER:
            self.failures = 0
        delay = min(MAX_BACKOFF, 0.5 * (2**self.failures))
        if self.jitter:
            # Every gateway that lost one remote server must not come back to it in the same instant.
            delay *= random.uniform(0.5, 1.5)
        self.failures += 1
        return delay


async def wait_before_restart(delay: float, credentials: Any) -> None:
    """Wait ``delay`` before the next start, or less when the credentials obtained what the last start lacked (a
    user followed their authorization link): the server joins as soon as it can."""
    changed = getattr(credentials, "changed", None)
    if changed is None:
        await asyncio.sleep(delay)
        return
    try:
        await asyncio.wait_for(changed(), delay)
    except asyncio.TimeoutError:
        pass


def quoted_stderr(lines: list[str], *, remote: bool, spawned: bool) -> str:
    """A start's last stderr lines, for the message that says why it failed."""
    if remote:
        return ""  # a remote server has no stderr; the reason already says what the connection did
    lines = lines[-STDERR_QUOTED:]
    if not lines:
        return "; it wrote nothing on stderr" if spawned else ""
    return "; its last stderr lines:" + "".join(f"\n{line}" for line in lines)  # indented by the log's formatter
