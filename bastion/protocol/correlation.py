"""Request correlation across a hop: id remapping, progress-token remapping, timeouts.

Requests from many clients meet on one upstream connection, where their ids could collide, so each is sent
upstream under a fresh id. The progress token is remapped the same way, so progress notifications and
cancellations find their way back to the request that caused them. Time is passed in, never read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable

from bastion.protocol.jsonrpc import RequestId


@dataclass(slots=True)
class Pending:
    upstream_id: int
    origin: Hashable  # who sent the request (a client connection), opaque here
    origin_id: RequestId  # the id the origin used
    method: str
    deadline: float | None
    origin_progress_token: Any = None  # the token the origin asked progress under, if any
    # Anything the caller wants to keep with the request (a future to resolve, timing, …).
    context: Any = field(default=None, compare=False)

    @property
    def upstream_progress_token(self) -> int | None:
        return self.upstream_id if self.origin_progress_token is not None else None


class DuplicateRequestId(ValueError):
    pass


class Correlator:
    """Outstanding requests on one hop, indexed by the id used on the far side and by the origin's id."""

    def __init__(self) -> None:
        self._next_id = 1
        self._by_upstream: dict[int, Pending] = {}
        self._by_origin: dict[tuple[Hashable, RequestId], Pending] = {}

    def __len__(self) -> int:
        return len(self._by_upstream)

    def register(
        self,
        origin: Hashable,
        origin_id: RequestId,
        method: str,
        *,
        deadline: float | None = None,
        progress_token: Any = None,
        context: Any = None,
    ) -> Pending:
        key = (origin, origin_id)
        if key in self._by_origin:
            raise DuplicateRequestId(f"request id {origin_id!r} is already in flight")
        pending = Pending(self._next_id, origin, origin_id, method, deadline, progress_token, context)
        self._next_id += 1
        self._by_upstream[pending.upstream_id] = pending
        self._by_origin[key] = pending
        return pending

    def resolve(self, upstream_id: Any) -> Pending | None:
        """Take the request a response with ``upstream_id`` answers; None for an unknown id."""
        if not isinstance(upstream_id, int) or isinstance(upstream_id, bool):
            return None
        pending = self._by_upstream.pop(upstream_id, None)
        if pending is not None:
            self._by_origin.pop((pending.origin, pending.origin_id), None)
        return pending

    def origins(self) -> list[tuple[Hashable, RequestId]]:
        """(origin, the origin's id) of every outstanding request: whose calls a server is working on."""
        return list(self._by_origin)

    def find_by_origin(self, origin: Hashable, origin_id: RequestId) -> Pending | None:
        return self._by_origin.get((origin, origin_id))

    def find_by_progress_token(self, token: Any) -> Pending | None:
        pending = self._by_upstream.get(token) if isinstance(token, int) and not isinstance(token, bool) else None
        if pending is None or pending.origin_progress_token is None:
            return None
        return pending

    def expired(self, now: float) -> list[Pending]:
        """Take every request whose deadline has passed."""
        late = [p for p in self._by_upstream.values() if p.deadline is not None and p.deadline <= now]
        for pending in late:
            self.resolve(pending.upstream_id)
        return late

    def next_deadline(self) -> float | None:
        deadlines = [p.deadline for p in self._by_upstream.values() if p.deadline is not None]
        return min(deadlines) if deadlines else None

    def drain(self, origin: Hashable | None = None) -> list[Pending]:
        """Take every outstanding request (of one origin, or all): the far side is gone or the origin left."""
        taken = [p for p in self._by_upstream.values() if origin is None or p.origin == origin]
        for pending in taken:
            self.resolve(pending.upstream_id)
        return taken
