"""Token buckets with an injected clock."""

from __future__ import annotations

from bastion.policy.config import RateLimitConfig
from bastion.policy.ratelimit import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_refill() -> None:
    clock = Clock()
    limiter = RateLimiter([RateLimitConfig(scope="tool", match="fs/*", rate=2, burst=3)], clock)
    assert [limiter.check("alice", "fs", "read").allowed for _ in range(3)] == [True] * 3
    refused = limiter.check("alice", "fs", "read")
    assert not refused.allowed and refused.retry_after_seconds == 1 and refused.rule == "rate:tool:fs/*"
    clock.now += 0.5
    assert limiter.check("alice", "fs", "read").allowed
    assert not limiter.check("alice", "fs", "read").allowed
    assert limiter.check("alice", "git", "status").allowed  # another tool, not matched


def test_scopes_are_separate_buckets() -> None:
    clock = Clock()
    limiter = RateLimiter(
        [
            RateLimitConfig(scope="principal", rate=1, burst=1),
            RateLimitConfig(scope="server", match="git", rate=0.1, burst=2),
        ],
        clock,
    )
    assert limiter.check("alice", "git", "log").allowed
    assert limiter.check("bob", "git", "log").allowed  # bob has his own principal bucket
    verdict = limiter.check("carol", "git", "log")  # the shared server bucket is empty
    assert not verdict.allowed and verdict.retry_after_seconds == 10
    assert not limiter.check("alice", "fs", "read").allowed  # alice's own bucket is empty


def test_refused_call_does_not_spend_other_buckets() -> None:
    clock = Clock()
    limiter = RateLimiter(
        [RateLimitConfig(scope="principal", rate=1, burst=5), RateLimitConfig(scope="tool", rate=1, burst=1)], clock
    )
    assert limiter.check("alice", "fs", "read").allowed
    for _ in range(10):
        assert not limiter.check("alice", "fs", "read").allowed
    # The principal bucket still holds 4 tokens: the refused calls took nothing from it.
    assert [limiter.check("alice", "fs", f"t{i}").allowed for i in range(5)] == [True] * 4 + [False]


def test_per_principal_tool_buckets() -> None:
    limiter = RateLimiter([RateLimitConfig(scope="tool", rate=1, burst=1, per_principal=True)], Clock())
    assert limiter.check("alice", "fs", "read").allowed
    assert limiter.check("bob", "fs", "read").allowed
    assert not limiter.check("alice", "fs", "read").allowed
