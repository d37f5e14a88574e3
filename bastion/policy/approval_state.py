"""The approval queue in the shared state store (bastion/state/), for replicas: what ``ApprovalQueue`` keeps in a
directory of one host.

Chosen when the gateway's store is shared (Redis): a call waiting on one replica is listed by ``bastion approvals``
(given the configuration, whose ``[state]`` names the store) and by the console of any replica, and settled from
any of them; the replica waiting sees the answer at its next poll. Each request is one value (``approvals:request:
ID``, its JSON record) listed in one map (``approvals:index``). Whoever ends a request first, a person approving or
denying it or the waiting replica marking it expired or withdrawn, is the one that claims ``approvals:settled:ID``
(one claim wins, on any replica), so an approval and a timeout never both win. The waiting replica keeps
``approvals:waiter:ID`` alive while it waits; a pending request whose waiter is gone (the replica died) reads as
orphaned, as one whose gateway process is gone does in the directory queue.

A store that cannot be reached fails closed: a request cannot be submitted (the call is refused, saying why), a
wait that cannot read its request is answered "unreachable" at its timeout, a person's approval is refused.

The ``*_async`` methods are the gateway's, on its loop; the others block, for the CLI and the console, on a
``Blocking`` runner given at construction.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from typing import Any, Coroutine, Mapping, TypeVar

import orjson

from bastion.policy.approval import EXPIRED, ORPHANED, WITHDRAWN, QueuedApproval, not_pending, valid_id
from bastion.state import StateStore, StateUnavailable
from bastion.state.blocking import Blocking

INDEX_KEY = "approvals:index"
KEEP_SECONDS = 7 * 86400.0  # how long a settled request stays listed (the directory queue keeps its files)
WAITER_SECONDS = 10.0  # how soon a request reads as orphaned after its replica died
UNREACHABLE = "unreachable"  # what a wait ends with when the store could not be read until the timeout
_SETTLING_SECONDS = 5.0  # how long a loser of the settling claim waits for the winner's record

T = TypeVar("T")


def _request(approval_id: str) -> str:
    return f"approvals:request:{approval_id}"


def _settled(approval_id: str) -> str:
    return f"approvals:settled:{approval_id}"


def _waiter(approval_id: str) -> str:
    return f"approvals:waiter:{approval_id}"


class StateQueue:
    """The queue of every replica sharing ``state``."""

    directory = None  # no directory: ``bastion approve ID --config FILE`` reaches this queue

    def __init__(self, state: StateStore, blocking: Blocking | None = None, config_file: str | None = None) -> None:
        self._state = state
        self._blocking = blocking
        self._config_file = config_file
        self._replica = f"{socket.gethostname()} pid {os.getpid()}"

    def command(self, approval_id: str) -> str:
        """The command a person runs to approve ``approval_id``: with the configuration naming this store."""
        return f"bastion approve {approval_id} --config {self._config_file or 'FILE'}"

    # ------------------------------------------------------------------------------------------ the gateway's
    async def submit_async(self, record: Mapping[str, Any], timeout_seconds: float) -> str:
        approval_id = uuid.uuid4().hex[:12]
        now = time.time()
        entry = {**record, "id": approval_id, "status": "pending", "created": now, "expires": now + timeout_seconds,
                 "timeout_seconds": timeout_seconds, "replica": self._replica}
        keep = timeout_seconds + KEEP_SECONDS
        await self._state.put(_waiter(approval_id), b"1", WAITER_SECONDS)
        await self._state.put(_request(approval_id), orjson.dumps(entry), keep)
        await self._state.map_put(INDEX_KEY, {approval_id: str(now).encode()})
        return approval_id

    async def read_async(self, approval_id: str) -> QueuedApproval | None:
        """The request as it stands: a pending one past its time reads as expired, one whose replica stopped
        waiting for it (died) as orphaned."""
        valid_id(approval_id)
        raw = await self._state.get(_request(approval_id))
        try:
            record = orjson.loads(raw) if raw is not None else None
        except orjson.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            return None
        status = str(record.get("status"))
        if status == "pending":
            if float(record.get("expires", 0)) < time.time():
                status = EXPIRED
            elif not await self._state.recorded(_waiter(approval_id)):
                status = ORPHANED
        return QueuedApproval(approval_id, status, record)

    async def all_async(self) -> list[QueuedApproval]:
        """Every request kept, oldest first; those no longer kept leave the index."""
        index = await self._state.map_all(INDEX_KEY)
        found, gone = [], []
        for approval_id in index:
            try:
                item = await self.read_async(approval_id)
            except ValueError:
                item = None
            if item is None:
                gone.append(approval_id)
            else:
                found.append(item)
        if gone:
            await self._state.map_delete(INDEX_KEY, gone)
        return sorted(found, key=lambda item: float(item.record.get("created", 0)))

    async def pending_async(self) -> list[QueuedApproval]:
        return [item for item in await self.all_async() if item.status == "pending"]

    async def settle_async(self, approval_id: str, approve: bool, by: str = "") -> QueuedApproval:
        """Approve or deny a pending request; raises LookupError, saying why, when nothing waits for it."""
        item = await self.read_async(approval_id)
        if item is None:
            raise LookupError(f"no approval request {approval_id} in the shared state store")
        if item.status != "pending":
            raise LookupError(not_pending(item))
        status = "approved" if approve else "denied"
        ended = await self._end(item, {"status": status, "settled": time.time(), "by": by})
        if ended.status != status:
            raise LookupError(not_pending(ended))
        return ended

    async def close_request_async(self, approval_id: str, status: str, why: str) -> str:
        """Mark a request that is still pending as ``status`` (expired, withdrawn, answered elsewhere); what it
        ended as (a person's answer, when one came first)."""
        item = await self.read_async(approval_id)
        if item is None or item.record.get("status") != "pending":
            return item.status if item is not None else status
        ended = await self._end(item, {"status": status, "settled": time.time(), **({"why": why} if why else {})})
        return ended.status

    async def wait(self, approval_id: str, timeout_seconds: float, poll_seconds: float) -> str:
        """Poll until the request is settled: its final status (approved, denied, expired, or ``UNREACHABLE`` when
        the store could not be read until the timeout). Keeps the request's waiter alive meanwhile; a cancelled wait
        marks it withdrawn."""
        deadline = time.monotonic() + timeout_seconds
        poll = min(poll_seconds, WAITER_SECONDS / 3)
        unreachable = False
        try:
            while True:
                try:
                    await self._state.put(_waiter(approval_id), b"1", WAITER_SECONDS)
                    item = await self.read_async(approval_id)
                    unreachable = False
                except StateUnavailable:
                    item, unreachable = None, True
                if item is not None and item.status in ("approved", "denied"):
                    return item.status
                if (item is None and not unreachable) or time.monotonic() >= deadline:
                    try:
                        return await self.close_request_async(approval_id, EXPIRED, "")
                    except StateUnavailable:
                        return UNREACHABLE
                await asyncio.sleep(min(poll, max(0.0, deadline - time.monotonic())))
        except asyncio.CancelledError:
            marking = asyncio.ensure_future(self.close_request_async(approval_id, WITHDRAWN,
                                                                     "the client withdrew the call"))
            try:
                await asyncio.shield(marking)
            except (asyncio.CancelledError, StateUnavailable):
                pass
            raise

    async def _end(self, item: QueuedApproval, change: Mapping[str, Any]) -> QueuedApproval:
        """End ``item`` with ``change`` if this caller is the first to end it; else what the first made of it."""
        keep = float(item.record.get("timeout_seconds", 0)) + KEEP_SECONDS
        if await self._state.claim(_settled(item.id), keep):
            record = {**item.record, **change}
            await self._state.put(_request(item.id), orjson.dumps(record), keep)
            return QueuedApproval(item.id, str(record["status"]), record)
        # Another ended it first: its record follows its claim at once (or never, if it died in between).
        deadline = time.monotonic() + _SETTLING_SECONDS
        pause = 0.005
        while True:
            ended = await self.read_async(item.id)
            if ended is None or ended.record.get("status") != "pending" or time.monotonic() >= deadline:
                return ended if ended is not None else item
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.1)

    # ------------------------------------------------------------------------------------------ the CLI's, blocking
    def read(self, approval_id: str) -> QueuedApproval | None:
        return self._run(self.read_async(approval_id))

    def all(self) -> list[QueuedApproval]:
        return self._run(self.all_async())

    def pending(self) -> list[QueuedApproval]:
        return self._run(self.pending_async())

    def settle(self, approval_id: str, approve: bool, by: str = "") -> QueuedApproval:
        return self._run(self.settle_async(approval_id, approve, by))

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._blocking is None:
            coroutine.close()
            raise RuntimeError("StateQueue built without a Blocking runner: use its *_async methods")
        return self._blocking.run(coroutine)
