"""STRING, DCA and temperature on the real SmolLM2 (30 layers, grouped-query attention, rope
theta 1e5), each equal to its literal reference of tests/remedy_references.py."""

from __future__ import annotations

import pytest
import torch
from remedy_references import dca_distance, literal_attention, nll_of, random_ids, string_distance

from pecli.positions.interventions import intervene

pytestmark = pytest.mark.slow

CASES = {  # name -> (distance, logit scale)
    "string:8:16": (lambda layer, i, j: string_distance(i, j, 8, 16), None),
    "dca:24:4": (lambda layer, i, j: dca_distance(i, j, 24, 4), None),
    "temperature:0.7": (lambda layer, i, j: i - j, lambda i: 1 / 0.7),
}


@pytest.mark.parametrize("name", CASES)
def test_smollm2_equals_the_literal_reference(smollm2, name):
    ids = random_ids(smollm2, 48)
    with intervene(smollm2, name):
        ours = nll_of(smollm2, ids)
    distance, scale = CASES[name]
    with literal_attention(smollm2, distance, logit_scale=scale):
        literal = nll_of(smollm2, ids)
    assert torch.allclose(ours, literal, atol=1e-3), (ours - literal).abs().max()
    assert (ours - nll_of(smollm2, ids)).abs().max() > 1e-2
