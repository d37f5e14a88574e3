"""Search mode: a client sees two meta-tools instead of every tool, and finds the few it needs.

This interceptor sits outside the policy interceptors, so every list it answers from and every call it makes
goes through policy: a tool policy hides is never found, listed or called through it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Sequence

from bastion.gateway.pipeline import CatalogView, GatewayRequest, Handler, Session
from bastion.search.index import ToolIndex
from bastion.search.meta_tools import (
    CALL_TOOL_NAME,
    SEARCH_TOOL_NAME,
    ResolvedCall,
    call_tool,
    search_mode_listing,
    search_tools,
)

log = logging.getLogger("bastion.search")

_DISCOVERED = "search.discovered"


class CatalogIndex:
    """A ``ToolIndex`` that follows the federated catalog, rebuilt off the event loop when the catalog changes."""

    def __init__(self, catalog: CatalogView, make_index: Callable[[], ToolIndex] = ToolIndex) -> None:
        self._catalog = catalog
        self._make_index = make_index
        self._index: ToolIndex | None = None
        self._indexed: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def current(self) -> ToolIndex:
        async with self._lock:
            tools = {entry.exposed_name: entry.definition for entry in self._catalog.tools()}
            if self._index is None:
                self._index = await asyncio.to_thread(self._make_index)
                await asyncio.to_thread(self._index.build, list(tools.values()), progressive=True)
            elif tools != self._indexed:
                changed = [d for name, d in tools.items() if self._indexed.get(name) != d]
                gone = [name for name in self._indexed if name not in tools]
                if gone:
                    await asyncio.to_thread(self._index.remove, gone)
                if changed:
                    await asyncio.to_thread(self._index.upsert, changed)
            self._indexed = tools
            return self._index


    def close(self) -> None:
        if self._index is not None:
            self._index.close()


class SearchExposure:
    def __init__(self, index: CatalogIndex, always_list: Sequence[str] = ()) -> None:
        self._index = index
        self._always = tuple(always_list)

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> dict[str, Any]:
        if request.method == "tools/list":
            index = await self._index.current()
            visible = await _visible_tools(request, call_next)
            discovered = request.session.facts.get(_DISCOVERED, ())
            return {"tools": search_mode_listing(index, self._always, discovered, allowed=visible.__contains__)}
        if request.method != "tools/call":
            return await call_next(request)
        name = request.params.get("name")
        if name == SEARCH_TOOL_NAME:
            return await self._search(request, call_next)
        if name == CALL_TOOL_NAME:
            index = await self._index.current()
            visible = await _visible_tools(request, call_next)
            resolved = call_tool(index, request.params.get("arguments"), allowed=visible.__contains__)
            if not isinstance(resolved, ResolvedCall):
                return resolved
            params = {**request.params, "name": resolved.name, "arguments": resolved.arguments}
            return await call_next(_derived(request, "tools/call", params))
        return await call_next(request)

    async def _search(self, request: GatewayRequest, call_next: Handler) -> dict[str, Any]:
        index = await self._index.current()
        visible = await _visible_tools(request, call_next)
        result = await asyncio.to_thread(search_tools, index, request.params.get("arguments"), visible.__contains__)
        found = [tool["name"] for tool in (result.get("structuredContent") or {}).get("tools", [])]
        self._remember(request.session, found)
        return result

    def _remember(self, session: Session, found: list[str]) -> None:
        known = session.facts.setdefault(_DISCOVERED, set())
        new = [name for name in found if name not in known]
        if not new:
            return
        known.update(new)
        # Clients that follow list_changed get the tools they found in their own list, callable directly.
        notify = getattr(session.client, "list_changed", None)
        if notify is not None:
            notify("notifications/tools/list_changed")


async def _visible_tools(request: GatewayRequest, call_next: Handler) -> set[str]:
    """The names this principal may see: the policy-filtered tools/list, every page of it."""
    names: set[str] = set()
    cursor = None
    while True:
        params = {"cursor": cursor} if cursor else {}
        page = await call_next(_derived(request, "tools/list", params))
        names.update(tool["name"] for tool in page.get("tools", []) if isinstance(tool, dict))
        cursor = page.get("nextCursor")
        if not cursor:
            return names


def _derived(request: GatewayRequest, method: str, params: dict[str, Any]) -> GatewayRequest:
    return GatewayRequest(method, params, request.session, request.catalog, request_id=request.request_id,
                          log_level=request.log_level)
