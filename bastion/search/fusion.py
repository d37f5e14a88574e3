"""Combining the lexical and the semantic ranking into one.

Both fusions only look at candidates the caller may see (``candidates``): a hidden tool
neither takes a rank nor shifts the normalisation of the visible ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class FusionWeights:
    """How much each retriever counts. Defaults tuned on half of the BFCL queries (see docs/search.md)."""

    lexical: float = 0.35
    semantic: float = 0.65
    method: Literal["zscore", "rrf"] = "zscore"
    rrf_k: float = 10.0


def _ranks(scores: np.ndarray) -> np.ndarray:
    """0-based rank of each entry (0 = best)."""
    order = np.argsort(-scores, kind="stable")
    ranks = np.empty(len(scores), dtype=np.float32)
    ranks[order] = np.arange(len(scores), dtype=np.float32)
    return ranks


def _zscore(scores: np.ndarray) -> np.ndarray:
    std = float(scores.std())
    if std < 1e-9:
        return np.zeros_like(scores)
    return (scores - float(scores.mean())) / std


def fuse(lexical: np.ndarray | None, semantic: np.ndarray | None, weights: FusionWeights) -> np.ndarray:
    """One score per candidate (higher is better) from aligned score vectors."""
    parts: list[tuple[float, np.ndarray]] = []
    if lexical is not None:
        parts.append((weights.lexical, lexical))
    if semantic is not None:
        parts.append((weights.semantic, semantic))
    if len(parts) == 1:
        return parts[0][1].astype(np.float32, copy=False)
    if weights.method == "rrf":
        return sum(w / (weights.rrf_k + 1.0 + _ranks(s)) for w, s in parts)  # type: ignore[return-value]
    return sum(w * _zscore(s.astype(np.float32, copy=False)) for w, s in parts)  # type: ignore[return-value]


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best scores, best first; ties broken by index for stable output."""
    if k <= 0 or len(scores) == 0:
        return np.empty(0, dtype=np.int64)
    if k < len(scores):
        part = np.argpartition(-scores, k - 1)[:k]
    else:
        part = np.arange(len(scores))
    return part[np.lexsort((part, -scores[part]))]
