"""Static sentence vectors: the mean of per-token vectors, no neural network at run time.

The weights are WordLlama's ``l2_supercat_256`` (token vectors trained for sentence
similarity, 32,000 tokens x 256 dimensions, MIT), shipped inside the ``wordllama`` PyPI
package with their tokenizer. Only the two files are read, each checked against the sha256 in
:mod:`bastion.search.model_files`: the package itself is not imported (importing it configures
the root logger). Embedding a tool text costs
microseconds instead of the transformer's milliseconds, which is what lets a large catalog
be searchable semantically within seconds and lets confident queries skip the transformer.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Sequence

import numpy as np

from bastion.search.embedding import EncoderUnavailable
from bastion.search.model_files import STATIC_TOKENIZER, STATIC_WEIGHTS

_TENSOR = "embedding.weight"
# Far beyond any tool text; bounds the work a pathological description can cause.
_MAX_TOKENS = 2048
_CHUNK = 256


def read_safetensor(path: Path, name: str) -> np.ndarray:
    """One tensor of a .safetensors file, as stored."""
    return parse_safetensor(path.read_bytes(), name)


def parse_safetensor(data: bytes, name: str) -> np.ndarray:
    """One tensor of a .safetensors file's bytes (the format is a JSON header, then raw data), as stored."""
    (header_len,) = struct.unpack("<Q", data[:8])
    meta = json.loads(data[8 : 8 + header_len])[name]
    dtype = {"F16": np.float16, "F32": np.float32}[meta["dtype"]]
    start, end = meta["data_offsets"]
    base = 8 + header_len
    return np.frombuffer(data[base + start : base + end], dtype=dtype).reshape(meta["shape"]).copy()


class StaticEncoder:
    """Mean-pooled token vectors, L2-normalised (the :class:`TextEncoder` protocol)."""

    def __init__(self, table: np.ndarray, tokenizer_json: str, model_id: str) -> None:
        from tokenizers import Tokenizer

        self._table = table
        self._tokenizer = Tokenizer.from_str(tokenizer_json)
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length=_MAX_TOKENS)
        self.model_id = model_id
        self.dim = table.shape[1]

    def encode(self, texts: Sequence[str], *, max_tokens: int = _MAX_TOKENS) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), _CHUNK):
            chunk = list(texts[start : start + _CHUNK])
            encodings = self._tokenizer.encode_batch(chunk, add_special_tokens=False)
            out[start : start + len(chunk)] = self._pool([e.ids[:max_tokens] for e in encodings])
        return out

    def _pool(self, id_lists: list[list[int]]) -> np.ndarray:
        lengths = np.array([len(ids) for ids in id_lists])
        pooled = np.zeros((len(id_lists), self.dim), dtype=np.float32)
        filled = lengths > 0
        if filled.any():
            flat = np.fromiter((i for ids in id_lists for i in ids), dtype=np.int64, count=int(lengths.sum()))
            starts = np.concatenate(([0], np.cumsum(lengths[filled])[:-1]))
            # The table stays float16 as shipped (16 MB); sums are taken in float32.
            pooled[filled] = np.add.reduceat(self._table[flat].astype(np.float32), starts, axis=0)
        return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)


def load_static_encoder() -> StaticEncoder | EncoderUnavailable:
    """The packaged static model, or why it cannot be had (never raises for a missing package)."""
    try:
        import tokenizers  # noqa: F401
    except ImportError as exc:
        return EncoderUnavailable(f"{exc.name or exc} is not installed")
    weights, tokenizer = STATIC_WEIGHTS.read(), STATIC_TOKENIZER.read()
    for checked in (weights, tokenizer):
        if isinstance(checked, str):
            return EncoderUnavailable(checked)
    try:
        model_id = f"wordllama-l2-256-{STATIC_WEIGHTS.sha256[:16]}"
        return StaticEncoder(parse_safetensor(weights, _TENSOR), tokenizer.decode(), model_id)
    except Exception as exc:  # a truncated or foreign file: fall back rather than fail the gateway
        return EncoderUnavailable(f"the static model failed to load: {exc}")
