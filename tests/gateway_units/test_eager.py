"""RequestRunner and Answer: a request's coroutine starts in the caller and resumes inside Answer.settle."""

from __future__ import annotations

import asyncio
import logging

import pytest

from bastion.gateway.eager import Answer, RequestRunner


async def test_a_coroutine_that_never_waits_finishes_in_the_caller() -> None:
    seen: list[str] = []

    async def quick() -> None:
        seen.append("ran")

    runner = RequestRunner(quick(), asyncio.get_running_loop())
    assert runner.done and seen == ["ran"]
    await asyncio.wait_for(runner.finished(), 1)


async def test_the_part_before_the_first_wait_runs_in_the_caller_and_settle_resumes_the_rest_at_once() -> None:
    loop = asyncio.get_running_loop()
    answer = Answer(loop=loop)
    seen: list[str] = []

    async def forward() -> None:
        seen.append("sent")
        seen.append(f"answered {await answer}")

    runner = RequestRunner(forward(), loop)
    assert seen == ["sent"] and not runner.done
    answer.settle(21)
    # No turn of the loop in between: the coroutine ran to its end inside settle.
    assert seen == ["sent", "answered 21"] and runner.done


async def test_an_answer_also_wakes_an_ordinary_task() -> None:
    loop = asyncio.get_running_loop()
    answer = Answer(loop=loop)
    task = asyncio.create_task(asyncio.wait_for(answer, 5))
    await asyncio.sleep(0)
    answer.settle("ok")
    assert await task == "ok"


async def test_settling_twice_or_after_cancelling_changes_nothing() -> None:
    answer = Answer(loop=asyncio.get_running_loop())
    answer.settle(1)
    answer.settle(2)
    assert answer.result() == 1
    cancelled = Answer(loop=asyncio.get_running_loop())
    cancelled.cancel()
    cancelled.settle(3)
    assert cancelled.cancelled()


async def test_other_awaitables_wake_the_runner_through_the_loop() -> None:
    loop = asyncio.get_running_loop()
    steps: list[int] = []
    event = asyncio.Event()

    async def many() -> None:
        for step in range(3):
            await asyncio.sleep(0)
            steps.append(step)
        await event.wait()
        await asyncio.sleep(0.01)
        steps.append(99)

    runner = RequestRunner(many(), loop)
    loop.call_later(0.01, event.set)
    await asyncio.wait_for(runner.finished(), 5)
    assert steps == [0, 1, 2, 99]


@pytest.mark.parametrize("waits_on", ["answer", "future", "sleep"])
async def test_cancel_raises_where_the_coroutine_waits_so_its_cleanup_runs(waits_on: str) -> None:
    loop = asyncio.get_running_loop()
    answer = Answer(loop=loop)
    future: asyncio.Future[None] = loop.create_future()
    cleanup: list[str] = []

    async def waits() -> None:
        try:
            if waits_on == "answer":
                await answer
            elif waits_on == "future":
                await future
            else:
                await asyncio.sleep(30)
        except asyncio.CancelledError:
            cleanup.append("cancelled at the wait")
            raise

    runner = RequestRunner(waits(), loop)
    runner.cancel()
    await asyncio.wait_for(runner.finished(), 5)
    assert cleanup == ["cancelled at the wait"] and runner.done
    answer.settle("late")  # an answer after the cancellation is dropped
    assert answer.cancelled() or waits_on != "answer"


async def test_cancel_while_the_awaited_future_is_already_done_lands_at_the_next_step() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    seen: list[str] = []

    async def waits() -> None:
        try:
            await future
            seen.append("resumed")
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    runner = RequestRunner(waits(), loop)
    future.set_result(1)  # its wake-up is queued, so the future can no longer be cancelled
    runner.cancel()
    await asyncio.wait_for(runner.finished(), 5)
    assert seen == ["cancelled"]


async def test_an_unhandled_error_ends_the_runner_and_is_logged_not_raised_into_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    answer = Answer(loop=loop)

    async def fails_after_answer() -> None:
        await answer
        raise KeyError("late")

    runner = RequestRunner(fails_after_answer(), loop)
    with caplog.at_level(logging.ERROR, "bastion.gateway"):
        answer.settle(None)  # must not raise here: the settling side is an upstream's reader
    assert runner.done
    assert "unhandled error" in caplog.text
