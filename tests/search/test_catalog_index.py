"""The gateway's index over the federated catalog: built in the background, searchable within seconds."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import pytest

from bastion.model import GatewayRequest, Session, ToolEntry
from bastion.search.exposure import CatalogIndex, _VisibleTools
from bastion.search.index import EMBED_CHUNK, ToolIndex

from .conftest import CATALOG, tool


@dataclass
class Catalog:
    """The federated catalog as the gateway's interceptors see it, without servers behind it."""

    definitions: list

    def tools(self):
        return [ToolEntry(exposed_name=d["name"], server="s", original_name=d["name"], definition=d)
                for d in self.definitions]

    def tool(self, exposed_name):
        return next((e for e in self.tools() if e.exposed_name == exposed_name), None)


class HeldEncoder:
    """The real encoder, but while ``holding`` is set (from the start, unless told otherwise), embedding a
    catalog (several texts at once) waits until the test lets it go."""

    def __init__(self, inner, holding: bool = True):
        self.inner, self.model_id = inner, inner.model_id
        self.started, self.release, self.returned = threading.Event(), threading.Event(), threading.Event()
        self.holding = threading.Event()
        if holding:
            self.holding.set()
        self.calls = 0

    def encode(self, texts, *, max_tokens):
        if len(texts) == 1 or not self.holding.is_set():
            return self.inner.encode(texts, max_tokens=max_tokens)
        self.calls += 1
        self.started.set()
        assert self.release.wait(60)
        try:
            return self.inner.encode(texts, max_tokens=max_tokens)
        finally:
            self.returned.set()


async def eventually(condition, seconds: float = 30.0) -> None:
    """Wait until ``condition()`` holds, for what the index does in the background; the caller asserts after."""
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)


def names(hits):
    return [name for name, _ in hits]


async def test_searches_answer_before_the_catalog_is_embedded_and_changes_wait_for_nothing(encoder):
    held = HeldEncoder(encoder)
    catalog = Catalog(list(CATALOG))
    index = CatalogIndex(catalog, lambda: ToolIndex(encoder=held))
    try:
        ix = await asyncio.wait_for(index.current(), 30)
        assert held.started.wait(30) and not ix.semantic_ready, "MiniLM is still embedding"
        assert names(ix.search("open a github issue", 1)) == ["create_issue"]

        catalog.definitions.append(tool("book_flight", "Book an airline flight between two airports."))
        assert await asyncio.wait_for(index.current(), 5) is ix, "a change is indexed in the background"
        await eventually(lambda: "book_flight" in ix)
        assert not ix.semantic_ready and names(ix.search("book a flight to Lisbon", 1)) == ["book_flight"], \
            "a change is searchable while MiniLM still embeds the first catalog"

        held.release.set()
        await eventually(lambda: "book_flight" in ix and ix.semantic_ready)
        assert ix.semantic_ready and names(ix.search("book a flight to Lisbon", 1)) == ["book_flight"]

        catalog.definitions = [d for d in catalog.definitions if d["name"] != "create_issue"]
        await index.current()
        await eventually(lambda: "create_issue" not in ix)
        assert "create_issue" not in ix
    finally:
        held.release.set()
        index.close()


async def test_closing_stops_an_embedding_within_a_chunk(encoder):
    held = HeldEncoder(encoder)
    many = [tool(f"widget_{i}", f"Manage widget number {i} in the warehouse.") for i in range(EMBED_CHUNK * 3)]
    index = CatalogIndex(Catalog(many), lambda: ToolIndex(encoder=held))
    ix = await asyncio.wait_for(index.current(), 60)
    assert held.started.wait(30)
    index.close()
    held.release.set()
    assert held.returned.wait(60)
    await asyncio.sleep(1.0)  # the next chunk, if any, would start at once
    assert held.calls == 1, "no chunk is embedded after close"
    assert not ix.semantic_ready


async def test_a_first_build_that_fails_is_reported_and_the_next_request_retries(caplog):
    attempts = []

    def make_index():
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("cache directory not writable")
        return ToolIndex(encoder=None)

    index = CatalogIndex(Catalog(list(CATALOG)), make_index)
    try:
        with pytest.raises(RuntimeError, match="cache directory not writable"):
            await asyncio.wait_for(index.current(), 30)
        await asyncio.sleep(0)  # the failed task's callbacks run on the next turn of the loop
        assert any("building the tool index failed" in r.getMessage() for r in caplog.records)
        ix = await asyncio.wait_for(index.current(), 30)
        assert names(ix.search("open a github issue", 1)) == ["create_issue"] and len(attempts) == 2
    finally:
        index.close()


class BrokenEncoder:
    """Answers single queries but fails on a catalog, as a model that runs out of memory would."""

    def __init__(self, inner):
        self.inner, self.model_id = inner, inner.model_id

    def encode(self, texts, *, max_tokens):
        if len(texts) > 1:
            raise MemoryError("cannot allocate the batch")
        return self.inner.encode(texts, max_tokens=max_tokens)


