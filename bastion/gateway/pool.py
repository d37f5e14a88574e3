"""The instances of a server whose scope is ``per_identity`` or ``per_session``: one process per caller.

A stateful local server (a memory, a browser, a shell) must not mix two agents' state, so each identity (or each
client session) gets its own instance, started on its first call, stopped once it has been unused for
``idle_timeout`` seconds. At most ``max_instances`` run at once; a caller past the bound is refused at once with
-32000 and the seconds after which an instance may have been freed, never queued.

The catalog is not an instance's business: the server's lists come from the gateway's own instance of it, which
no client's call reaches, and an instance's list_changed is not the catalog's news.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from bastion.config import ServerConfig
from bastion.transport.credentials import URL_ELICITATION_REQUIRED, url_elicitation
from bastion.model import GatewayError, Identity, Session
from bastion.protocol import jsonrpc
from bastion.protocol.correlation import Pending

log = logging.getLogger("bastion.gateway")

_LIST_CHANGED_PREFIX = "notifications/"
_LIST_CHANGED_SUFFIX = "/list_changed"


def pool_key(scope: str, session: Session) -> str:
    """Whose instance a session's calls go to: its identity's, or its own. A 2026-07-28 client has no session
    (each request stands alone; over HTTP each POST is a connection of its own), so its calls go to its
    identity's instance rather than start a process per request."""
    if scope == "per_identity" or session.era == "modern":
        return f"identity:{session.identity.name}"
    return f"session:{session.session_id}"


@dataclass(slots=True)
class _Instance:
    upstream: Any  # an Upstream
    last_used: float
    in_flight: int = 0


