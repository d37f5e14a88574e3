"""Offline retrieval evaluation: a catalog file, a queries file, the standard ranking metrics.

Catalog rows: ``{"id", "name", "description", "inputSchema"}``; query rows:
``{"query", "relevant": [ids]}`` (extra fields are ignored).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import orjson

from bastion.search.index import ToolIndex

RECALL_CUTOFFS = (1, 5, 10)
NDCG_CUTOFF = 10
MRR_DEPTH = 100


class CatalogFileError(ValueError):
    """A line of a catalog or queries file that cannot be used, with where and why."""


def recall_at_k(ranked: Sequence[str], relevant: set[str], k: int) -> float:
    """Fraction of the relevant tools found in the first k."""
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranked[:k])) / len(relevant)


def ndcg_at_k(ranked: Sequence[str], relevant: set[str], k: int) -> float:
    """Binary-relevance nDCG: 1.0 when all relevant tools lead the ranking."""
    dcg = sum(1.0 / math.log2(i + 2) for i, key in enumerate(ranked[:k]) if key in relevant)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(relevant), k)))
    return dcg / ideal if ideal else 0.0


def reciprocal_rank(ranked: Sequence[str], relevant: set[str]) -> float:
    for i, key in enumerate(ranked):
        if key in relevant:
            return 1.0 / (i + 1)
    return 0.0


@dataclass(frozen=True)
class RankingMetrics:
    recall: dict[int, float]
    ndcg_at_10: float
    mrr: float
    queries: int


def score_rankings(rankings: Sequence[Sequence[str]], relevants: Sequence[set[str]], cutoffs: Iterable[int] = RECALL_CUTOFFS) -> RankingMetrics:
    """Mean metrics over queries; ``rankings[i]`` is the ranked keys returned for query i."""
    n = len(rankings)
    if n == 0:
        return RankingMetrics(recall={k: 0.0 for k in cutoffs}, ndcg_at_10=0.0, mrr=0.0, queries=0)
    recall = {k: sum(recall_at_k(r, rel, k) for r, rel in zip(rankings, relevants)) / n for k in sorted(set(cutoffs))}
    ndcg = sum(ndcg_at_k(r, rel, NDCG_CUTOFF) for r, rel in zip(rankings, relevants)) / n
    mrr = sum(reciprocal_rank(r, rel) for r, rel in zip(rankings, relevants)) / n
    return RankingMetrics(recall=recall, ndcg_at_10=ndcg, mrr=mrr, queries=n)


def per_query(rankings: Sequence[Sequence[str]], relevants: Sequence[set[str]], k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Recall@k and nDCG@10 of each query: what a confidence interval resamples."""
    recall = np.fromiter((recall_at_k(r, rel, k) for r, rel in zip(rankings, relevants)), dtype=np.float64)
    ndcg = np.fromiter((ndcg_at_k(r, rel, NDCG_CUTOFF) for r, rel in zip(rankings, relevants)), dtype=np.float64)
    return recall, ndcg


