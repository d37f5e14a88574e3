"""Dual-era mirroring: a server found to speak 2026-07-28 that may speak the handshake era too gets a second
connection in that era (its twin), for handshake-era clients, made on their first request.

A 2026-07-28 connection carries no server-initiated request outside ``input_required``: a server written for both
eras asks mid-call (``sampling/createMessage``, ``elicitation/create``, ``roots/list``) only on a handshake-era
connection, and answers a 2026-07-28 one that it has no back-channel. So a handshake-era client is served by the
server in its own era, over a second connection (a second process, for a local server), started on the first such
request; 2026-07-28 clients keep the first, whence the catalog comes (and from the second too, when a list changes
there). Two processes of a local server keep two states: what one era's calls change, the other's do not see."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from bastion.protocol.correlation import Pending

if TYPE_CHECKING:
    from bastion.gateway.upstream import Upstream, UpstreamListener


class Twin:
    """One server's handshake-era connection, for its handshake-era clients: none until the first such request
    asks for it, and none for good once the server is found to speak 2026-07-28 only."""

    __slots__ = ("_of", "upstream", "_start", "refused")

    def __init__(self, of: "Upstream") -> None:
        self._of = of
        self.upstream: Upstream | None = None
        self._start: asyncio.Task[Upstream | None] | None = None
        self.refused = False

    def wanted(self) -> bool:
        """Whether handshake-era clients' requests go to this server in the handshake era: its era was found, not
        configured, and it is shared (a pooled server's instances are each a caller's own, in one era)."""
        config = self._of.config
        return config.era == "auto" and config.scope == "shared" and not self.refused

    async def ready(self) -> "Upstream | None":
        """The server's connection in the handshake era, ready; None when it has none (then the request goes to the
        2026-07-28 connection, which asks a handshake-era client through ``input_required``)."""
        twin = self.upstream
        if twin is not None and twin.ready.is_set():
            return twin
        if self._start is None or self._start.done():
            self._start = asyncio.create_task(self._started(), name=f"upstream:{self._of.name}:handshake-era")
        return await asyncio.shield(self._start)

    async def _started(self) -> "Upstream | None":
        of = self._of
        twin = self.upstream
        if twin is None:
            twin = self.upstream = of.handshake_era_copy()
            twin.client_capabilities = of.client_capabilities
            twin.start()
            of.log.info("server %s: speaks 2026-07-28; a handshake-era client's request opens a connection to it "
                        "in that era", of.name)
        try:
            await asyncio.wait_for(twin.ready.wait(), of.config.startup_timeout)
        except asyncio.TimeoutError:
            pass
        if twin.ready.is_set():
            return twin
        if twin.session.facts is None:  # it never completed an initialize: it speaks 2026-07-28 only
            self.refused = True
            self.upstream = None
            of.log.info("server %s: no handshake-era connection (%s); handshake-era clients are served over its "
                        "2026-07-28 one", of.name, twin.failure or "no answer")
            await twin.close()
        return None  # restarting: this request goes to the 2026-07-28 connection

    async def close(self) -> None:
        if self._start is not None:
            self._start.cancel()
        if self.upstream is not None:
            await self.upstream.close()


class MirrorListener:
    """What a server's handshake-era connection tells the gateway: its notifications (list changes included: its
    lists are then fetched from it, as the calls that changed them went to it) and its requests to the client; not
    its readiness, as the catalog was fetched from the server's first connection."""

    def __init__(self, listener: "UpstreamListener") -> None:
        self._listener = listener

    def upstream_ready(self, upstream: "Upstream") -> None:
        pass

    def upstream_down(self, upstream: "Upstream", reason: str) -> None:
        upstream.log.debug("server %s: its handshake-era connection is down: %s", upstream.name, reason)

    def upstream_notification(self, upstream: "Upstream", method: str, params: dict[str, Any],
                              pending: Pending | None) -> None:
        self._listener.upstream_notification(upstream, method, params, pending)

    async def upstream_request(self, upstream: "Upstream", method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await self._listener.upstream_request(upstream, method, params)
