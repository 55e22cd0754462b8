"""Cosine metrics and the random baseline against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pecli.measures.metrics import (
    cosine_by_layer,
    mean_by_index,
    percentile_of,
    random_pair_cosines,
    summarize,
    token_cosine,
    z_score,
)


def test_token_cosine_hand_values_and_mask():
    h_ref = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [3.0, 4.0]]])  # [1, 3, 2]
    h_int = torch.tensor([[[0.0, 2.0], [2.0, 2.0], [-3.0, -4.0]]])
    mask = torch.tensor([[1, 1, 1]])
    assert token_cosine(h_ref, h_int, mask).tolist() == pytest.approx([0.0, 1.0, -1.0])
    mask = torch.tensor([[0, 1, 1]])
    assert token_cosine(h_ref, h_int, mask).tolist() == pytest.approx([1.0, -1.0])
    h2 = torch.tensor([[[1.0, 2.0], [0.0, 0.0], [1.0, 0.0]]])
    # (3*1 + 4*2) / (5 * sqrt 5); a zero vector gives 0
    vals = token_cosine(h_ref, h2, torch.ones(1, 3))
    assert vals.tolist() == pytest.approx([1 / math.sqrt(5), 0.0, 3 / 5])


def test_token_cosine_rejects_mismatched_shapes():
    with pytest.raises(ValueError):
        token_cosine(torch.zeros(1, 3, 2), torch.zeros(1, 2, 2), torch.ones(1, 3))


def test_cosine_by_layer_matches_token_cosine():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 2, 4, 5, generator=gen), torch.randn(3, 2, 4, 5, generator=gen)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    by_layer = cosine_by_layer(a, b, mask)
    assert by_layer.shape == (3, 5)
    for layer in range(3):
        assert torch.allclose(by_layer[layer], token_cosine(a[layer], b[layer], mask))


def test_summarize_and_group():
    s = summarize([1.0, 2.0, 3.0, 10.0])
    assert s == {"mean": 4.0, "std": pytest.approx(math.sqrt(12.5)), "median": 2.5, "count": 4}
    keys, means, counts = mean_by_index([1.0, 3.0, 5.0, 7.0], [2, 0, 2, 0])
    assert keys.tolist() == [0, 2] and means.tolist() == [5.0, 3.0] and counts.tolist() == [2, 2]


def test_random_baseline_statistics():
    vals = random_pair_cosines(768, 4000, seed=0)
    assert np.array_equal(vals, random_pair_cosines(768, 4000, seed=0))
    assert abs(vals.mean()) < 0.003
    assert vals.std() == pytest.approx(1 / math.sqrt(768), rel=0.05)
    assert np.all(np.abs(vals) <= 1)


def test_z_score_and_percentile_hand_values():
    ref = [0.0, 1.0, 2.0, 3.0, 4.0]  # mean 2, sample std sqrt(2.5)
    assert z_score(4.5, ref) == pytest.approx(2.5 / math.sqrt(2.5))
    assert percentile_of(2.0, ref) == pytest.approx(50.0)
    assert percentile_of(10.0, ref) == 100.0
    assert percentile_of(-1.0, ref) == 0.0
