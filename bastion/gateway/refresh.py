"""The catalog follows the servers: each server's lists fetched when it is ready and again when it says one changed,
and the clients told (``list_changed``) when the catalog changed, or when the server announced a change."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Mapping

from bastion.gateway.catalog import LISTS, Catalog
from bastion.model import GatewayError

log = logging.getLogger("bastion.gateway")

# A server's list_changed -> the lists fetched again (the first is the one it announced).
LIST_CHANGED = {
    "notifications/tools/list_changed": ("tools/list",),
    "notifications/prompts/list_changed": ("prompts/list",),
    "notifications/resources/list_changed": ("resources/list", "resources/templates/list"),
}
_TOLD = {"tools": "notifications/tools/list_changed", "prompts": "notifications/prompts/list_changed",
         "resources": "notifications/resources/list_changed",
         "resourceTemplates": "notifications/resources/list_changed"}


class CatalogRefresh:
    def __init__(self, catalog: Catalog, connections: Mapping[str, Any]) -> None:
        self._catalog = catalog
        self._connections = connections  # connection id -> ConnectedClient: who is told of a change
        self._refreshes: dict[tuple[str, str], asyncio.Task[None]] = {}
        # Lists a server announced as changed, whose refresh tells the clients even when the catalog comes out the
        # same (the list may have changed and changed back meanwhile): the server's news, passed on.
        self._announced: set[tuple[str, str]] = set()

    def upstream_ready(self, upstream: Any) -> None:
        """A server is ready: fetch every list it has."""
        for method, (_, _, capability) in LISTS.items():
            if capability in upstream.capabilities:
                self.schedule(upstream, method)

    def list_changed(self, upstream: Any, method: str) -> None:
        """A server's ``method`` (one of ``LIST_CHANGED``): fetch its lists again."""
        lists = LIST_CHANGED[method]
        for list_method in lists:
            self.schedule(upstream, list_method, announced=list_method == lists[0])

    def schedule(self, upstream: Any, list_method: str, announced: bool = False) -> None:
        key = (upstream.name, list_method)
        if announced:
            self._announced.add(key)
        previous = self._refreshes.get(key)
        if previous is not None and not previous.done():
            previous.cancel()
        self._refreshes[key] = asyncio.create_task(self._refresh(upstream, list_method))

    def tell(self, kind: str) -> None:
        """Tell every client that the list of ``kind`` may have changed, though the catalog did not: what it is
        shown depends on more than the catalog (the exposure ``auto`` shows search mode while servers are starting)."""
        notification = _TOLD[kind]
        for connection in list(self._connections.values()):
            connection.list_changed(notification)

    def announced_under_way(self, list_method: str) -> list[asyncio.Task[None]]:
        """The fetches of ``list_method`` under way that a server announced: a client's list waits for them, so a list
        asked for after an answer whose server announced a change before it (as a rug pull's ``advance`` does)
        shows the change, never the catalog from before it."""
        if not self._announced:
            return []
        return [task for key in self._announced if key[1] == list_method
                and (task := self._refreshes.get(key)) is not None and not task.done()]

    def settled(self) -> bool:
        """Whether no fetch is under way."""
        return all(task.done() for task in self._refreshes.values())

    async def wait(self, server: str) -> None:
        """Until no fetch of ``server``'s lists is under way."""
        while True:
            tasks = [t for (s, _), t in self._refreshes.items() if s == server and not t.done()]
            if not tasks:
                return
            await asyncio.gather(*tasks, return_exceptions=True)

    def forget(self, server: str) -> None:
        """A server a reload removed or restarts: its fetches under way are dropped (their lists are no longer its)."""
        for key in [key for key in self._refreshes if key[0] == server]:
            self._refreshes.pop(key).cancel()
            self._announced.discard(key)

    def close(self) -> None:
        for task in self._refreshes.values():
            task.cancel()

    async def _refresh(self, upstream: Any, list_method: str) -> None:
        kind, key, _ = LISTS[list_method]
        items: list[dict[str, Any]] = []
        cursor = None
        try:
            for _ in range(10_000):
                params = {"cursor": cursor} if cursor else {}
                result = await upstream.request(list_method, params)
                page = result.get(key)
                if isinstance(page, list):
                    items.extend(i for i in page if isinstance(i, dict))
                cursor = result.get("nextCursor")
                if not cursor:
                    break
        except GatewayError as exc:
            log.warning("server %s: %s failed: %s", upstream.name, list_method, exc.message)
            return
        announced = (upstream.name, list_method) in self._announced
        self._announced.discard((upstream.name, list_method))
        if self._catalog.update(upstream.name, kind, items) or announced:
            notification = _TOLD[kind]
            for connection in list(self._connections.values()):
                connection.list_changed(notification)
