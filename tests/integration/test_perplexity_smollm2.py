"""The protocol identities on the real SmolLM2 and a few TruthfulQA questions (rel. diff < 1e-4)."""

from __future__ import annotations

import pytest
import torch

from pecli.measures.lm_scoring import score, windows_for
from pecli.measures.metrics import aggregate
from pecli.runs.batching import encode

pytestmark = pytest.mark.slow
REL = 1e-4


@pytest.fixture
def prepared(smollm2, shared_data):
    from pecli.data.datasets import load_data

    data = load_data("truthfulqa", data_dir_=shared_data, limit=3, seed=0)
    ids = encode(smollm2.tokenizer, data.texts(), 10**12, add_special_tokens=False).ids
    return windows_for(ids, smollm2.max_positions, smollm2.tokenizer.bos_token_id)


def _same(a, b):
    x, y = torch.cat(a), torch.cat(b)
    # |NLL difference| < 1e-4 is a relative perplexity difference below 1e-4
    assert (x - y).abs().max().item() < REL
    for name, value in aggregate(a).items():
        assert value == pytest.approx(aggregate(b)[name], rel=REL), name


def test_relative_one_pass_equals_prefix_by_prefix(smollm2, prepared):
    fast, _ = score(smollm2, prepared, "linear", "log-bias", "relative")
    slow, how = score(smollm2, prepared, "linear", "log-bias", "relative", fast=False)
    assert how.passes == "prefix-by-prefix"
    _same(fast, slow)


def test_legacy_study_is_self_only(smollm2, prepared):
    fast, how = score(smollm2, prepared, "linear", "legacy", "study")
    assert how.computation == "self/boolean/relative"
    slow, _ = score(smollm2, prepared, "linear", "legacy", "study", fast=False)
    _same(fast, slow)


def test_boolean_study_is_the_default_mask(smollm2, prepared):
    plain, how = score(smollm2, prepared)
    assert how.attention is None
    slow, _ = score(smollm2, prepared, "linear", "boolean", "study", fast=False)
    _same(slow, plain)


def test_batching_and_padding(smollm2, prepared):
    ref, _ = score(smollm2, prepared, "linear", "scale", "relative", batch_size=1)
    got, _ = score(smollm2, prepared, "linear", "scale", "relative", batch_size=16, side="left")
    _same(got, ref)
