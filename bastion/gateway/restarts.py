"""When a server that ended is started again: exponential backoff from half a second up to 30 s, back to the
shortest after a run that lasted, jittered for a remote server (every gateway that lost it must not come back in the
same instant), cut short when the credentials obtain what the last start lacked or a person asks for a retry, and
not at all after ``MAX_FAILED_STARTS`` failed starts of a local server in a row, until a person or a call asks; and
the lines of the server's stderr that the message saying why it failed quotes."""

from __future__ import annotations

import asyncio
import random
from typing import Any

MAX_BACKOFF = 30.0
STABLE_AFTER = 30.0  # a server that ran this long before crashing restarts with the shortest backoff
STDERR_QUOTED = 10  # of a failure's last stderr lines, the message saying it failed (once) quotes this many (a traceback)
# A local server whose starts failed this many times in a row (never ready in between) is not started again until
# something may have changed: `bastion servers retry NAME`, a call to one of its tools, or a restart of Bastion.
# Waiting mends nothing on this machine (the backoff has reached 4 s by then, 7.5 s after the first failure); a remote
# server is not held to it, as a remote server comes back on its own.
MAX_FAILED_STARTS = 5
# How the sandbox says a server's end was its memory limit (bastion/sandbox/process.py), within the reason a start
# ended with: counted as a memory kill by the metrics.
MEMORY_KILLED = "killed: memory limit"


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


async def wait_before_restart(delay: float | None, credentials: Any, retry: asyncio.Event) -> None:
    """Wait ``delay`` (None: until asked) before the next start, or less when the credentials obtained what the last
    start lacked (a user followed their authorization link) or ``retry`` is set (a person or a call asked for a
    start now): the server joins as soon as it can."""
    waits = [asyncio.ensure_future(retry.wait())]
    changed = getattr(credentials, "changed", None)
    if changed is not None:
        waits.append(asyncio.ensure_future(changed()))
    try:
        await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    retry.clear()


def quoted_stderr(lines: list[str], *, remote: bool, spawned: bool) -> str:
    """A start's last stderr lines, for the message that says why it failed."""
    if remote:
        return ""  # a remote server has no stderr; the reason already says what the connection did
    lines = lines[-STDERR_QUOTED:]
    if not lines:
        return "; it wrote nothing on stderr" if spawned else ""
    return "; its last stderr lines:" + "".join(f"\n{line}" for line in lines)  # indented by the log's formatter


def retry_hint(server: str) -> str:
    """What starts a server that failed again, in the words of the message that says it failed."""
    return (f"once its cause is fixed, `bastion servers retry {server}` starts it again (so does a call to one of its "
            f"tools, or a restart of Bastion)")
