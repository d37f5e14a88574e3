"""The tool index: BM25 over tool words, static token vectors and MiniLM sentence vectors.

BM25 and the static vectors cost microseconds per tool, so a catalog of thousands is
searchable within seconds; MiniLM is the strongest signal but costs milliseconds per tool
and per query. A query whose cheap ranking (BM25 + static) has a clear leader is answered
without running MiniLM on it (see :func:`bastion.search.fusion.gated_fuse`).

Writers (build/upsert/remove, e.g. on ``notifications/tools/list_changed``) prepare a new
immutable snapshot and swap it in; searches read whichever snapshot is current, so a search
never sees a half-applied update and needs no lock.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, NamedTuple, Sequence

import bm25s
import numpy as np

from bastion.progress import step
from bastion.search.embedding import (
    EmbeddingCache,
    EncoderUnavailable,
    TextEncoder,
    load_default_encoder,
)
from bastion.search.fusion import FusionWeights, cover_requests, for_query, gated_fuse, request_fuse, top_k
from bastion.search.static_embedding import load_static_encoder
from bastion.search.text import latin_share, lexical_text, lexical_tokens, make_stemmer, requests, semantic_text

logger = logging.getLogger("bastion.search")
# bm25s sets its own logger to DEBUG when imported and narrates every index build: let it
# follow the application's level like any other library.
logging.getLogger("bm25s").setLevel(logging.NOTSET)

# Which tools a search may return: a set of keys (``dict.keys()`` will do; checked in C, fast at
# thousands of tools), or a predicate called once per tool.
Allowed = AbstractSet[str] | Callable[[str], bool]
EncoderChoice = TextEncoder | Literal["auto"] | None

# Longer texts cost linearly more to embed; 128 word pieces hold a name, a description and
# the leading parameters of nearly every tool. Queries keep their first 128 too.
DOC_MAX_TOKENS = 128
QUERY_MAX_TOKENS = 128
# A task description, however detailed, fits in this; past it a query is cut rather than
# read whole by BM25 and the request splitter (a megabyte of query cost over a second).
MAX_QUERY_CHARS = 8192
# Texts are embedded this many at a time (a multiple of every batch size the encoder uses at the
# default budget), so a closed index stops within a chunk and the disk cache keeps each chunk's
# vectors even if the process dies before the catalog is done.
EMBED_CHUNK = 256
BM25_K1 = 1.2
BM25_B = 0.75


def _disk_cache(directory: Path, model_id: str) -> EmbeddingCache | None:
    """The disk cache, or None (with a warning) when it cannot be had: it saves time, nothing more."""
    try:
        return EmbeddingCache(directory, model_id)
    except (OSError, sqlite3.Error) as exc:
        logger.warning("tool search runs without its embedding cache in %s: %s", directory, exc)
        return None


class IndexClosed(RuntimeError):
    """The index was closed while it was being written."""


@dataclass(frozen=True)
class _Doc:
    tool: Mapping[str, Any]
    tokens: tuple[str, ...]
    semantic: str


@dataclass(frozen=True)
class _Snapshot:
    keys: tuple[str, ...] = ()
    key_set: frozenset[str] = frozenset()
    docs: Mapping[str, _Doc] = field(default_factory=dict)
    lexical: bm25s.BM25 | None = None
    static: np.ndarray | None = None  # static vectors, rows aligned with keys
    vectors: np.ndarray | None = None  # MiniLM vectors, rows aligned with keys


class ScoreComponents(NamedTuple):
    """Raw per-tool scores of each retriever (``None``: that retriever has no opinion)."""

    keys: tuple[str, ...]
    lexical: np.ndarray | None
    static: np.ndarray | None
    semantic: np.ndarray | None


class _VectorStore:
    """Vectors of tool texts for one encoder: kept in memory for the live catalog and, when
    a cache is given, on disk, so only texts never seen before are embedded."""

    def __init__(self, encoder: TextEncoder, max_tokens: int, cache: EmbeddingCache | None = None) -> None:
        self.encoder, self.max_tokens, self._cache = encoder, max_tokens, cache
        self._by_text: dict[str, np.ndarray] = {}
        self._closed = False
        # The cache is closed from the caller's thread while a build may be writing it from another.
        self._cache_lock = threading.Lock()

    def vectors_for(self, texts: Sequence[str]) -> np.ndarray:
        known = self._by_text
        # In the order the encoder batches them (by length), so chunking changes no batch.
        missing = sorted({t for t in texts if t not in known}, key=lambda t: (len(t), t))
        if missing and self._cache is not None:
            keys = {t: EmbeddingCache.key(t, self.max_tokens) for t in missing}
            with self._open_cache() as cache:
                found = cache.get_many(list(keys.values()))
            for text, key in keys.items():
                if key in found:
                    known[text] = found[key]
            missing = [t for t in missing if t not in known]
        for start in range(0, len(missing), EMBED_CHUNK):
            self._check_open()
            chunk = missing[start : start + EMBED_CHUNK]
            fresh = self.encoder.encode(chunk, max_tokens=self.max_tokens)
            for text, vec in zip(chunk, fresh):
                known[text] = vec
            if self._cache is not None:
                with self._open_cache() as cache:
                    cache.put_many({EmbeddingCache.key(t, self.max_tokens): v for t, v in zip(chunk, fresh)})
        release = getattr(self.encoder, "release_memory", None)
        if missing and release is not None:
            release()  # a catalog's activations: a long-running gateway should not keep them
        # Forget vectors of tools no longer listed, so memory follows the live catalog.
        live = set(texts)
        for text in [t for t in known if t not in live]:
            del known[text]
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([known[t] for t in texts]).astype(np.float32, copy=False)

    def _check_open(self) -> None:
        if self._closed:
            raise IndexClosed("the tool index was closed")

    @contextmanager
    def _open_cache(self) -> Iterator[EmbeddingCache]:
        """The disk cache, held so that :meth:`close` cannot close it mid-read or mid-write."""
        with self._cache_lock:
            self._check_open()
            assert self._cache is not None
            yield self._cache

    def close(self) -> None:
        with self._cache_lock:
            self._closed = True
            if self._cache is not None:
                self._cache.close()


class ToolIndex:
    """Hybrid search over MCP tool definitions, keyed by ``key_field`` (the tool name by default)."""

    def __init__(
        self,
        *,
        encoder: EncoderChoice = "auto",
        weights: FusionWeights | None = None,
        key_field: str = "name",
        cache_dir: Path | None = None,
        doc_max_tokens: int = DOC_MAX_TOKENS,
        static_encoder: EncoderChoice = "auto",
    ) -> None:
        """``doc_max_tokens`` bounds the word pieces embedded per tool: embedding cost grows
        linearly with it. 128 keeps the parameters (best recall); 32 keeps about the name and
        the description's first sentence, three to four times cheaper for about 1 point of
        Recall@5 on BFCL (the README's tool-search figures).

        ``static_encoder``: the static token vectors used alongside MiniLM ("auto": the
        packaged WordLlama vectors when MiniLM is in use; ``None``: MiniLM runs on every
        query and nothing is searchable semantically until every tool is embedded)."""
        self.key_field = key_field
        self.doc_max_tokens = doc_max_tokens
        self._stem = make_stemmer()
        # Writers hold _write_lock briefly; a progressive build holds _build_lock while it embeds.
        self._write_lock = threading.Lock()
        self._build_lock = threading.Lock()
        self._embedding_behind = False  # a progressive build is embedding the published catalog
        self._snapshot = _Snapshot()
        # How many searches ran the sentence model (the gate skips it when the cheap ranking is sure).
        self.searches = 0
        self.semantic_searches = 0
        self.fallback_reason: str | None = None
        self._encoder: TextEncoder | None
        if encoder == "auto":
            loaded = load_default_encoder()
            if isinstance(loaded, EncoderUnavailable):
                self._encoder = None
                self.fallback_reason = loaded.reason
                logger.warning("tool search is lexical only (BM25): %s", loaded.reason)
            else:
                self._encoder = loaded
        else:
            self._encoder = encoder
            if encoder is None:
                self.fallback_reason = "semantic search disabled"
        self.weights = weights or FusionWeights()
        cache = _disk_cache(cache_dir, self._encoder.model_id) if cache_dir is not None and self._encoder else None
        self._dense = _VectorStore(self._encoder, doc_max_tokens, cache) if self._encoder else None
        self._static = self._static_store(static_encoder, cache_dir) if self._encoder else None

    @staticmethod
    def _static_store(choice: EncoderChoice, cache_dir: Path | None) -> _VectorStore | None:
        if choice == "auto":
            loaded = load_static_encoder()
            if isinstance(loaded, EncoderUnavailable):
                logger.warning("tool search without static vectors, MiniLM runs on every query: %s", loaded.reason)
                return None
            choice = loaded
        if choice is None:
            return None
        # Cheap, but at 10,000 tools a restart would still spend seconds on them: cached too.
        cache = _disk_cache(cache_dir, choice.model_id) if cache_dir is not None else None
        # The static model costs nothing per extra word, so tool texts are not cut short.
        return _VectorStore(choice, max_tokens=2048, cache=cache)

    # ------------------------------------------------------------------ state

    @property
    def mode(self) -> Literal["hybrid", "lexical"]:
        return "hybrid" if self._encoder is not None else "lexical"

    @property
    def model_id(self) -> str | None:
        """The sentence model in use (its float or integer-product variant), None in lexical mode."""
        return self._encoder.model_id if self._encoder is not None else None

    def __len__(self) -> int:
        return len(self._snapshot.keys)

    def __contains__(self, key: object) -> bool:
        return key in self._snapshot.docs

    def keys(self) -> tuple[str, ...]:
        return self._snapshot.keys

    def get(self, key: str) -> Mapping[str, Any] | None:
        doc = self._snapshot.docs.get(key)
        return doc.tool if doc else None

    def close(self) -> None:
        for store in (self._dense, self._static):
            if store is not None:
                store.close()

    # ---------------------------------------------------------------- writers

    @classmethod
    def from_tools(cls, tools: Iterable[Mapping[str, Any]], **options: Any) -> "ToolIndex":
        index = cls(**options)
        index.build(tools)
        return index

    def build(self, tools: Iterable[Mapping[str, Any]], *, progressive: bool = False,
              on_searchable: Callable[[], None] | None = None) -> None:
        """Replace the whole catalog.

        ``progressive``: publish BM25 and the static vectors first (seconds), so searches
        answer while MiniLM embeds the tool texts, then switch to the full fusion.
        Embedding thousands of tools with MiniLM takes minutes on a small CPU; a gateway
        should not be blind meanwhile, nor deaf to changes: an :meth:`upsert` or
        :meth:`remove` made during that embedding is searchable at once (BM25 and the static
        vectors) and its texts are embedded by this build before it returns.
        ``on_searchable`` is called (from this thread) as soon as searches answer from the
        new catalog.

        :meth:`close` from another thread stops a build within a chunk of texts
        (:class:`IndexClosed`).
        """
        with self._build_lock:
            with self._write_lock, step("tool search: indexing the tool catalog"):
                docs = {self._key(t): self._make_doc(t) for t in tools}
                early = progressive and self._dense is not None
                self._publish(docs, embed=not early)
                self._embedding_behind = early
            if on_searchable is not None:
                on_searchable()
            if early:
                self._catch_up_embedding()

    def _catch_up_embedding(self) -> None:
        """Embed the published catalog's texts without holding writers back, until no writer
        changed the catalog meanwhile; then publish the vectors."""
        assert self._dense is not None
        started = time.perf_counter()
        try:
            with step(f"tool search: MiniLM embedding {len(self._snapshot.keys)} tools"):
                while True:
                    snap = self._snapshot
                    vectors = self._dense.vectors_for([snap.docs[k].semantic for k in snap.keys])
                    with self._write_lock:
                        if self._snapshot is snap:
                            self._snapshot = replace(snap, vectors=vectors)
                            break
        finally:
            with self._write_lock:
                self._embedding_behind = False
        logger.info("tool search: MiniLM's vectors are in for %d tools after %.1f s; searches use them now",
                    len(snap.keys), time.perf_counter() - started)

    def upsert(self, tools: Iterable[Mapping[str, Any]]) -> None:
        """Add or replace tools (re-embeds only texts not seen before; during a progressive
        build, that build embeds them)."""
        with self._write_lock:
            docs = dict(self._snapshot.docs)
            for tool in tools:
                docs[self._key(tool)] = self._make_doc(tool)
            self._publish(docs, embed=not self._embedding_behind)

    def remove(self, keys: Iterable[str]) -> None:
        with self._write_lock:
            docs = dict(self._snapshot.docs)
            for key in keys:
                docs.pop(key, None)
            self._publish(docs, embed=not self._embedding_behind)

    def _key(self, tool: Mapping[str, Any]) -> str:
        key = tool.get(self.key_field)
        if not isinstance(key, str) or not key:
            raise ValueError(f"tool without a string {self.key_field!r}: {dict(tool)!r:.200}")
        return key

    def _make_doc(self, tool: Mapping[str, Any]) -> _Doc:
        tool = dict(tool)
        return _Doc(tool=tool, tokens=tuple(lexical_tokens(lexical_text(tool), self._stem)), semantic=semantic_text(tool))

    def _publish(self, docs: dict[str, _Doc], *, embed: bool = True) -> None:
        keys = tuple(sorted(docs))
        lexical = None
        if any(docs[k].tokens for k in keys):  # bm25s cannot index a catalog without a single word
            lexical = bm25s.BM25(k1=BM25_K1, b=BM25_B)
            lexical.index([list(docs[k].tokens) for k in keys], show_progress=False)
        texts = [docs[k].semantic for k in keys]
        static = self._static.vectors_for(texts) if self._static is not None else None
        snapshot = _Snapshot(keys=keys, key_set=frozenset(keys), docs=docs, lexical=lexical, static=static)
        if self._dense is not None and embed:
            try:
                snapshot = replace(snapshot, vectors=self._dense.vectors_for(texts))
            except Exception:
                self._snapshot = snapshot  # if MiniLM fails, searches still see the catalog as it is, without it
                raise
        self._snapshot = snapshot

    @property
    def embedding_behind(self) -> bool:
        """True while a progressive build's MiniLM pass has not caught up with the published catalog: changes made
        meanwhile are searchable at once and embedded by that pass."""
        return self._embedding_behind

    @property
    def semantic_ready(self) -> bool:
        """True once every listed tool has its MiniLM vector (always False in lexical mode)."""
        return self._snapshot.vectors is not None

    # ----------------------------------------------------------------- search

    def search(self, query: str, k: int = 5, allowed: Allowed | None = None) -> list[tuple[str, float]]:
        """The k best tools for ``query`` as ``[(key, score)]``, best first.

        A query made of several requests (:func:`~bastion.search.text.requests`) gets a top k
        that covers each of them (:func:`~bastion.search.fusion.cover_requests`); its scores
        are then the gains each tool was picked for. Scores compare within one answer only.

        Only the first :data:`MAX_QUERY_CHARS` characters of ``query`` are read.

        ``allowed`` is applied before ranking: a tool it rejects is never returned and never
        pushes a permitted tool out of the top k.
        """
        snap = self._snapshot
        if not snap.keys or k <= 0:
            return []
        query = query[:MAX_QUERY_CHARS]
        candidates = self._candidates(snap, allowed)
        if len(candidates) == 0:
            return []
        lexical, static = self._lexical_scores(snap, query), self._static_scores(snap, query)
        if lexical is not None and static is None and snap.vectors is None:
            # BM25 alone: a tool that shares no word with the query has nothing for it, and
            # in search mode every tool found joins the client's list.
            candidates = candidates[lexical[candidates] > 0]
            if len(candidates) == 0:
                return []

        def semantic() -> np.ndarray | None:
            scores = self._semantic_scores(snap, query)
            return scores[candidates] if scores is not None else None

        scores, semantic_ran = gated_fuse(
            lexical[candidates] if lexical is not None else None,
            static[candidates] if static is not None else None,
            semantic,
            for_query(self.weights, latin_share(query)),
        )
        self.searches += 1
        self.semantic_searches += semantic_ran
        parts = requests(query) if self.weights.coverage else []
        if len(parts) > 1:
            per_request = np.stack([self._request_scores(snap, part, candidates) for part in parts])
            best, gains = cover_requests(scores, per_request, k, self.weights.coverage)
            return [(snap.keys[candidates[i]], float(g)) for i, g in zip(best, gains)]
        best = top_k(scores, k)
        return [(snap.keys[candidates[i]], float(scores[i])) for i in best]

    def _request_scores(self, snap: _Snapshot, request: str, candidates: np.ndarray) -> np.ndarray:
        """One request's cheap ranking: BM25 and the static vectors, without MiniLM, which
        would cost a run per request."""
        lexical, static = self._lexical_scores(snap, request), self._static_scores(snap, request)
        return request_fuse(lexical[candidates] if lexical is not None else None,
                            static[candidates] if static is not None else None, self.weights, len(candidates))

    async def search_async(self, query: str, k: int = 5, allowed: Allowed | None = None) -> list[tuple[str, float]]:
        """:meth:`search` on a worker thread: embedding a query takes milliseconds of CPU that
        the event loop should spend relaying messages (onnxruntime releases the GIL)."""
        return await asyncio.to_thread(self.search, query, k, allowed)

    def score_components(self, query: str) -> ScoreComponents:
        """Keys with the raw scores of every tool from each retriever (for tuning and benchmarks)."""
        snap = self._snapshot
        if not snap.keys:
            return ScoreComponents((), None, None, None)
        query = query[:MAX_QUERY_CHARS]
        return ScoreComponents(snap.keys, self._lexical_scores(snap, query), self._static_scores(snap, query),
                               self._semantic_scores(snap, query))

    @staticmethod
    def _candidates(snap: _Snapshot, allowed: Allowed | None) -> np.ndarray:
        if allowed is None:
            return np.arange(len(snap.keys))
        if isinstance(allowed, AbstractSet):
            if allowed >= snap.key_set:  # the usual case: every indexed tool is visible
                return np.arange(len(snap.keys))
            allowed = allowed.__contains__
        return np.fromiter((i for i, key in enumerate(snap.keys) if allowed(key)), dtype=np.int64)

    def _lexical_scores(self, snap: _Snapshot, query: str) -> np.ndarray | None:
        tokens = lexical_tokens(query, self._stem)
        vocab = snap.lexical.vocab_dict if snap.lexical is not None else {}
        tokens = [t for t in tokens if t in vocab]
        if not tokens:
            # No shared word: lexical has no opinion, so the vectors alone decide (if present).
            if snap.static is not None or snap.vectors is not None:
                return None
            return np.zeros(len(snap.keys), dtype=np.float32)
        return snap.lexical.get_scores(tokens)  # type: ignore[union-attr]

    def _static_scores(self, snap: _Snapshot, query: str) -> np.ndarray | None:
        if self._static is None or snap.static is None or snap.static.shape[0] != len(snap.keys):
            return None
        qvec = self._static.encoder.encode([query], max_tokens=self._static.max_tokens)[0]
        return np.einsum("ij,j->i", snap.static, qvec)

    def _semantic_scores(self, snap: _Snapshot, query: str) -> np.ndarray | None:
        if self._encoder is None or snap.vectors is None or snap.vectors.shape[0] != len(snap.keys):
            return None
        qvec = self._encoder.encode([query], max_tokens=QUERY_MAX_TOKENS)[0]
        # Not ``vectors @ qvec``: OpenBLAS would run it on its thread pool, whose threads then
        # spin on the cores the next query's onnxruntime call needs (measured: +50% wall
        # time, 2x CPU per search). einsum's single-threaded loop costs ~1.7 ms at 10k tools.
        return np.einsum("ij,j->i", snap.vectors, qvec)