class InstanceListener:
    """What an instance tells the gateway: its notifications and its requests to the client, and its readiness only
    for the log level it is asked for; not its list changes (the catalog follows the gateway's own instance)."""

    def __init__(self, gateway: Any) -> None:
        self._gateway = gateway

    def upstream_ready(self, upstream: Any) -> None:
        # A new instance is asked for the log level its callers want (bastion/gateway/log_levels.py).
        self._gateway.log_levels.upstream_ready(upstream)

    def upstream_down(self, upstream: Any, reason: str) -> None:
        log.debug("server %s: an instance is down: %s", upstream.name, reason)

    def upstream_notification(self, upstream: Any, method: str, params: dict[str, Any], pending: Pending | None) -> None:
        if method.startswith(_LIST_CHANGED_PREFIX) and method.endswith(_LIST_CHANGED_SUFFIX):
            return
        self._gateway.upstream_notification(upstream, method, params, pending)

    async def upstream_request(self, upstream: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await self._gateway.upstream_request(upstream, method, params)


class UpstreamPool:
    """One server's instances, keyed by identity or session (see ``pool_key``)."""

    def __init__(self, name: str, config: ServerConfig, make: Callable[[Identity], Any],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.config = config
        self._make = make  # a new, unstarted Upstream for this server and caller (its credentials, its secrets)
        self._clock = clock
        self._instances: dict[str, _Instance] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        self._closing = False

    def __len__(self) -> int:
        return len(self._instances)

    def instance(self, session: Session) -> Any | None:
        """The ready instance a session's calls go to, if there is one (without starting any)."""
        found = self._instances.get(pool_key(self.config.scope, session))
        if found is None or not found.upstream.ready.is_set():
            return None
        return found.upstream

    def busy(self) -> bool:
        """Whether a call runs on any instance."""
        return any(instance.in_flight for instance in self._instances.values())

    def instances(self) -> list[Any]:
        return [instance.upstream for instance in self._instances.values()]

    async def call(self, session: Session, use: Callable[[Any], Any]) -> Any:
        """Run ``use(upstream)`` (a coroutine function) on the session's instance, starting it if need be; the
        instance counts as busy meanwhile, so it is never stopped under a call."""
        key = pool_key(self.config.scope, session)
        instance = self._instances.get(key)
        if instance is not None and not await self._still_current(key, instance):
            instance = None
        if instance is not None and getattr(instance.upstream, "secrets", None) is not None:
            # looked up again: reading the secrets let the reaper run, and it may have stopped this idle instance
            instance = self._instances.get(key)
        if instance is None:
            instance = self._open(key, session.identity)
        present = getattr(instance.upstream.credentials, "present", None)
        if present is not None:
            present(session.identity)  # the caller's latest token, for a credential exchanged for it
        instance.in_flight += 1
        instance.last_used = self._clock()
        try:
            await self._ready(key, instance)
            return await use(instance.upstream)
        finally:
            instance.in_flight -= 1
            instance.last_used = self._clock()

    async def _still_current(self, key: str, instance: _Instance) -> bool:
        """False, and the instance retired, when the per-identity secrets it was started with were revoked or
        changed since: its process must not keep using them."""
        secrets = getattr(instance.upstream, "secrets", None)
        if secrets is None or await secrets.unchanged():
            return True
        if self._instances.get(key) is instance:
            del self._instances[key]
            log.info("server %s: the secrets of %s changed or were revoked; its instance stops", self.name, key)
            self._stop_soon(instance)
        return False

    def _stop_soon(self, instance: _Instance) -> None:
        async def stop() -> None:
            while instance.in_flight:  # the calls under way finish first (each is bounded by request_timeout)
                await asyncio.sleep(0.05)
            await instance.upstream.close()
        stopping = asyncio.create_task(stop())
        self._stopping.add(stopping)
        stopping.add_done_callback(self._stopping.discard)

    def _open(self, key: str, identity: Identity) -> _Instance:
        if len(self._instances) >= self.config.max_instances:
            raise GatewayError(jsonrpc.SERVER_BUSY, (
                f"server {self.name!r} runs its most instances ({self.config.max_instances}, max_instances); "
                f"an unused one stops after idle_timeout ({self.config.idle_timeout:g}s)"),
                {"retryAfterSeconds": self._retry_after()})
        upstream = self._make(identity)
        instance = _Instance(upstream, self._clock())
        self._instances[key] = instance
        upstream.start()
        log.info("server %s: started an instance for %s (%d running)", self.name, key, len(self._instances))
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap(), name=f"pool:{self.name}")
        return instance

    async def _ready(self, key: str, instance: _Instance) -> None:
        upstream = instance.upstream
        if upstream.ready.is_set():
            return
        await upstream.wait_started()
        if upstream.ready.is_set():
            return
        # An instance that cannot start is not kept: it would hold a place in the bound and restart forever.
        if self._instances.get(key) is instance and instance.in_flight <= 1:
            del self._instances[key]
            await upstream.close()
        pending = getattr(upstream.credentials, "pending_link", None)
        link = pending() if pending is not None else None
        if link is not None:  # it waits for this user's authorization: the link, as a URL elicitation
            message = f"server {self.name!r} needs your authorization first: open {link}"
            raise GatewayError(URL_ELICITATION_REQUIRED, message, url_elicitation(link, message))
        raise GatewayError(jsonrpc.UPSTREAM_UNAVAILABLE,
                           f"server {self.name!r} is not available: {upstream.failure or 'starting'}")

    def _retry_after(self) -> int:
        """Seconds until the instance unused longest may be stopped (at least 1)."""
        now = self._clock()
        idle = [now - i.last_used for i in self._instances.values() if i.in_flight == 0]
        if not idle:
            return max(1, math.ceil(self.config.idle_timeout))
        return max(1, math.ceil(self.config.idle_timeout - max(idle)))

    async def stop_idle(self) -> int:
        """Stop every instance unused for ``idle_timeout``; how many were stopped."""
        now = self._clock()
        idle = [key for key, i in self._instances.items()
                if i.in_flight == 0 and now - i.last_used >= self.config.idle_timeout]
        stopping = [self._instances.pop(key) for key in idle]
        for key in idle:
            log.info("server %s: stopped the instance for %s, unused for %gs", self.name, key, self.config.idle_timeout)
        await asyncio.gather(*(i.upstream.close() for i in stopping), return_exceptions=True)
        return len(stopping)

    def end_session_soon(self, session_id: str) -> None:
        """A client session ended: a per_session server's instance for it goes too (unless a call still runs on
        it, when idleness stops it later)."""
        key = f"session:{session_id}"
        instance = self._instances.get(key)
        if self.config.scope != "per_session" or instance is None or instance.in_flight:
            return
        del self._instances[key]
        log.info("server %s: stopped the instance for %s, whose client left", self.name, key)
        stopping = asyncio.create_task(instance.upstream.close())
        self._stopping.add(stopping)
        stopping.add_done_callback(self._stopping.discard)

    async def _reap(self) -> None:
        period = min(max(self.config.idle_timeout / 4, 0.05), 30.0)
        while not self._closing:
            await asyncio.sleep(period)
            await self.stop_idle()

    async def close(self) -> None:
        self._closing = True
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        instances, self._instances = list(self._instances.values()), {}
        await asyncio.gather(*(i.upstream.close() for i in instances), *self._stopping, return_exceptions=True)
