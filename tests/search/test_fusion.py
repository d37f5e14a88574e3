"""Fusion of the retrievers and the gate that decides whether MiniLM runs on a query."""

from __future__ import annotations

import numpy as np
import pytest

from bastion.search.fusion import FusionWeights, confident, fuse, fuse_parts, gated_fuse


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
