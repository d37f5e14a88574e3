"""How BM25 (and the hybrid) find Chinese tools with each way of cutting unspaced text into tokens.

The catalog is tests/search/chinese_catalog.py (30 tools, one colloquial query each): too small for a benchmark of
quality, enough to compare segmenters. Variants: the tokenizer as shipped (character pairs plus single Han
characters), pairs alone, characters alone, and jieba's search-mode words when jieba is importable (it is not a
dependency: `pip install jieba` to include it). Prints Recall@1, Recall@5 and the tokenizer's cost per description.

    .venv/bin/python bench/cjk_segmenters.py
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bastion.search.index as index_module  # noqa: E402
from bastion.search.index import ToolIndex  # noqa: E402
from bastion.search.text import _UNSPACED, lexical_tokens  # noqa: E402
from tests.search.chinese_catalog import QUERIES, TOOLS  # noqa: E402

Tokenizer = Callable[[str, object], list[str]]


def pairs_only(text: str, stem: object) -> list[str]:
    return [t for t in lexical_tokens(text, stem) if not (len(t) == 1 and _UNSPACED.fullmatch(t))]


def characters_only(text: str, stem: object) -> list[str]:
    return [t for t in lexical_tokens(text, stem) if not (len(t) == 2 and _UNSPACED.fullmatch(t))]


def jieba_words() -> Tokenizer | None:
    try:
        import jieba
    except ImportError:
        return None
    jieba.setLogLevel(logging.ERROR)

    def tokens(text: str, stem: object) -> list[str]:
        words = (w.strip().casefold() for w in jieba.lcut_for_search(text))
        return [w for w in words if w and any(ch.isalnum() for ch in w) and (len(w) > 1 or not w.isascii())]

    tokens("预热", None)  # jieba builds its dictionary on first use
    return tokens


def measure(label: str, tokenize: Tokenizer, encoder: object) -> None:
    index_module.lexical_tokens = tokenize  # the index's own reference: what build and search call
    index = ToolIndex(encoder=encoder)
    index.build([{"name": name, "description": description} for name, description in TOOLS])
    ranked = [[key for key, _ in index.search(query, 5)] for query, _ in QUERIES]
    first = sum(r[:1] == [want] for r, (_, want) in zip(ranked, QUERIES)) / len(QUERIES)
    top5 = sum(want in r for r, (_, want) in zip(ranked, QUERIES)) / len(QUERIES)
    started = time.perf_counter()
    for _ in range(100):
        for _, description in TOOLS:
            tokenize(description, None)
    per = (time.perf_counter() - started) / (100 * len(TOOLS))
    print(f"{label:34s} Recall@1 {first:.2f}  Recall@5 {top5:.2f}  {per * 1e6:5.1f} µs per description")


def main() -> None:
    logging.disable(logging.WARNING)
    variants: list[tuple[str, Tokenizer]] = [("pairs + Han characters (shipped)", lexical_tokens),
                                             ("pairs alone", pairs_only), ("characters alone", characters_only)]
    jieba = jieba_words()
    if jieba is not None:
        variants.append(("jieba search-mode words", jieba))
    for encoder, name in ((None, "BM25"), ("auto", "hybrid")):
        for label, tokenize in variants:
            measure(f"{name}: {label}", tokenize, encoder)


if __name__ == "__main__":
    main()
