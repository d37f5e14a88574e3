"""An approval's state, issued by one gateway and redeemed by another that shares the signing key and the state
(replicas), runs once across them: on every implementation of the store (tests/state/conftest.py)."""

from __future__ import annotations

import asyncio
import secrets

from bastion.policy.approval import ALREADY_USED, ApprovalSigner


async def test_replicas_sharing_the_key_and_the_state_run_a_state_once_between_them(store) -> None:
    secret, shared = secrets.token_bytes(32), store
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
