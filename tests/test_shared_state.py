"""The shared state's contract, on the in-memory implementation: a claim is one atomic check-and-set, good until it
expires."""

from __future__ import annotations

import asyncio

from bastion.shared_state import MemoryState


async def test_a_key_is_claimed_once_until_it_expires() -> None:
    now = [0.0]
    state = MemoryState(clock=lambda: now[0])
    assert not await state.recorded("k")
    assert await state.claim("k", 10)
    assert await state.recorded("k")
    assert not await state.claim("k", 10)
    now[0] = 9.9
    assert not await state.claim("k", 10)  # a claim that loses leaves the first one's time as it was
    now[0] = 10.0
    assert not await state.recorded("k")
    assert await state.claim("k", 10)


async def test_of_concurrent_claims_of_one_key_exactly_one_wins() -> None:
    state = MemoryState()
    won = await asyncio.gather(*(state.claim("k", 60) for _ in range(50)))
    assert won.count(True) == 1


async def test_expired_records_are_swept_as_the_table_grows() -> None:
    now = [0.0]
    state = MemoryState(clock=lambda: now[0])
    for n in range(1000):
        assert await state.claim(f"old-{n}", 1)
    now[0] = 5.0
    for n in range(1000):
        assert await state.claim(f"new-{n}", 1)
    assert len(state._until) <= 1000  # the old ones went with a sweep; only live records are kept
