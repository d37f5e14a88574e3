"""The level each handshake-era server is asked to log at, when clients share it.

A client's ``logging/setLevel`` is its own: Bastion filters every server log message per client, by that client's
level (``ServerSession.log_message``). A server, though, drops what is below the level it was asked for before
Bastion sees it, so a server is asked for the most verbose level any client it serves wants: one client's level
never narrows what another receives. A handshake-era client that set no level wants every level (it gets every
level until it sets one); a server none of whose clients ever set a level is left at its own default.

The server's level follows its clients: it is settled again when one of them sets a level, when a handshake-era
client starts its session or leaves, and when the server (or a caller's instance of it) starts or restarts, a new
process knowing no level. A shared server serves every handshake-era client; a caller's instance of a pooled server
(``per_identity``, ``per_session``) the clients whose calls go to it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Iterable, Mapping

from bastion.protocol.server_session import LOG_LEVELS

log = logging.getLogger("bastion.gateway")

EVERY_LEVEL = LOG_LEVELS[0]  # "debug"


def most_verbose(levels: Iterable[str]) -> str:
    """The most verbose of ``levels``; a level Bastion does not know counts as ``debug`` (it takes everything)."""
    return LOG_LEVELS[min((LOG_LEVELS.index(level) if level in LOG_LEVELS else 0 for level in levels), default=0)]


class LogLevels:
    def __init__(self, connections: Mapping[str, Any], upstreams: Mapping[str, Any], pools: Mapping[str, Any]) -> None:
        self._connections = connections  # connection id -> ConnectedClient
        self._upstreams = upstreams  # server name -> its shared Upstream
        self._pools = pools  # server name -> UpstreamPool (per_identity, per_session)
        # The level each server's current process was last asked for, and one lock per server, so that two
        # settlements of one server (a client's setLevel while another leaves) reach it in the order they decided.
        self._asked: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._locks: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()
        self._settling: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------------------------------ what changes it
    async def client_set(self, session: Any) -> None:
        """A client set its level (its session's protocol state has it already): settle every shared server that
        takes levels, and the client's own instances of pooled servers."""
        own = [pool.instance(session) for pool in self._pools.values()] if session is not None else []
        await self._settle_all([*self._upstreams.values(), *(u for u in own if u is not None)])

    def client_joined(self) -> None:
        """A handshake-era client started its session: it wants every level until it sets one, so a server asked
        for less by the others is asked again."""
        self._later(list(self._asked.keys()))

    def client_left(self) -> None:
        """A client left: each server that was asked for a level follows the clients that remain."""
        self._later(list(self._asked.keys()))

    def upstream_ready(self, upstream: Any) -> None:
        """A server (or an instance of one) is ready, in a process of its own that was asked for nothing yet."""
        self._asked.pop(upstream, None)
        self._later([upstream])

    def close(self) -> None:
        for task in list(self._settling):
            task.cancel()

    # ------------------------------------------------------------------------------------------ settling
    def _later(self, upstreams: list[Any]) -> None:
        if not upstreams:
            return
        task = asyncio.ensure_future(self._settle_all(upstreams))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle_all(self, upstreams: list[Any]) -> None:
        await asyncio.gather(*(self._settle(u) for u in upstreams if _takes_levels(u)))

    async def _settle(self, upstream: Any) -> None:
        lock = self._locks.get(upstream)
        if lock is None:
            lock = self._locks[upstream] = asyncio.Lock()
        async with lock:
            if not _takes_levels(upstream):
                return
            levels = [getattr(connection, "log_level", None) for connection in self._served(upstream)]
            if not levels:
                return  # nobody to serve: the next client to start its session settles it
            asked = self._asked.get(upstream)
            if asked is None and not any(levels):
                return  # nobody ever asked for a level: the server keeps its own default
            wanted = most_verbose(level or EVERY_LEVEL for level in levels)
            if wanted == asked:
                return
            try:
                await upstream.request("logging/setLevel", {"level": wanted})
            except Exception as exc:  # noqa: BLE001 - a server that cannot take it keeps logging as it did
                log.info("server %s: logging/setLevel failed: %s", upstream.name, getattr(exc, "message", exc))
                return
            self._asked[upstream] = wanted

    def _served(self, upstream: Any) -> list[Any]:
        """The handshake-era clients whose log messages ``upstream`` sends: every one, for a shared server; those
        whose calls go to it, for an instance of a pooled server."""
        clients = [c for c in list(self._connections.values()) if getattr(c, "era", None) == "legacy"]
        pool = self._pools.get(upstream.name)
        if pool is None or self._upstreams.get(upstream.name) is upstream:
            return clients
        return [c for c in clients if pool.instance(c.session) is upstream]


def _takes_levels(upstream: Any) -> bool:
    return upstream.era == "legacy" and "logging" in upstream.capabilities and upstream.ready.is_set()
