"""The approval queue across replicas: with a store the replicas share, a call waiting for a person on one gateway
is listed and settled through another (bastion/policy/approval_state.py). Two gateways built in one process on one
shared store are two replicas, each in front of its own real raw server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Mapping

import pytest

from bastion.policy.approval import ORPHANED
from bastion.policy.approval_state import WAITER_SECONDS, StateQueue
from bastion.state import StateUnavailable

from tests.policy.test_pipeline import call, gateway_factory, policy_config, refusal, session  # noqa: F401
from tests.state.shared_memory import SharedMemoryStore


class Watcher:
    """A client that cannot be asked itself (no elicitation) and learns at once that its call waits."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.told: list[Any] = []

    def supports(self, capability: str) -> bool:
        return False

    def notify(self, method: str, params: Mapping[str, Any] | None) -> None:
        self.told.append((method, params))
        self.waiting.set()

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        raise AssertionError(f"{method} sent to a client that cannot take it")


def queued(tmp_path: Path, timeout: float = 60) -> Any:
    return policy_config(tmp_path, approval={"fallback": "queue", "timeout_seconds": timeout,
                                             "queue_dir": str(tmp_path / "queue"), "poll_seconds": 0.05})


async def waiting_call(gateway: Any, size: int, era: str = "legacy") -> tuple[asyncio.Task, Watcher]:
    watcher = Watcher()
    task = asyncio.ensure_future(call(gateway, session(client=watcher, era=era), "raw__big", {"size": size},
                                      _meta={"progressToken": 1}))
    await watcher.waiting.wait()
    return task, watcher


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_a_call_waiting_on_one_replica_is_listed_and_approved_through_another(
        tmp_path: Path, gateway_factory, era: str) -> None:  # noqa: F811
    store = SharedMemoryStore()
    a, _ = await gateway_factory(queued(tmp_path), shared_state=store)
    _, b = await gateway_factory(queued(tmp_path), shared_state=store)
    queue_b = b.approval.queue
    assert isinstance(queue_b, StateQueue)
    task, watcher = await waiting_call(a, 3, era)
    [waiting] = await queue_b.pending_async()
    assert waiting.record["tool"] == "big" and waiting.status == "pending"
    assert f"bastion approve {waiting.id} --config" in watcher.told[0][1]["message"]
    settled = await queue_b.settle_async(waiting.id, True, by="ops")
    assert settled.status == "approved"
    assert (await task)["content"][0]["text"] == "xxx"
    assert not (tmp_path / "queue").exists()  # nothing of it in a directory of one host
    with pytest.raises(LookupError, match="already approved by ops"):
        await queue_b.settle_async(waiting.id, False, by="someone else")

    denied, _ = await waiting_call(a, 2, era)
    [waiting] = await queue_b.pending_async()
    await queue_b.settle_async(waiting.id, False, by="ops")
    assert (await refusal(denied)).code == -32001


async def test_a_request_ends_once_when_a_person_and_the_timeout_end_it_at_once() -> None:
    store = SharedMemoryStore()
    for _ in range(20):
        here, there = StateQueue(store), StateQueue(store)
        approval_id = await here.submit_async({"server": "raw", "tool": "big"}, 60)
        settled, closed = await asyncio.gather(here.settle_async(approval_id, True, by="ops"),
                                               there.close_request_async(approval_id, "expired", ""),
                                               return_exceptions=True)
        final = (await there.read_async(approval_id)).status
        if isinstance(settled, LookupError):
            assert final == closed == "expired"
        else:
            assert final == closed == settled.status == "approved"


async def test_a_request_whose_replica_died_reads_as_orphaned_and_cannot_be_approved() -> None:
    now = [1000.0]
    store = SharedMemoryStore(clock=lambda: now[0])
    dead = StateQueue(store)
    approval_id = await dead.submit_async({"server": "raw", "tool": "big"}, 600)  # and then it never polls again
    assert (await StateQueue(store).read_async(approval_id)).status == "pending"
    now[0] += WAITER_SECONDS + 1
    other = StateQueue(store)
    assert (await other.read_async(approval_id)).status == ORPHANED
    assert await other.pending_async() == []
    with pytest.raises(LookupError, match="is orphaned"):
        await other.settle_async(approval_id, True, by="ops")


async def test_with_the_store_unreachable_no_call_is_approved(tmp_path: Path, gateway_factory) -> None:  # noqa: F811
    store = SharedMemoryStore()
    a, runtime = await gateway_factory(queued(tmp_path), shared_state=store)
    store.down = True
    error = await refusal(call(a, session(client=Watcher()), "raw__big", {"size": 3}))
    assert error.code == -32001 and "approval queue cannot be reached" in error.data["reason"]
    with pytest.raises(StateUnavailable):
        await runtime.approval.queue.settle_async("0123456789ab", True, by="ops")


async def test_ids_that_are_not_ids_never_reach_the_store() -> None:
    queue = StateQueue(SharedMemoryStore())
    for hostile in ("*", "a:b", "../x", "x" * 65, "ü"):
        with pytest.raises(ValueError, match="not an approval id"):
            await queue.settle_async(hostile, True)


async def test_with_the_queue_unreachable_a_person_in_the_client_can_still_approve(
        tmp_path: Path, gateway_factory) -> None:  # noqa: F811
    from tests.policy.test_pipeline import ACCEPT, Person

    store = SharedMemoryStore()
    a, _ = await gateway_factory(queued(tmp_path), shared_state=store)
    store.down = True
    person = Person(ACCEPT)
    assert (await call(a, session(client=person), "raw__big", {"size": 3}))["content"][0]["text"] == "xxx"
    assert len(person.asked) == 1
