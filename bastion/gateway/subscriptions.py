"""Who subscribed to which resource: a client's ``resources/subscribe`` and ``unsubscribe``, the server told on the
first subscriber and after the last, and the subscribers a server's ``resources/updated`` goes to."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Mapping

from bastion.gateway.catalog import Catalog
from bastion.model import GatewayError, GatewayRequest

log = logging.getLogger("bastion.gateway")


class Subscriptions:
    def __init__(self, catalog: Catalog, upstreams: Mapping[str, Any]) -> None:
        self._catalog = catalog
        self._upstreams = upstreams  # server name -> its Upstream
        self._subscribers: dict[str, set[str]] = {}  # uri -> connection ids

    def subscribers(self, uri: Any) -> set[str] | tuple[()]:
        """The connections subscribed to ``uri``."""
        return self._subscribers.get(uri, ())

    async def request(self, request: GatewayRequest, server: str) -> dict[str, Any]:
        """A client's ``resources/subscribe`` or ``resources/unsubscribe`` of a resource of ``server``."""
        uri = request.params.get("uri")
        subscribers = self._subscribers.setdefault(uri, set())
        if request.method == "resources/subscribe":
            first = not subscribers
            subscribers.add(request.session.session_id)
            if first:
                await self._tell_server(server, uri, subscribe=True)
        else:
            self.unsubscribe(uri, request.session.session_id)
        return {}

    def drop_connection(self, connection_id: str) -> None:
        """A connection ended: its subscriptions end with it."""
        for uri in list(self._subscribers):
            self.unsubscribe(uri, connection_id)

    def unsubscribe(self, uri: str, connection_id: str) -> None:
        subscribers = self._subscribers.get(uri)
        if subscribers is None or connection_id not in subscribers:
            return
        subscribers.discard(connection_id)
        if not subscribers:
            del self._subscribers[uri]
            server = self._catalog.resource_owner(uri)
            if server is not None:
                asyncio.create_task(self._tell_server(server, uri, subscribe=False))

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
