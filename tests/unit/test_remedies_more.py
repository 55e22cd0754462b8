"""STRING, Dual Chunk Attention, a fixed temperature and log-length scaling (issue 47 §2)
against literal references (tests/remedy_references.py: the eager attention that builds the
full score matrix from each paper's distance, the logits scaled per query row), their exact
reductions to the intact model, padding, the KV cache and what is refused."""

from __future__ import annotations

import pytest
import torch
from remedy_references import (
    cached_and_full,
    dca_distance,
    literal_attention,
    log_length_scale,
    logits_of,
    random_ids,
    string_distance,
    without_shortcut,
)

from pecli.positions.interventions import intervene
from pecli.runs.errors import PecliError

N = 40
TRAINED = 16  # the tiny models' trained context here: 40 tokens run past it


@pytest.fixture(params=("llama", "pythia", "deepseek_v3"))
def model(request, tiny):
    return tiny(request.param, initializer_range=0.3, max_position_embeddings=TRAINED)


def _ids(loaded, n=N, batch=1):
    return random_ids(loaded, n, batch)


def ordinary(layer, i, j):
    return i - j


CASES = {  # name -> (distance, logit scale)
    "string:3:8": (lambda layer, i, j: string_distance(i, j, 3, 8), None),
    "string:8:8": (lambda layer, i, j: string_distance(i, j, 8, 8), None),
    "string:2:5@1": (lambda layer, i, j: string_distance(i, j, 2, 5) if layer == 1 else i - j, None),
    "dca:16:4": (lambda layer, i, j: dca_distance(i, j, 16, 4), None),
    "dca:12": (lambda layer, i, j: dca_distance(i, j, 12, 1), None),  # L = C // 12
    "dca:20:10": (lambda layer, i, j: dca_distance(i, j, 20, 10), None),
    "temperature:0.5": (ordinary, lambda i: 2.0),
    "temperature:3": (ordinary, lambda i: 1 / 3),
    "logscale:0.5": (ordinary, lambda i: log_length_scale(i, 0.5, TRAINED)),
    "logscale": (ordinary, lambda i: log_length_scale(i, 0.1, TRAINED)),
}


@pytest.mark.parametrize("name", CASES)
def test_each_equals_the_literal_eager_reference(model, name):
    ids = _ids(model)
    with intervene(model, name):
        ours = logits_of(model, ids)
    distance, scale = CASES[name]
    with literal_attention(model, distance, logit_scale=scale):
        literal = logits_of(model, ids)
    # fp32 noise, a little above test_remedies' 2e-5 where temperature:0.5 sharpens the softmax
    assert torch.allclose(ours, literal, atol=5e-5, rtol=1e-4), (ours - literal).abs().max()
    assert (ours - logits_of(model, ids)).abs().max() > 1e-3  # the condition changes the numbers


@pytest.mark.parametrize("name", ["string:0:8", "string:0", "string:4:40", "dca:40:4", "dca:64",
                                  "temperature:1", "logscale:0", "string:3:8@none"])
def test_reductions_are_bit_identical_to_the_intact_model(model, name):
    ids = _ids(model)
    intact = logits_of(model, ids)
    with intervene(model, name):
        assert torch.equal(logits_of(model, ids), intact)
    assert torch.equal(logits_of(model, ids), intact)


def test_logscale_within_the_trained_context_is_intact(tiny):
    loaded = tiny("llama", initializer_range=0.3)  # 64 trained positions, 40 tokens
    ids = _ids(loaded)
    intact = logits_of(loaded, ids)
    with intervene(loaded, "logscale:0.5"):
        assert torch.equal(logits_of(loaded, ids), intact)


@pytest.mark.parametrize("name", ["string:0:8", "dca:40:4", "dca:40:20", "temperature:1", "logscale:0"])
def test_reductions_through_the_construction_equal_the_intact_model(model, name):
    ids = _ids(model)
    with without_shortcut(model), intervene(model, name):
        ours = logits_of(model, ids)
    assert torch.allclose(ours, logits_of(model, ids), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["string:3:8", "dca:16:4", "logscale:0.5"])
def test_padding_and_batching_do_not_change_a_row(model, name):
    ids = _ids(model, batch=2)
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0  # right padding: row 1 is 25 tokens long
    with intervene(model, name):
        assert torch.allclose(logits_of(model, ids, mask)[1, :25], logits_of(model, ids[1:, :25])[0],
                              atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["string:3:5", "dca:8:2", "logscale:0.5"])
def test_the_kv_cache_equals_one_pass_per_prefix(tiny, name):
    loaded = tiny("llama", initializer_range=0.3, max_position_embeddings=TRAINED)
    with intervene(loaded, name):
        steps, full = cached_and_full(loaded, _ids(loaded, n=24), 12)
    assert torch.allclose(steps, full, atol=2e-5, rtol=1e-4)


def test_a_rope_scaling_crosses_with_dca(tiny):
    """DCA on a linearly scaled rotation (ChunkLlama combines them): the reference at the
    scaled frequencies (positions / 2)."""
    from pecli.positions.conditions import plan
    from pecli.positions.rope_scaling import Rope

    loaded = tiny("llama", initializer_range=0.3, max_position_embeddings=TRAINED)
    ids = _ids(loaded)
    with plan(intervention="dca:16:4", rope=Rope.parse("linear:2")).applied(loaded):
        ours = logits_of(loaded, ids)
    with literal_attention(loaded, lambda layer, i, j: dca_distance(i, j, 16, 4) / 2):
        literal = logits_of(loaded, ids)
    assert torch.allclose(ours, literal, atol=2e-5, rtol=1e-4), (ours - literal).abs().max()


@pytest.mark.parametrize("family, name, words", [
    ("gpt2", "dca:16", "learned positions"),
    ("gpt2", "logscale", "learned positions"),
    ("modernbert", "string:4:8", "an encoder"),
    ("gptj", "temperature:2", "its own code"),
    ("llama", "string:9:4", "W must be at least S"),
    ("llama", "dca:16:9", "L must be at most C / 2"),
    ("llama", "temperature:0", "T must be above 0"),
    ("llama", "logscale:-1", "below 0"),
])
def test_meaningless_ones_are_refused_in_one_line(tiny, family, name, words):
    loaded = tiny(family)
    with pytest.raises(PecliError) as err:
        with intervene(loaded, name):
            pass
    assert words in str(err.value) and "\n" not in str(err.value)
