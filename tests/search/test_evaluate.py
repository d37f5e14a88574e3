"""Ranking metrics on catalogs small enough to check by hand."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from bastion.search.evaluate import (
    CatalogFileError,
    EvalQuery,
    bootstrap_interval,
    evaluate_index,
    format_report,
    load_catalog,
    load_queries,
    ndcg_at_k,
    per_query,
    recall_at_k,
    reciprocal_rank,
    score_rankings,
)
from bastion.search.fusion import FusionWeights
from bastion.search.index import ToolIndex

from .conftest import CATALOG


def test_recall_counts_the_fraction_of_relevant_tools_found():
    ranked = ["a", "b", "c", "d"]
    assert recall_at_k(ranked, {"a"}, 1) == 1.0
    assert recall_at_k(ranked, {"c"}, 2) == 0.0
    assert recall_at_k(ranked, {"b", "d"}, 2) == 0.5
    assert recall_at_k(ranked, {"b", "d"}, 4) == 1.0
    assert recall_at_k(ranked, set(), 4) == 0.0


def test_ndcg_by_hand():
    assert ndcg_at_k(["a", "b"], {"a"}, 10) == 1.0
    # one relevant at rank 2: (1/log2 3) / (1/log2 2)
    assert ndcg_at_k(["x", "a"], {"a"}, 10) == pytest.approx(1 / math.log2(3))
    # two relevant at ranks 1 and 3 out of ideal ranks 1 and 2
    expected = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert ndcg_at_k(["a", "x", "b"], {"a", "b"}, 10) == pytest.approx(expected)
    assert ndcg_at_k(["x", "y"], {"a"}, 10) == 0.0


def test_reciprocal_rank_and_means():
    assert reciprocal_rank(["x", "y", "a"], {"a"}) == pytest.approx(1 / 3)
    assert reciprocal_rank(["x"], {"a"}) == 0.0
    m = score_rankings([["a", "x"], ["x", "b"]], [{"a"}, {"b"}], cutoffs=(1, 2))
    assert m.recall == {1: 0.5, 2: 1.0}
    assert m.mrr == pytest.approx((1 + 0.5) / 2)
    assert m.ndcg_at_10 == pytest.approx((1 + 1 / math.log2(3)) / 2)
    assert m.queries == 2


def test_evaluate_index_end_to_end_on_a_tiny_catalog():
    tools = [dict(t, id=f"id{i}") for i, t in enumerate(CATALOG)]
    queries = [
        EvalQuery("open an issue on github", frozenset({"id0"})),
        EvalQuery("weather in Rome", frozenset({"id2"})),
        EvalQuery("translate this sentence to German", frozenset({"id7"})),
    ]
    report = evaluate_index(tools, queries, k=3, make_index=lambda: ToolIndex(key_field="id", encoder=None))
    assert report.recall[1] == 1.0 and report.recall[3] == 1.0
    assert report.mrr == 1.0 and report.ndcg_at_10 == 1.0
    assert report.mode == "lexical" and report.tools == len(tools) and report.queries == 3
    assert 0 < report.latency_ms_p50 <= report.latency_ms_p99
    assert report.build_seconds > 0


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_more_queries():
    few = [1.0, 0.0] * 10
    many = [1.0, 0.0] * 1000
    low, high = bootstrap_interval(few)
    assert low < 0.5 < high
    wide = high - low
    low, high = bootstrap_interval(many)
    assert low < 0.5 < high and high - low < wide / 5
    assert bootstrap_interval([1.0] * 30) == (1.0, 1.0)  # no spread, no doubt
    assert bootstrap_interval(few) == bootstrap_interval(few)  # seeded: a report is reproducible
    assert bootstrap_interval([]) == (0.0, 0.0)


def test_per_query_scores_are_what_the_means_average():
    rankings, relevants = [["a", "x"], ["x", "b"], ["y", "z"]], [{"a"}, {"b"}, {"c"}]
    recall, ndcg = per_query(rankings, relevants, k=1)
    assert recall.tolist() == [1.0, 0.0, 0.0]
    assert ndcg.tolist() == pytest.approx([1.0, 1 / math.log2(3), 0.0])
    assert ndcg.mean() == pytest.approx(score_rankings(rankings, relevants).ndcg_at_10)


def test_the_report_gives_intervals_for_recall_at_k_and_ndcg():
    tools = [dict(t, id=f"id{i}") for i, t in enumerate(CATALOG)]
    queries = [EvalQuery("open an issue on github", frozenset({"id0"})), EvalQuery("weather in Rome", frozenset({"id3"}))]
    report = evaluate_index(tools, queries, k=1, make_index=lambda: ToolIndex(key_field="id", encoder=None))
    assert report.recall_interval[0] <= report.recall[1] <= report.recall_interval[1]
    text = format_report(report)
    assert "Recall@1   " in text and "(95% CI" in text.split("Recall@1")[1].splitlines()[0]
    assert "(95% CI" not in text.split("Recall@5")[1].splitlines()[0]
    assert "nDCG@10" in text and "(95% CI" in text.split("nDCG@10")[1].splitlines()[0]


def test_evaluation_counts_the_queries_that_ran_the_sentence_model():
    tools = [dict(t, id=f"id{i}") for i, t in enumerate(CATALOG)]
    queries = [EvalQuery("open an issue on github", frozenset({"id0"})), EvalQuery("weather in Rome", frozenset({"id2"}))]
    always = evaluate_index(tools, queries, make_index=lambda: ToolIndex(key_field="id", weights=FusionWeights(gate=None)))
    assert always.mode == "hybrid" and always.semantic_share == 1.0
    assert always.model is not None and always.model.startswith("minilm-l6-")
    assert f"sentence model {always.model} ran on 100% of the queries" in format_report(always)
    lexical = evaluate_index(tools, queries, make_index=lambda: ToolIndex(key_field="id", encoder=None))
    assert lexical.semantic_share is None and lexical.model is None
    assert "sentence model" not in format_report(lexical)


def test_catalog_and_query_files_are_validated_with_line_numbers(tmp_path):
    bad = tmp_path / "tools.jsonl"
    bad.write_text('{"id": "a", "name": "x"}\n{"name": "y"}\n')
    with pytest.raises(CatalogFileError, match=r"tools.jsonl:2: missing string 'id'"):
        load_catalog(bad)
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "name": "x"}\n{"id": "a", "name": "y"}\n')
    with pytest.raises(CatalogFileError, match="duplicate id 'a'"):
        load_catalog(dup)
    q = tmp_path / "q.jsonl"
    q.write_text('{"query": "hi", "relevant": ["zz"]}\n')
    with pytest.raises(CatalogFileError, match="not in the catalog"):
        load_queries(q, known_ids={"a"})
    q.write_text('{"query": "hi", "relevant": []}\n')
    with pytest.raises(CatalogFileError, match="q.jsonl:1"):
        load_queries(q)


def test_empty_catalog_and_query_files_are_errors_not_zero_scores(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(CatalogFileError, match="empty.jsonl: no tools"):
        load_catalog(empty)
    with pytest.raises(CatalogFileError, match="empty.jsonl: no queries"):
        load_queries(empty)


def test_eval_command_refuses_an_empty_query_file_and_indexes_a_catalog_without_words(tmp_path):
    tools, queries = tmp_path / "tools.jsonl", tmp_path / "queries.jsonl"
    tools.write_text('{"id": "a", "name": "x", "description": "1"}\n')
    queries.write_text("")
    refused = subprocess.run([sys.executable, "-m", "bastion", "tools", "eval", "--tools", str(tools), "--queries",
                              str(queries), "--lexical-only"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "no queries" in refused.stderr and refused.stdout == ""
    queries.write_text('{"query": "x marks the spot", "relevant": ["a"]}\n')
    done = subprocess.run([sys.executable, "-m", "bastion", "tools", "eval", "--tools", str(tools), "--queries",
                           str(queries), "--lexical-only", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert json.loads(done.stdout)["recall"]["recall@5"] == 0.0  # nothing in the catalog shares a word with it
