"""Search mode: a client sees two meta-tools instead of every tool, and finds the few it needs.

This interceptor sits outside the policy interceptors, so every list it answers from and every call it makes
goes through policy: a tool policy hides is never found, listed or called through it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Awaitable, Callable, Sequence

import msgspec

from bastion.model import CatalogView, GatewayRequest, Handler, Session, withheld_tools
from bastion.search.index import EMBED_CHUNK, IndexClosed, ToolIndex
from bastion.search.meta_tools import (
    CALL_TOOL_NAME,
    SEARCH_TOOL_NAME,
    ResolvedCall,
    call_tool,
    search_mode_listing,
    search_tools,
    with_starting,
)

log = logging.getLogger("bastion.search")

_DISCOVERED = "search.discovered"


class CatalogIndex:
    """A ``ToolIndex`` that follows the federated catalog, indexed in the background, one change at a time.

    A search waits only until the index first answers (BM25 and the static vectors: seconds even for thousands
    of tools), never for MiniLM to embed the catalog (minutes on a small CPU) or for a later change to be
    indexed. Until a change is in, searches rank the catalog as it was, and every answer is still filtered by
    what the client may see now, so a removed or hidden tool is never returned meanwhile. A change made while
    MiniLM embeds a catalog is searchable at once by BM25 and the static vectors, and embedded with it; so is a
    change that brings hundreds of tools (searches rank without MiniLM until they are embedded).
    """

    def __init__(self, catalog: CatalogView, make_index: Callable[[], ToolIndex] = ToolIndex) -> None:
        self._catalog = catalog
        self._make_index = make_index
        self._index: ToolIndex | None = None
        self._wanted: dict[str, Any] | None = None
        self._entries: Sequence[Any] | None = None  # the catalog's tool sequence _wanted was read from
        self._changed = asyncio.Event()
        self._searchable = asyncio.Event()
        self._maintainer: asyncio.Task[None] | None = None

    async def current(self) -> ToolIndex:
        entries = self._catalog.tools()
        if entries is not self._entries:  # every search-mode request asks: skip the comparison when nothing changed
            self._entries = entries
            tools = {entry.exposed_name: entry.definition for entry in entries}
            if tools != self._wanted:
                self._wanted = tools
                self._changed.set()
        if self._maintainer is None:
            self._maintainer = asyncio.create_task(self._maintain())
            self._maintainer.add_done_callback(_report_failure)
        if not self._searchable.is_set():
            maintainer = self._maintainer
            ready = asyncio.ensure_future(self._searchable.wait())
            try:
                await asyncio.wait({ready, maintainer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
            if not self._searchable.is_set():  # the first build failed: the next request starts over
                if self._maintainer is maintainer:
                    self._maintainer, self._wanted, self._entries = None, None, None
                why = "it was closed" if maintainer.cancelled() else repr(maintainer.exception())
                raise RuntimeError(f"the tool index could not be built: {why}")
        assert self._index is not None
        return self._index

    async def _maintain(self) -> None:
        loop = asyncio.get_running_loop()
        index = await asyncio.to_thread(self._make_index)
        embedding: asyncio.Future[None] | None = None
        indexed: dict[str, Any] = {}
        try:
            while True:
                await self._changed.wait()
                self._changed.clear()
                tools = self._wanted or {}
                changed, gone = _changes(indexed, tools)
                # Asked of the index, not of the build's future: the future completes on the loop a moment after
                # the pass caught up, and a change of hundreds of tools in that moment would be embedded before it is
                # searchable (upsert embeds when no pass is behind).
                embedding_runs = embedding is not None and index.embedding_behind
                if self._index is None or (not embedding_runs and len(changed) >= EMBED_CHUNK):
                    # MiniLM embeds the catalog on its own thread while changes keep coming in: the index makes
                    # each searchable at once (BM25 and the static vectors) and embeds it before it is done. A
                    # server that brings hundreds of tools is indexed this way too, so they are found at once
                    # (and every search ranks without MiniLM until they are embedded).
                    self._index = index
                    embedding = asyncio.ensure_future(asyncio.to_thread(
                        index.build, list(tools.values()), progressive=True,
                        on_searchable=lambda: loop.call_soon_threadsafe(self._searchable.set)))
                    embedding.add_done_callback(self._report_embedding_failure)
                    indexed = tools
                    if not self._searchable.is_set():
                        await self._first_answer(embedding)
                elif await self._apply(index, changed, gone, tools):
                    indexed = tools
        except BaseException:
            if not self._searchable.is_set():
                self._index = None
                index.close()
            raise

    async def _first_answer(self, embedding: asyncio.Future[None]) -> None:
        searchable = asyncio.ensure_future(self._searchable.wait())
        try:
            await asyncio.wait({searchable, embedding}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            searchable.cancel()
        if not self._searchable.is_set():
            await embedding  # it failed before the index answered: raise why

    def _report_embedding_failure(self, embedding: asyncio.Future[None]) -> None:
        if embedding.cancelled() or not self._searchable.is_set():  # else the maintainer reports it
            return
        if isinstance(error := embedding.exception(), (IndexClosed, type(None))):
            return
        log.error("embedding the tool catalog failed: %r; searches use BM25 and the static vectors", error)

    @staticmethod
    async def _apply(index: ToolIndex, changed: list[Any], gone: list[str], tools: dict[str, Any]) -> bool:
        try:
            if gone:
                await asyncio.to_thread(index.remove, gone)
            if changed:
                await asyncio.to_thread(index.upsert, changed)
        except Exception:  # the next change retries this one
            caught_up = all(index.get(name) == d for name, d in tools.items()) and not any(n in index for n in gone)
            log.exception("indexing a change to the tool catalog failed; searches use %s",
                          "it without MiniLM" if caught_up else "the previous catalog")
            return False
        return True

    def close(self) -> None:
        if self._maintainer is not None:
            self._maintainer.cancel()
        if self._index is not None:
            self._index.close()  # stops an embedding in progress within a chunk of texts


def _changes(indexed: dict[str, Any], tools: dict[str, Any]) -> tuple[list[Any], list[str]]:
    """The definitions that are new or changed, and the names that are gone."""
    changed = [definition for name, definition in tools.items() if indexed.get(name) != definition]
    return changed, [name for name in indexed if name not in tools]


def _report_failure(maintainer: asyncio.Task[None]) -> None:
    if not maintainer.cancelled() and (error := maintainer.exception()) is not None:
        log.error("building the tool index failed: %r; the next search-mode request tries again", error)


class SearchExposure:
    span_name = "exposure"  # its span, when tracing is on
    # Of a tools/call it reads the name, and the arguments only of its own meta-tools, which it decodes itself when
    # the frontend left them as the client's bytes: calls to every other tool keep the byte pass-through.
    methods = frozenset({"tools/list", "tools/call"})
    reads_params = False
    reads_results = False

    def __init__(self, index: CatalogIndex, always_list: Sequence[str] = (),
                 starting: Callable[[], Sequence[tuple[str, str]]] = tuple,
                 servers_joined: Callable[[], Awaitable[None]] | None = None) -> None:
        """``starting``: the servers that have not joined yet, with what each is doing, which searches and calls of
        tools not found name; ``servers_joined``: waits (within the gateway's bound) until they have, for a
        ``call_tool`` of a name not found yet."""
        self._index = index
        self._always = tuple(always_list)
        self._starting = starting
        self._servers_joined = servers_joined
        self._told_starting: Sequence[tuple[str, str]] = ()
        self._reported_unknown: set[str] = set()
        self._visible = _VisibleTools()

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> dict[str, Any]:
        if request.session.finds_tools_itself:  # the host API: it finds tools itself
            return await call_next(request)
        if request.method == "tools/list":
            starting = self._starting()
            if starting and starting != self._told_starting:  # said when it changes, not at every listing
                log.info("tools/list: servers still starting, whose tools search_tools finds once they join: %s",
                         ", ".join(f"{server} ({doing})" for server, doing in starting))
            self._told_starting = starting
            index = await self._index.current()
            visible = await self._visible(request, call_next)
            self._report_unknown(request.catalog)
            discovered = request.session.facts.get(_DISCOVERED, ())
            return {"tools": search_mode_listing(index, self._always, discovered, visible)}
        if request.method != "tools/call":
            return await call_next(request)
        name = request.params.get("name")
        if type(name) is msgspec.Raw:
            name = _raw_string(name)
            if name in (SEARCH_TOOL_NAME, CALL_TOOL_NAME):
                request = _derived(request, "tools/call", _decoded(request.params))
        if name == SEARCH_TOOL_NAME:
            return await self._search(request, call_next)
        if name == CALL_TOOL_NAME:
            index = await self._index.current()
            visible = await self._visible(request, call_next)
            resolved = call_tool(index, request.params.get("arguments"), visible, withheld_tools(request.session))
            if not isinstance(resolved, ResolvedCall) and self._starting() and self._servers_joined is not None:
                # The name may be a tool of a server still starting: wait for it (within the gateway's bound).
                await self._servers_joined()
                index = await self._index.current()
                visible = await self._visible(request, call_next)
                resolved = call_tool(index, request.params.get("arguments"), visible, withheld_tools(request.session))
            if not isinstance(resolved, ResolvedCall):
                return with_starting(resolved, self._starting())
            params = {**request.params, "name": resolved.name, "arguments": resolved.arguments}
            return await call_next(_derived(request, "tools/call", params))
        return await call_next(request)

    def _report_unknown(self, catalog: CatalogView) -> None:
        """A name in always_list that no server offers is most likely a typo or an unprefixed name: say so once."""
        for name in self._always:
            if name not in self._reported_unknown and catalog.tool(name) is None:
                self._reported_unknown.add(name)
                log.warning("tools.always_list names %r, which no server offers now (tools are listed as "
                            "<prefix>__<name>; `bastion tools CONFIG` prints them all)", name)

    async def _search(self, request: GatewayRequest, call_next: Handler) -> dict[str, Any]:
        index = await self._index.current()
        visible = await self._visible(request, call_next)
        result = await asyncio.to_thread(search_tools, index, request.params.get("arguments"), visible)
        found = [tool["name"] for tool in (result.get("structuredContent") or {}).get("tools", [])]
        self._remember(request.session, found)
        return with_starting(result, self._starting())

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


class _VisibleTools:
    """The tools a principal may see now, by name: the policy-filtered tools/list, every page of it.

    Asked on every search-mode request. When the list comes back as the very list object of the last
    time (one page, nothing hidden by policy, the catalog unchanged), the map made of it then is handed
    out again: at 10,000 tools making it costs 1.6 ms of the event loop. Callers only read it."""

    def __init__(self) -> None:
        self._last: tuple[list[Any], dict[str, dict[str, Any]]] | None = None

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> dict[str, dict[str, Any]]:
        tools: dict[str, dict[str, Any]] = {}
        cursor = None
        while True:
            params = {"cursor": cursor} if cursor else {}
            page = await call_next(_derived(request, "tools/list", params))
            items = page.get("tools", [])
            if cursor is None and not page.get("nextCursor"):
                if self._last is not None and self._last[0] is items:
                    return self._last[1]
                tools = {tool["name"]: tool for tool in items}  # the catalog's: each has a name
                self._last = (items, tools)
                return tools
            tools.update({tool["name"]: tool for tool in items})
            cursor = page.get("nextCursor")
            if not cursor:
                return tools


def _raw_string(value: msgspec.Raw) -> str | None:
    try:
        decoded = msgspec.json.decode(value)
    except msgspec.DecodeError:
        return None
    return decoded if isinstance(decoded, str) else None


def _decoded(params: dict[str, Any]) -> dict[str, Any]:
    """Params the frontend left as the client's JSON bytes, decoded (it checked they are JSON)."""
    return {key: msgspec.json.decode(value) if type(value) is msgspec.Raw else value for key, value in params.items()}


def _derived(request: GatewayRequest, method: str, params: dict[str, Any]) -> GatewayRequest:
    """The request as the exposure passes it on: the same call under its real tool (a retry that continues a call
    still continues it), or the list it reads on the call's way (a request of its own)."""
    if method == request.method:
        return dataclasses.replace(request, params=params)
    return GatewayRequest(method, params, request.session, request.catalog, request_id=request.request_id,
                          log_level=request.log_level)
