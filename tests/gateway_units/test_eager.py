"""start_eagerly: a coroutine runs in the caller up to its first suspension, then a Task carries it on."""

from __future__ import annotations

import asyncio

import pytest

from bastion.gateway.eager import start_eagerly


async def test_a_coroutine_that_never_waits_finishes_in_the_caller_without_a_task() -> None:
    seen: list[str] = []

    async def quick() -> None:
        seen.append("ran")

    assert start_eagerly(quick(), asyncio.get_running_loop()) is None
    assert seen == ["ran"]


async def test_the_part_before_the_first_wait_runs_before_start_eagerly_returns() -> None:
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[int] = loop.create_future()
    seen: list[str] = []

    async def forward() -> int:
        seen.append("sent")
        value = await answer
        seen.append("answered")
        return value * 2

    task = start_eagerly(forward(), loop)
    assert seen == ["sent"]
    assert task is not None and not task.done()
    answer.set_result(21)
    assert await task == 42
    assert seen == ["sent", "answered"]


async def test_an_error_before_the_first_wait_reaches_the_caller() -> None:
    async def broken() -> None:
        raise ValueError("bad request")

    with pytest.raises(ValueError, match="bad request"):
        start_eagerly(broken(), asyncio.get_running_loop())


async def test_an_error_after_the_first_wait_is_the_tasks() -> None:
    async def fails_later() -> None:
        await asyncio.sleep(0)
        raise KeyError("late")

    task = start_eagerly(fails_later(), asyncio.get_running_loop())
    assert task is not None
    with pytest.raises(KeyError):
        await task


@pytest.mark.parametrize("cancel_after_first_step", [False, True])
async def test_cancelling_reaches_the_coroutine_at_its_wait_so_its_cleanup_runs(cancel_after_first_step: bool) -> None:
    loop = asyncio.get_running_loop()
    never: asyncio.Future[None] = loop.create_future()
    cleanup: list[str] = []

    async def waits() -> None:
        try:
            await never
        except asyncio.CancelledError:
            cleanup.append("cancelled at the wait")
            raise

    task = start_eagerly(waits(), loop)
    assert task is not None
    if cancel_after_first_step:
        await asyncio.sleep(0)  # the Task has taken over the wait
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleanup == ["cancelled at the wait"]
    assert task.cancelled()


async def test_a_bare_yield_and_several_waits_are_carried_on() -> None:
    loop = asyncio.get_running_loop()
    steps: list[int] = []

    async def many() -> str:
        for step in range(3):
            await asyncio.sleep(0)
            steps.append(step)
        event = asyncio.Event()
        loop.call_soon(event.set)
        await event.wait()
        return "done"

    task = start_eagerly(many(), loop)
    assert task is not None
    assert await task == "done"
    assert steps == [0, 1, 2]
