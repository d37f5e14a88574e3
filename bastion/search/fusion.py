"""Combining the lexical, static and transformer rankings into one.

Every fusion only looks at candidates the caller may see: a hidden tool neither takes a
rank nor shifts the normalisation of the visible ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Literal

import numpy as np

@dataclass(frozen=True)
class FusionWeights:
    """How much each retriever counts, chosen by cross-validation across four development catalogs of
    different styles (``bench/search_catalogs.py``; docs/search.md): the best mean Recall@5 over
    their tuning halves, each catalog counting the same, not the best on any one of them.

    With the transformer: ``lexical`` (BM25), ``static`` (static token vectors) and
    ``semantic`` (MiniLM). Without it (the cheap ranking): BM25 at ``cheap_lexical`` and the
    static vectors at the rest. ``gate``: a query whose best tool in the cheap ranking
    stands at least this many (weighted) standard deviations above the catalog's mean is
    answered without running the transformer on it (``None``: always run it). Among the
    settings within a quarter of a point of the best mean Recall@5, the one that skips MiniLM
    on the most queries was taken: MiniLM is most of a query's cost at 10,000 tools.

    ``coverage``: for a query made of several requests, how much the top k is chosen to
    cover each request rather than by the whole query's score alone (see
    :func:`cover_requests`; ``None``: never).

    ``outside_latin``: what share of its weight MiniLM keeps for the part of a query written
    outside the Latin script (see :func:`for_query`). MiniLM learnt English: on the Chinese
    queries of the multilingual development catalog it alone found a third of what BM25 did,
    and at full weight it pulled the fusion below BM25 alone. Chosen last, from 0, 0.25, 0.5,
    0.75 and 1, on the same tuning halves (only the multilingual catalog has such queries, so
    only it decides); the lexical and static weights and the gate stay as they are.
    """

    lexical: float = 0.25
    static: float = 0.30
    semantic: float = 0.45
    cheap_lexical: float = 0.20
    gate: float | None = 8.0
    coverage: float | None = 0.4
    method: Literal["zscore", "rrf"] = "zscore"
    rrf_k: float = 10.0
    outside_latin: float = 0.75


def for_query(weights: FusionWeights, latin_share: float) -> FusionWeights:
    """``weights`` for a query of which ``latin_share`` of the letters are in the Latin script: MiniLM's
    weight scaled between ``outside_latin`` (no Latin letters) and 1 (all Latin)."""
    if latin_share >= 1.0 or weights.outside_latin >= 1.0:
        return weights
    kept = weights.outside_latin + (1.0 - weights.outside_latin) * max(0.0, latin_share)
    return replace(weights, semantic=weights.semantic * kept)


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


def fuse_parts(parts: list[tuple[float, np.ndarray | None]], method: str = "zscore", rrf_k: float = 10.0) -> np.ndarray:
    """One score per candidate (higher is better) from weighted, aligned score vectors;
    a missing (``None``) or zero-weight part is left out."""
    present = [(w, s.astype(np.float32, copy=False)) for w, s in parts if s is not None and w > 0]
    if not present:
        raise ValueError("no scores to fuse")
    if len(present) == 1:
        return present[0][1]
    if method == "rrf":
        return sum(w / (rrf_k + 1.0 + _ranks(s)) for w, s in present)  # type: ignore[return-value]
    return sum(w * _zscore(s) for w, s in present)  # type: ignore[return-value]


def fuse(lexical: np.ndarray | None, semantic: np.ndarray | None, weights: FusionWeights,
         static: np.ndarray | None = None) -> np.ndarray:
    """All available retrievers fused with ``weights`` (no gate)."""
    return fuse_parts([(weights.lexical, lexical), (weights.static, static), (weights.semantic, semantic)],
                      weights.method, weights.rrf_k)


def cheap_fuse(lexical: np.ndarray | None, static: np.ndarray, weights: FusionWeights) -> np.ndarray:
    """BM25 and the static vectors only: what a query costs without the transformer."""
    return fuse_parts([(weights.cheap_lexical, lexical), (1.0 - weights.cheap_lexical, static)], "zscore")


def request_fuse(lexical: np.ndarray | None, static: np.ndarray | None, weights: FusionWeights, n: int) -> np.ndarray:
    """The cheap ranking of one request of several, as weighted z-scores even when only one
    retriever has an opinion, since :func:`cover_requests` compares requests' scores on one
    scale (zeros when neither has)."""
    scores = np.zeros(n, dtype=np.float32)
    for weight, part in ((weights.cheap_lexical, lexical), (1.0 - weights.cheap_lexical, static)):
        if part is not None:
            scores += weight * _zscore(part.astype(np.float32, copy=False))
    return scores


def confident(scores: np.ndarray, gate: float | None) -> bool:
    """Whether the cheap ranking's leader stands out enough to skip the transformer.

    ``scores`` are weighted z-scores, so the test means the same in a catalog of a hundred
    tools or of ten thousand, and near-duplicate tools (one tool offered by several
    servers) do not hide a clear match the way a gap to the next ranks would.
    """
    return gate is not None and len(scores) > 0 and float(scores.max()) >= gate


def gated_fuse(lexical: np.ndarray | None, static: np.ndarray | None, semantic: Callable[[], np.ndarray | None],
               weights: FusionWeights) -> tuple[np.ndarray, bool]:
    """Fused scores and whether the transformer ran. ``semantic`` is called only when the
    cheap ranking is not confident (or there are no static vectors)."""
    if static is not None:
        cheap = cheap_fuse(lexical, static, weights)
        if confident(cheap, weights.gate):
            return cheap, False
    sem = semantic()
    if sem is None and static is not None:
        return cheap_fuse(lexical, static, weights), False
    if lexical is None and sem is None:
        raise ValueError("no scores to fuse")
    return fuse(lexical, sem, weights, static), sem is not None


def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


# Only the whole query's leaders and each request's own leaders can be picked: beyond them a
# tool neither matches the query nor any request well enough to enter a top k.
COVERAGE_POOL = 100
COVERAGE_PER_REQUEST = 3


def cover_requests(scores: np.ndarray, request_scores: np.ndarray, k: int, weight: float) -> tuple[np.ndarray, np.ndarray]:
    """The k best candidates for a query made of several requests, best first, with the
    gain each was picked for (non-increasing).

    Ranking by the whole query's ``scores`` alone fills the top k with tools for its most
    prominent request. Instead, each pick maximises ``(1 - weight) * P(tool | query) +
    weight * sum over requests r of P(tool | r) * P(r not yet covered) / len(requests)``
    (explicit query-aspect diversification, xQuAD), where each P is a softmax over the
    candidates of z-scored fused scores (``scores``: one per candidate; ``request_scores``:
    one row per request). A request one pick already covers well counts less for the next.
    In lexical-only mode ``scores`` are raw BM25 scores, whose softmax is sharper; z-scoring
    them measured the same on BFCL, within noise.
    """
    n = len(scores)
    if k <= 0 or n == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
    p_query = _softmax(scores.astype(np.float64))
    p_request = _softmax(request_scores.astype(np.float64))
    leaders = [np.argpartition(-scores, min(COVERAGE_POOL, n) - 1)[:COVERAGE_POOL]]
    per = min(COVERAGE_PER_REQUEST, n)
    leaders.append(np.argpartition(-request_scores, per - 1, axis=1)[:, :per].ravel())
    pool = np.unique(np.concatenate(leaders))
    uncovered = np.full(len(request_scores), 1.0 / len(request_scores))
    picks, gains = [], []
    available = np.ones(len(pool), dtype=bool)
    for _ in range(min(k, len(pool))):
        gain = (1.0 - weight) * p_query[pool] + weight * (uncovered @ p_request[:, pool])
        gain[~available] = -np.inf
        best = int(np.argmax(gain))  # the pool is sorted: ties go to the lower index, as in top_k
        picks.append(pool[best])
        gains.append(gain[best])
        available[best] = False
        uncovered = uncovered * (1.0 - p_request[:, pool[best]])
    if k > len(picks):  # past the pool: the whole query's order
        taken = set(picks)
        rest = [i for i in top_k(scores, k) if i not in taken][: k - len(picks)]
        floor = gains[-1] if gains else 0.0
        picks.extend(rest)
        gains.extend([floor] * len(rest))
    return np.asarray(picks, dtype=np.int64), np.asarray(gains, dtype=np.float32)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best scores, best first; ties broken by index for stable output."""
    if k <= 0 or len(scores) == 0:
        return np.empty(0, dtype=np.int64)
    if k < len(scores):
        part = np.argpartition(-scores, k - 1)[:k]
    else:
        part = np.arange(len(scores))
    return part[np.lexsort((part, -scores[part]))]
