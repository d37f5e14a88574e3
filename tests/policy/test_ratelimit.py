"""Token buckets in a memory store with an injected clock (tests/state/ shows the store itself on Redis too)."""

from __future__ import annotations

from bastion.policy.config import RateLimitConfig
from bastion.policy.ratelimit import RateLimiter, bucket_key, limit_digest
from bastion.state import MemoryStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_burst_then_refill() -> None:
    clock = Clock()
    limiter = RateLimiter([RateLimitConfig(scope="tool", match="fs/*", rate=2, burst=3)], MemoryStore(clock))
    assert [(await limiter.check("alice", "fs", "read")).allowed for _ in range(3)] == [True] * 3
    refused = await limiter.check("alice", "fs", "read")
    assert not refused.allowed and refused.retry_after_seconds == 1 and refused.rule == "rate:tool:fs/*"
    clock.now += 0.5
    assert (await limiter.check("alice", "fs", "read")).allowed
    assert not (await limiter.check("alice", "fs", "read")).allowed
    assert (await limiter.check("alice", "git", "status")).allowed  # another tool, not matched


async def test_scopes_are_separate_buckets() -> None:
    clock = Clock()
    limiter = RateLimiter(
        [
            RateLimitConfig(scope="principal", rate=1, burst=1),
            RateLimitConfig(scope="server", match="git", rate=0.1, burst=2),
        ],
        MemoryStore(clock),
    )
    assert (await limiter.check("alice", "git", "log")).allowed
    assert (await limiter.check("bob", "git", "log")).allowed  # bob has his own principal bucket
    verdict = await limiter.check("carol", "git", "log")  # the shared server bucket is empty
    assert not verdict.allowed and verdict.retry_after_seconds == 10
    assert not (await limiter.check("alice", "fs", "read")).allowed  # alice's own bucket is empty


async def test_refused_call_does_not_spend_other_buckets() -> None:
    clock = Clock()
    limiter = RateLimiter(
        [RateLimitConfig(scope="principal", rate=1, burst=5), RateLimitConfig(scope="tool", rate=1, burst=1)],
        MemoryStore(clock),
    )
    assert (await limiter.check("alice", "fs", "read")).allowed
    for _ in range(10):
        assert not (await limiter.check("alice", "fs", "read")).allowed
    # The principal bucket still holds 4 tokens: the refused calls took nothing from it.
    assert [(await limiter.check("alice", "fs", f"t{i}")).allowed for i in range(5)] == [True] * 4 + [False]


async def test_per_principal_tool_buckets() -> None:
    limiter = RateLimiter([RateLimitConfig(scope="tool", rate=1, burst=1, per_principal=True)], MemoryStore(Clock()))
    assert (await limiter.check("alice", "fs", "read")).allowed
    assert (await limiter.check("bob", "fs", "read")).allowed
    assert not (await limiter.check("alice", "fs", "read")).allowed


async def test_a_limit_keeps_its_buckets_in_the_store_across_limiters() -> None:
    """A reload builds a new limiter: the same limit finds its buckets in the store, a changed one starts fresh."""
    store = MemoryStore(Clock())
    limit = RateLimitConfig(scope="tool", rate=0.1, burst=2)
    before = RateLimiter([limit], store)
    assert [(await before.check("alice", "fs", "read")).allowed for _ in range(3)] == [True, True, False]
    kept = RateLimiter([RateLimitConfig(scope="tool", rate=0.1, burst=2)], store)
    assert not (await kept.check("alice", "fs", "read")).allowed
    changed = RateLimiter([RateLimitConfig(scope="tool", rate=0.1, burst=3)], store)
    assert (await changed.check("alice", "fs", "read")).allowed


def test_bucket_keys_cannot_be_forged_by_odd_characters() -> None:
    digest = limit_digest(RateLimitConfig(scope="tool", rate=1, burst=1, per_principal=True))
    # A subject and a caller joined by ":" would give these two pairs one key.
    assert bucket_key(digest, "fs/read:alice", "") != bucket_key(digest, "fs/read", "alice")
    assert bucket_key(digest, "a", "b:c") != bucket_key(digest, "a:b", "c")
    assert bucket_key(digest, "*", "*") != bucket_key(digest, "x", "y")
    assert len(bucket_key(digest, "x" * 10_000, "y")) == len(bucket_key(digest, "x", "y"))