def bootstrap_interval(values: Sequence[float] | np.ndarray, *, resamples: int = 2000, confidence: float = 0.95,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-query ``values``: how far the mean could move with another
    draw of queries like these. Seeded, so a report is reproducible."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return (0.0, 0.0)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class EvalQuery:
    query: str
    relevant: frozenset[str]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise CatalogFileError(f"{path}:{lineno}: not valid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise CatalogFileError(f"{path}:{lineno}: expected a JSON object per line")
            row["__line__"] = lineno
            rows.append(row)
    return rows


def load_catalog(path: Path) -> list[dict[str, Any]]:
    """Tool rows with a string ``id`` and ``name``; ids must be unique."""
    tools, seen = [], set()
    for row in read_jsonl(path):
        lineno = row.pop("__line__")
        for key in ("id", "name"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise CatalogFileError(f"{path}:{lineno}: missing string {key!r} (each line: id, name, description, inputSchema)")
        if row["id"] in seen:
            raise CatalogFileError(f"{path}:{lineno}: duplicate id {row['id']!r}")
        seen.add(row["id"])
        tools.append(row)
    if not tools:
        raise CatalogFileError(f"{path}: no tools (each line: a JSON object with id, name, description, inputSchema)")
    return tools


def load_queries(path: Path, known_ids: set[str] | None = None) -> list[EvalQuery]:
    queries = []
    for row in read_jsonl(path):
        lineno = row.pop("__line__")
        query, relevant = row.get("query"), row.get("relevant")
        if not isinstance(query, str) or not query.strip():
            raise CatalogFileError(f"{path}:{lineno}: missing string 'query'")
        if not isinstance(relevant, list) or not relevant or not all(isinstance(r, str) for r in relevant):
            raise CatalogFileError(f"{path}:{lineno}: 'relevant' must be a non-empty list of tool ids")
        if known_ids is not None and (unknown := [r for r in relevant if r not in known_ids]):
            raise CatalogFileError(f"{path}:{lineno}: relevant ids not in the catalog: {unknown[:5]}")
        queries.append(EvalQuery(query=query, relevant=frozenset(relevant)))
    if not queries:
        raise CatalogFileError(f"{path}: no queries (each line: a JSON object with query and relevant)")
    return queries


@dataclass
class EvalReport:
    tools: int
    queries: int
    mode: str
    recall: dict[int, float]
    ndcg_at_10: float
    mrr: float
    build_seconds: float
    latency_ms_p50: float
    latency_ms_p99: float
    # Share of the queries on which the sentence model ran (None in lexical mode).
    semantic_share: float | None = None
    # Which sentence model ran, float or integer products (None in lexical mode).
    model: str | None = None
    notes: list[str] = field(default_factory=list)
    # 95% bootstrap intervals over the queries: Recall@k (the k asked for) and nDCG@10.
    k: int = 5
    recall_interval: tuple[float, float] = (0.0, 0.0)
    ndcg_interval: tuple[float, float] = (0.0, 0.0)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["recall"] = {f"recall@{k}": v for k, v in self.recall.items()}
        return data


def percentile_ms(samples: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples) * 1000.0, q)) if samples else 0.0


def evaluate_index(
    tools: Sequence[dict[str, Any]],
    queries: Sequence[EvalQuery],
    *,
    k: int = 5,
    make_index: Callable[[], ToolIndex] | None = None,
) -> EvalReport:
    """Build an index over ``tools`` (keyed by id), run every query, time both."""
    index = make_index() if make_index else ToolIndex(key_field="id")
    started = time.perf_counter()
    index.build(tools)
    build_seconds = time.perf_counter() - started
    depth = max(MRR_DEPTH, k, max(RECALL_CUTOFFS))
    rankings, latencies = [], []
    for q in queries:
        t0 = time.perf_counter()
        hits = index.search(q.query, depth)
        latencies.append(time.perf_counter() - t0)
        rankings.append([key for key, _ in hits])
    relevants = [set(q.relevant) for q in queries]
    metrics = score_rankings(rankings, relevants, cutoffs=(*RECALL_CUTOFFS, k))
    recall_k, ndcg = per_query(rankings, relevants, k)
    notes = [f"lexical only: {index.fallback_reason}"] if index.mode == "lexical" and index.fallback_reason else []
    return EvalReport(
        tools=len(tools),
        queries=len(queries),
        mode=index.mode,
        recall=metrics.recall,
        ndcg_at_10=metrics.ndcg_at_10,
        mrr=metrics.mrr,
        build_seconds=build_seconds,
        latency_ms_p50=percentile_ms(latencies, 50),
        latency_ms_p99=percentile_ms(latencies, 99),
        semantic_share=index.semantic_searches / index.searches if index.mode != "lexical" and index.searches else None,
        model=index.model_id,
        notes=notes,
        k=k,
        recall_interval=bootstrap_interval(recall_k),
        ndcg_interval=bootstrap_interval(ndcg),
    )


def format_report(report: EvalReport) -> str:
    lines = [f"catalog: {report.tools} tools, {report.queries} queries, {report.mode} search"]
    for k, v in report.recall.items():
        interval = f"  (95% CI {report.recall_interval[0]:.3f}–{report.recall_interval[1]:.3f})" if k == report.k else ""
        lines.append(f"  Recall@{k:<3} {v:.3f}{interval}")
    lines += [
        f"  nDCG@10    {report.ndcg_at_10:.3f}  (95% CI {report.ndcg_interval[0]:.3f}–{report.ndcg_interval[1]:.3f})",
        f"  MRR        {report.mrr:.3f}",
        f"  index build {report.build_seconds:.2f} s",
        f"  query latency p50 {report.latency_ms_p50:.2f} ms, p99 {report.latency_ms_p99:.2f} ms",
    ]
    if report.semantic_share is not None:
        lines.append(f"  sentence model {report.model} ran on {report.semantic_share:.0%} of the queries")
    lines += [f"  note: {n}" for n in report.notes]
    return "\n".join(lines)
