"""Fusion of the retrievers and the gate that decides whether MiniLM runs on a query."""

from __future__ import annotations

import numpy as np
import pytest

from bastion.search.fusion import (
    COVERAGE_PER_REQUEST,
    COVERAGE_POOL,
    FusionWeights,
    confident,
    cover_requests,
    for_query,
    fuse,
    fuse_parts,
    gated_fuse,
    request_fuse,
    top_k,
)
from bastion.search.text import latin_share


def test_confident_needs_a_leader_far_above_the_catalog_mean():
    rng = np.random.default_rng(1)
    z = rng.normal(size=1000)
    z = (z - z.mean()) / z.std()
    assert not confident(z.clip(max=3.0), 7.0)
    z[10] = 7.5
    assert confident(z, 7.0)
    assert not confident(z, None)
    assert not confident(np.empty(0), 7.0)


def test_gated_fuse_skips_the_transformer_when_the_cheap_ranking_is_confident():
    rng = np.random.default_rng(0)
    lexical, static = rng.normal(size=200), rng.normal(size=200)
    lexical[17] += 20
    static[17] += 20
    calls = []
    minilm = rng.normal(size=200)

    def semantic():
        calls.append(1)
        return minilm

    scores, used = gated_fuse(lexical, static, semantic, FusionWeights())
    assert not used and calls == [] and int(np.argmax(scores)) == 17

    lexical[17] -= 20
    static[17] -= 20
    scores, used = gated_fuse(lexical, static, semantic, FusionWeights())
    assert used and calls == [1]
    assert np.allclose(scores, fuse(lexical, minilm, FusionWeights(), static))


def test_gated_fuse_falls_back_to_the_cheap_ranking_while_minilm_vectors_are_missing():
    lexical, static = np.array([3.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]), np.array([0.9, 0.2, 0.1, 0.1, 0.0, 0.0, 0.0])
    scores, used = gated_fuse(lexical, static, lambda: None, FusionWeights(gate=None))
    assert not used and int(np.argmax(scores)) == 0


def test_fuse_parts_leaves_out_missing_and_zero_weight_parts():
    a, b = np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])
    assert np.array_equal(fuse_parts([(0.5, a), (0.5, None)]), a)
    assert np.array_equal(fuse_parts([(0.5, a), (0.0, b)]), a)
    assert np.allclose(fuse_parts([(0.5, a), (0.5, b)]), 0.0)
    with pytest.raises(ValueError):
        fuse_parts([(1.0, None)])


def _two_requests():
    """Tools 0-2 serve request A, tool 3 serves request B; the whole query leans on A."""
    scores = np.array([3.0, 2.8, 2.6, 2.0, 0.0, -1.0], dtype=np.float32)
    per_request = np.array([[3.0, 2.9, 2.8, 0.0, 0.0, 0.0],   # A: three near-equal tools
                            [0.0, 0.0, 0.0, 4.0, 0.5, 0.0]],  # B: one clear tool
                           dtype=np.float32)
    return scores, per_request


def test_cover_requests_gives_each_request_a_place_in_the_top_k():
    scores, per_request = _two_requests()
    assert list(top_k(scores, 2)) == [0, 1]
    picks, gains = cover_requests(scores, per_request, 2, 0.4)
    assert list(picks) == [0, 3]
    assert np.all(np.diff(gains) <= 0), "gains must not increase down the ranking"
    everything, _ = cover_requests(scores, per_request, 10, 0.4)
    assert sorted(everything) == list(range(6)), "k beyond the candidates returns each once"


def test_cover_requests_without_weight_is_the_whole_query_ranking():
    scores, per_request = _two_requests()
    assert list(cover_requests(scores, per_request, 6, 0.0)[0]) == list(top_k(scores, 6))
    tied = np.zeros(5, dtype=np.float32)
    assert list(cover_requests(tied, np.zeros((2, 5), dtype=np.float32), 3, 0.4)[0]) == [0, 1, 2]
    assert len(cover_requests(scores, per_request, 0, 0.4)[0]) == 0
    assert len(cover_requests(np.empty(0), np.empty((2, 0)), 5, 0.4)[0]) == 0


def test_cover_requests_beyond_the_pool_continues_in_the_whole_query_order():
    rng = np.random.default_rng(3)
    n = COVERAGE_POOL * 3
    scores, per_request = rng.normal(size=n).astype(np.float32), rng.normal(size=(3, n)).astype(np.float32)
    picks, gains = cover_requests(scores, per_request, n, 0.4)
    assert sorted(picks) == list(range(n))
    assert np.all(np.diff(gains) <= 0)
    # Past the pool (the query's leaders and each request's three), the query's order resumes.
    past_pool = picks[COVERAGE_POOL + 3 * COVERAGE_PER_REQUEST:]
    assert np.all(np.diff(scores[past_pool]) <= 0)


def test_request_fuse_is_z_scored_even_with_one_retriever():
    static = np.array([0.1, 0.2, 0.9], dtype=np.float32)
    alone = request_fuse(None, static, FusionWeights(), 3)
    assert alone.argmax() == 2 and abs(float(alone.mean())) < 1e-6
    assert np.allclose(alone.std(), 1.0 - FusionWeights().cheap_lexical)
    assert not request_fuse(None, None, FusionWeights(), 3).any()


def test_minilm_counts_less_for_a_query_written_outside_the_latin_script():
    weights = FusionWeights(semantic=0.6, outside_latin=0.5)
    assert for_query(weights, 1.0) is weights
    assert for_query(weights, 0.0).semantic == pytest.approx(0.3)
    assert for_query(weights, 0.5).semantic == pytest.approx(0.45)
    chinese = for_query(weights, 0.0)
    assert (chinese.lexical, chinese.static, chinese.gate) == (weights.lexical, weights.static, weights.gate)
    assert for_query(FusionWeights(outside_latin=1.0), 0.0) == FusionWeights(outside_latin=1.0)


def test_the_share_of_latin_letters_reads_scripts_not_bytes():
    assert latin_share("weather in Zürich") == 1.0
    assert latin_share("上海今天天气怎么样") == 0.0
    assert latin_share("用Python读取文件") == pytest.approx(6 / 11)
    assert latin_share("2 + 2 = ?") == 1.0  # no letters: nothing to discount
    assert latin_share("Погода в Москве") == 0.0
