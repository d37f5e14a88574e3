"""Fusion of the retrievers and the gate that decides whether MiniLM runs on a query."""

from __future__ import annotations

import numpy as np
import pytest

from bastion.search.fusion import FusionWeights, confident, fuse, fuse_parts, gated_fuse


def test_confident_needs_a_leader_far_above_the_sixth():
    flat = np.array([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3])
    assert not confident(flat, 2.75)
    leader = flat.copy()
    leader[3] = 4.0  # 3.5 above the sixth best (0.5)
    assert confident(leader, 2.75)
    assert not confident(leader, None)
    assert not confident(leader[:5], 0.1), "five candidates or fewer: no sixth to compare with"


def test_gated_fuse_skips_the_transformer_when_the_cheap_ranking_is_confident():
    rng = np.random.default_rng(0)
    lexical, static = rng.normal(size=200), rng.normal(size=200)
    lexical[17] += 12
    static[17] += 12
    calls = []

    def semantic():
        calls.append(1)
        return rng.normal(size=200)

    scores, used = gated_fuse(lexical, static, semantic, FusionWeights())
    assert not used and calls == [] and int(np.argmax(scores)) == 17

    lexical[17] -= 12
    static[17] -= 12
    scores, used = gated_fuse(lexical, static, semantic, FusionWeights())
    assert used and calls == [1]
    assert np.allclose(scores, fuse(lexical, None, FusionWeights(), static) * 0 + scores)


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
