"""The shared state's contract, on the in-memory implementation: a claim is one atomic check-and-set, good until it
expires; and an approval's state, issued by one gateway and redeemed by another that shares the signing key and the
state (replicas), runs once across them."""

from __future__ import annotations

import asyncio
import secrets

from bastion.policy.approval import ALREADY_USED, ApprovalSigner
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


async def test_replicas_sharing_the_key_and_the_state_run_a_state_once_between_them() -> None:
    secret, shared = secrets.token_bytes(32), MemoryState()
    first, second = ApprovalSigner(secret, 120, shared), ApprovalSigner(secret, 120, shared)
    state = first.issue("alice", "fs__write", "digest")
    outcomes = await asyncio.gather(*(signer.redeem(state, "alice", "fs__write", "digest")
                                      for signer in (first, second, second, first)))
    assert [o.problem for o in outcomes].count(None) == 1
    assert [o.problem for o in outcomes if o.problem is not None] == [ALREADY_USED] * 3
    # A state of another call, or for another caller, is refused before it is used up.
    other = first.issue("alice", "fs__write", "digest")
    assert (await second.redeem(other, "bob", "fs__write", "digest")).problem == \
        "the approval was given for a different call"
    assert (await second.redeem(other, "alice", "fs__write", "digest")).problem is None