async def test_an_embedding_that_fails_is_logged_once_and_searches_go_on(encoder, caplog):
    index_catalog = Catalog(list(CATALOG))
    index = CatalogIndex(index_catalog, lambda: ToolIndex(encoder=BrokenEncoder(encoder)))
    try:
        ix = await asyncio.wait_for(index.current(), 30)
        await eventually(lambda: any("embedding the tool catalog failed" in r.getMessage() for r in caplog.records))
        failures = [r for r in caplog.records if "fail" in r.getMessage()]
        assert len(failures) == 1 and "MemoryError" in failures[0].getMessage(), caplog.text
        assert not ix.semantic_ready and names(ix.search("open a github issue", 1)) == ["create_issue"]
        assert await index.current() is ix

        # A change still reaches the index; only MiniLM is missing from it.
        index_catalog.definitions.append(tool("book_flight", "Book an airline flight between two airports."))
        await index.current()
        await eventually(lambda: "book_flight" in ix)
        assert names(ix.search("book a flight to Lisbon", 1)) == ["book_flight"] and not ix.semantic_ready
    finally:
        index.close()


async def test_the_visible_map_is_made_again_only_when_the_listed_list_is_another():
    """Search mode asks for the visible tools on every request; an unchanged list is not mapped again."""
    pages: list[dict] = []

    async def listing(request):
        return pages.pop(0)

    visible = _VisibleTools()
    request = GatewayRequest("tools/call", {}, Session(None, "legacy", "2025-11-25", {}), Catalog([]))
    same = [tool("a", "A."), tool("b", "B.")]
    pages += [{"tools": same}, {"tools": same}]
    first = await visible(request, listing)
    assert await visible(request, listing) is first and list(first) == ["a", "b"]
    pages.append({"tools": [tool("a", "A.")]})  # the catalog changed, or policy hid b: a new list
    assert list(await visible(request, listing)) == ["a"]
    pages += [{"tools": [tool("a", "A.")], "nextCursor": "p2"}, {"tools": [tool("c", "C.")]}]
    assert list(await visible(request, listing)) == ["a", "c"], "every page is read"


async def test_a_server_that_brings_hundreds_of_tools_is_searchable_before_they_are_embedded(encoder):
    switched = HeldEncoder(encoder, holding=False)
    catalog = Catalog(list(CATALOG))
    index = CatalogIndex(catalog, lambda: ToolIndex(encoder=switched))
    try:
        ix = await asyncio.wait_for(index.current(), 30)
        await eventually(lambda: ix.semantic_ready)
        assert ix.semantic_ready
        switched.holding.set()
        catalog.definitions += [tool(f"ledger_entry_{i}", f"Post ledger entry {i} to the accounting books.")
                                for i in range(EMBED_CHUNK)]
        catalog.definitions.append(tool("book_flight", "Book an airline flight between two airports."))
        await index.current()
        await eventually(lambda: "book_flight" in ix)
        # The new tools are searchable by name before MiniLM's thread has even begun to embed them.
        assert await asyncio.to_thread(switched.started.wait, 30), "MiniLM never began to embed the new tools"
        assert not ix.semantic_ready, "MiniLM is still embedding the new tools"
        assert names(ix.search("book a flight to Lisbon", 1)) == ["book_flight"]
        catalog.definitions.append(tool("rent_car", "Rent a car at an airport."))  # a change meanwhile: at once
        await index.current()
        await eventually(lambda: "rent_car" in ix)
        assert "rent_car" in ix and not ix.semantic_ready
        switched.release.set()
        await eventually(lambda: ix.semantic_ready)
        assert ix.semantic_ready and len(ix) == len(CATALOG) + EMBED_CHUNK + 2
        assert names(ix.search("reserve a plane ticket", 1)) == ["book_flight"]
    finally:
        switched.release.set()
        index.close()


class LingeringBuild(ToolIndex):
    """A ToolIndex whose progressive build, once MiniLM has caught up, returns only when the test lets it: the moment
    between the pass catching up and the build's future completing on the loop, held open."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.caught_up, self.finish = threading.Event(), threading.Event()

    def build(self, tools, **options) -> None:
        super().build(tools, **options)
        self.caught_up.set()
        assert self.finish.wait(60)


async def test_hundreds_of_tools_arriving_as_the_embedding_catches_up_are_searchable_at_once(encoder):
    switched = HeldEncoder(encoder, holding=False)
    catalog = Catalog(list(CATALOG))
    made: list[LingeringBuild] = []
    index = CatalogIndex(catalog, lambda: made.append(LingeringBuild(encoder=switched)) or made[0])
    try:
        ix = await asyncio.wait_for(index.current(), 30)
        assert await asyncio.to_thread(made[0].caught_up.wait, 30), "the first build never caught up"
        assert ix.semantic_ready and not ix.embedding_behind
        switched.holding.set()  # MiniLM now waits on the test for any batch of texts
        catalog.definitions += [tool(f"ledger_entry_{i}", f"Post ledger entry {i} to the accounting books.")
                                for i in range(EMBED_CHUNK)]
        catalog.definitions.append(tool("book_flight", "Book an airline flight between two airports."))
        await index.current()
        # Searchable by name before MiniLM embeds them, though the first build's future has not completed yet
        # (an upsert would have embedded them first, out of sight until MiniLM was done).
        await eventually(lambda: "book_flight" in ix)
        assert "book_flight" in ix and names(ix.search("book a flight to Lisbon", 1)) == ["book_flight"]
    finally:
        switched.release.set()
        made[0].finish.set()
        index.close()
