"""Who subscribed to which resource: a client's ``resources/subscribe`` and ``unsubscribe``, the server told on the
first subscriber and after the last, and the subscribers a server's ``resources/updated`` goes to."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Mapping

from bastion.gateway.catalog import Catalog
from bastion.model import GatewayError, GatewayRequest
from bastion.protocol.jsonrpc import INVALID_PARAMS
from bastion.protocol.server_session import MAX_SUBSCRIPTIONS

log = logging.getLogger("bastion.gateway")


class Subscriptions:
    def __init__(self, catalog: Catalog, upstreams: Mapping[str, Any]) -> None:
        self._catalog = catalog
        self._upstreams = upstreams  # server name -> its Upstream
        self._subscribers: dict[str, set[str]] = {}  # uri -> connection ids
        self._held: dict[str, set[str]] = {}  # connection id -> uris, so a connection's end is not a scan of all

    def subscribers(self, uri: Any) -> set[str] | tuple[()]:
        """The connections subscribed to ``uri``."""
        return self._subscribers.get(uri, ())

    async def request(self, request: GatewayRequest, server: str) -> dict[str, Any]:
        """A client's ``resources/subscribe`` or ``resources/unsubscribe`` of a resource of ``server``."""
        uri = request.params.get("uri")
        connection = request.session.session_id
        if request.method != "resources/subscribe":
            self.unsubscribe(uri, connection)
            return {}
        held = self._held.get(connection, set())
        if uri in held:
            return {}
        if len(held) >= MAX_SUBSCRIPTIONS:
            raise GatewayError(INVALID_PARAMS, f"this client is subscribed to {len(held)} resources, the most one "
                                               f"client may be; unsubscribe from one first")
        subscribers = self._subscribers.setdefault(uri, set())
        first = not subscribers
        subscribers.add(connection)
        self._held.setdefault(connection, set()).add(uri)
        if first:
            try:
                await self._tell_server(server, uri, subscribe=True)
            except GatewayError:
                self._forget(uri, connection)
                raise
        return {}

    def drop_connection(self, connection_id: str) -> None:
        """A connection ended: its subscriptions end with it."""
        for uri in list(self._held.get(connection_id, ())):
            self.unsubscribe(uri, connection_id)

    def unsubscribe(self, uri: str, connection_id: str) -> None:
        if not self._forget(uri, connection_id) or uri in self._subscribers:
            return
        server = self._catalog.resource_owner(uri)
        if server is not None:
            asyncio.create_task(self._tell_server(server, uri, subscribe=False))

    def _forget(self, uri: str, connection_id: str) -> bool:
        """Drop one subscription from both indexes; whether there was one."""
        subscribers = self._subscribers.get(uri)
        if subscribers is None or connection_id not in subscribers:
            return False
        subscribers.discard(connection_id)
        if not subscribers:
            del self._subscribers[uri]
        held = self._held[connection_id]
        held.discard(uri)
        if not held:
            del self._held[connection_id]
        return True

    async def _tell_server(self, server: str, uri: str, subscribe: bool) -> None:
        upstream = self._upstreams[server]
        if upstream.era == "modern":
            uris = [u for u, subs in self._subscribers.items() if subs and self._catalog.resource_owner(u) == server]
            await upstream.set_resource_subscriptions(uris)
            return
        try:
            await upstream.request("resources/subscribe" if subscribe else "resources/unsubscribe", {"uri": uri})
        except GatewayError as exc:
            if subscribe:
                raise
            log.info("server %s: unsubscribe from %s failed: %s", server, uri, exc.message)
