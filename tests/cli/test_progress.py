"""bastion.progress: slow steps are announced on the log (never stdout), quick ones are not."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
import time

import pytest

from bastion.progress import step

# Short thresholds keep the tests quick; the waits around them are generous for a loaded machine.
THRESHOLD = 0.2


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bastion.progress"]


def _wait_for(predicate, deadline: float = 10.0) -> bool:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_a_quick_step_says_nothing(caplog):
    caplog.set_level(logging.INFO, logger="bastion.progress")
    with step("installing quick", announce_after=5.0):
        pass
    assert _messages(caplog) == []


def test_a_slow_step_is_announced_while_it_runs_then_timed(caplog):
    caplog.set_level(logging.INFO, logger="bastion.progress")
    with step("installing @modelcontextprotocol/server-memory", announce_after=THRESHOLD) as running:
        # The announcement comes from a timer while this thread is still inside the step.
        assert _wait_for(lambda: running.announced)
        assert _messages(caplog) == ["installing @modelcontextprotocol/server-memory…"]
    messages = _messages(caplog)
    assert len(messages) == 2
    assert messages[1].startswith("installing @modelcontextprotocol/server-memory: done in ")
    assert messages[1].endswith(" s")
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "bastion.progress")


async def test_a_step_that_held_the_loop_is_still_timed_at_its_end(caplog):
    caplog.set_level(logging.INFO, logger="bastion.progress")
    async with step("loading model", announce_after=THRESHOLD):
        time.sleep(THRESHOLD * 2)  # blocks the loop, so call_later cannot fire before the end
    assert [m for m in _messages(caplog) if m.startswith("loading model: done in ")]


def test_a_failing_step_says_it_failed_and_lets_the_error_through(caplog):
    caplog.set_level(logging.INFO, logger="bastion.progress")
    with pytest.raises(RuntimeError, match="npm said no"):
        with step("installing broken", announce_after=THRESHOLD) as running:
            assert _wait_for(lambda: running.announced)
            raise RuntimeError("npm said no")
    assert _messages(caplog)[-1].startswith("installing broken: failed after ")


def test_the_timer_never_fires_after_the_step_ended(caplog):
    caplog.set_level(logging.INFO, logger="bastion.progress")
    with step("quick", announce_after=THRESHOLD):
        pass
    time.sleep(THRESHOLD * 3)
    assert _messages(caplog) == []
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer) and t.is_alive()]


async def test_async_step_is_announced_while_the_loop_keeps_running(caplog):
    caplog.set_level(logging.INFO, logger="bastion.progress")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticking = asyncio.create_task(ticker())
    try:
        async with step("building the tool index", announce_after=THRESHOLD) as running:
            for _ in range(1000):
                if running.announced:
                    break
                await asyncio.sleep(0.01)
            assert running.announced
            assert ticks > 5  # the loop ran other work while the step waited to be announced
    finally:
        ticking.cancel()
    messages = _messages(caplog)
    assert messages[0] == "building the tool index…"
    assert messages[1].startswith("building the tool index: done in ")


async def test_a_cancelled_async_step_says_it_stopped(caplog):
    caplog.set_level(logging.INFO, logger="bastion.progress")

    async def slow() -> None:
        async with step("installing slow", announce_after=THRESHOLD):
            await asyncio.sleep(60)

    task = asyncio.create_task(slow())
    for _ in range(1000):
        if _messages(caplog):
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _messages(caplog)[-1].startswith("installing slow: stopped after ")


def test_progress_goes_to_stderr_never_stdout():
    program = (
        "import logging, sys, time\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr, format='%(name)s: %(message)s')\n"
        "from bastion.progress import step\n"
        "with step('installing x', announce_after=0.1):\n"
        "    time.sleep(0.5)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "bastion.progress: installing x…" in done.stderr
    assert "bastion.progress: installing x: done in " in done.stderr


async def test_a_watcher_is_told_each_step_of_its_own_task_at_once_and_when_it_ends():
    """What a server's start is doing, for its supervisor: each task's watcher hears its own steps only, from
    their start (not after the announcement's second), in threads the task starts too."""
    from bastion.progress import watch

    heard: dict[str, list] = {"a": [], "b": []}
    inside = asyncio.Event()
    go_on = asyncio.Event()

    async def start(name: str) -> None:
        watch(heard[name].append)
        async with step(f"installing pkg-{name} 1.0 for server {name}", announce_after=60):
            if name == "a":
                inside.set()
                await go_on.wait()

        def in_a_thread() -> None:
            with step(f"building {name}", announce_after=60):
                pass

        await asyncio.to_thread(in_a_thread)

    a = asyncio.create_task(start("a"))
    await inside.wait()
    assert heard["a"] == ["installing pkg-a 1.0 for server a"]  # told at once, while it runs
    await start("b")
    go_on.set()
    await a
    assert heard["a"] == ["installing pkg-a 1.0 for server a", None, "building a", None]
    assert heard["b"] == ["installing pkg-b 1.0 for server b", None, "building b", None]
