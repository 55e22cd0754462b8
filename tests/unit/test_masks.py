"""Mask shapes, semantics and the registered attention function, on tiny models of every family."""

from __future__ import annotations

import math

import pytest
import torch

from pecli.models.architectures import ARCHITECTURES
from pecli.positions.masks import (
    PROBS,
    WEIGHTS,
    alibi_slopes,
    attention_name,
    check_maskable,
    key_weights,
    mask_geometry,
    masked_attention,
)
from pecli.runs import names
from pecli.runs.batching import pad
from pecli.runs.errors import ConfigError, ModelError

# Families whose attention goes through transformers' attention registry, where masks live
MASKABLE = [f for f, spec in ARCHITECTURES.items() if not spec.own_attention]
OWN_ATTENTION = [f for f, spec in ARCHITECTURES.items() if spec.own_attention]

SEQS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]


def test_linear_is_the_studys_mask():
    # STUDY.md E3: q = 3 -> [0.1, 0.55, 1]; q = 1 -> [1]
    assert torch.allclose(key_weights("linear", 3)[0], torch.tensor([0.1, 0.55, 1.0]))
    assert key_weights("linear", 1)[0].tolist() == [1.0]
    w = key_weights("linear", 8)[0]
    assert w[0].item() == pytest.approx(0.1) and w[-1].item() == 1.0 and bool((w.diff() > 0).all())


def test_exponential_and_self_shapes():
    assert torch.allclose(key_weights("exponential", 3)[0], torch.tensor([0.1, 0.1 ** 0.5, 1.0]))
    assert key_weights("self", 4)[0].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert key_weights("default", 4)[0].tolist() == [1.0] * 4


def test_alibi_slopes_follow_the_paper():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    nine = alibi_slopes(9)  # 8 geometric slopes, then the first odd one of 16 heads
    assert len(nine) == 9 and nine[8].item() == pytest.approx(2.0 ** -0.5)
    w = key_weights("alibi", 4, heads=8)  # [heads, q]
    assert torch.allclose(w[0], torch.exp(-0.5 * torch.tensor([3.0, 2.0, 1.0, 0.0])))


def test_geometry_ignores_padding_side():
    right = torch.tensor([[1, 1, 1, 0]]).bool()
    left = torch.tensor([[0, 1, 1, 1]]).bool()
    for pm in (right, left):
        vis = torch.ones(4, 4).tril().bool()[None, None] & pm[:, None, None, :]
        dist, span = mask_geometry(vis, "relative")
        real = pm[0].nonzero().flatten()
        sub = dist[0, 0][real][:, real]
        assert sub.tolist() == [[0, 1, 2], [1, 0, 1], [2, 1, 0]]
        assert span[0, 0, real, 0].tolist() == [0, 1, 2]
        kd, ks = mask_geometry(vis, "keys")  # every row: distances from the last real token
        assert kd[0, 0, 0, real].tolist() == [2, 1, 0] and ks[0, 0, :, 0].tolist() == [2] * 4


def _probs(semantics: str, m: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    scores = torch.tensor([[[[0.3, -1.2, 2.0, 0.5]]]])
    return PROBS[semantics](scores, visible, m, torch.finfo(torch.float32).min)


def test_semantics_on_one_row():
    m = torch.tensor([[[[0.1, 0.55, 1.0, 0.7]]]])
    visible = torch.tensor([[[[True, True, True, False]]]])  # last key is padding
    scores = torch.tensor([0.3, -1.2, 2.0])
    soft = torch.softmax(scores, -1)
    # legacy: only the largest-m visible key survives, even though m < 1 elsewhere
    assert _probs("legacy", m, visible)[0, 0, 0].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert torch.allclose(_probs("boolean", m, visible)[0, 0, 0, :3], soft)
    logb = torch.softmax(scores + torch.log(m[0, 0, 0, :3]), -1)
    assert torch.allclose(_probs("log-bias", m, visible)[0, 0, 0, :3], logb)
    assert torch.allclose(_probs("scale", m, visible)[0, 0, 0, :3], soft * m[0, 0, 0, :3])
    for name in names.MASK_SEMANTICS.names():  # the padding key never gets weight, whatever its m
        assert _probs(name, m, visible)[0, 0, 0, 3].item() == 0.0


def test_legacy_never_overflows_to_nan():
    # rows where every visible key has m < 1 (the study protocol's earlier rows) and an
    # all-masked row (a left-padding query): finite, normalised, or all zero
    m = torch.tensor([0.1, 0.2, 0.3, 0.0]).expand(1, 1, 2, 4)
    visible = torch.tensor([[True, True, True, False], [False, False, False, False]])[None, None]
    scores = torch.randn(1, 1, 2, 4) * 30
    p = PROBS["legacy"](scores, visible, m, torch.finfo(torch.float32).min)
    assert torch.isfinite(p).all()
    assert p[0, 0, 0].tolist() == [0.0, 0.0, 1.0, 0.0] and p[0, 0, 1].tolist() == [0.0] * 4


def _hidden(loaded, side: str):
    ids, mask = pad(SEQS, loaded.tokenizer.pad_token_id, torch.device("cpu"), side)
    pos = (mask.cumsum(-1) - 1).clamp(min=0) + loaded.spec.position_ids_offset
    with torch.inference_mode():
        h = loaded.model.base_model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
    # real tokens only, in text order
    return torch.cat([h[i][mask[i].bool()] for i in range(len(SEQS))])


@pytest.mark.parametrize("family", MASKABLE)
def test_default_mask_is_the_models_attention(tiny, family):
    loaded = tiny(family)
    ref = _hidden(loaded, "right")
    before = loaded.model.config._attn_implementation
    for semantics in names.MASK_SEMANTICS.names():
        for side in ("right", "left"):
            with masked_attention(loaded.model, "default", semantics) as name:
                assert loaded.model.config._attn_implementation == name
                out = _hidden(loaded, side)
            assert torch.allclose(out, ref, atol=1e-5), (semantics, side)
    assert loaded.model.config._attn_implementation == before


@pytest.mark.parametrize("family", MASKABLE)
def test_a_graded_mask_acts_and_padding_stays_hidden(tiny, family):
    loaded = tiny(family)
    ref = _hidden(loaded, "right")
    for semantics in ("log-bias", "scale"):
        with masked_attention(loaded.model, "linear", semantics):
            right, left = _hidden(loaded, "right"), _hidden(loaded, "left")
        assert (right - ref).abs().max() > 1e-3  # the mask reaches every layer
        assert torch.allclose(right, left, atol=1e-5)  # padding never leaks in


@pytest.mark.parametrize("family", ARCHITECTURES.names())
def test_own_attention_is_what_transformers_says(tiny, family):
    """The spec's flag, which refuses masks before weights load, agrees with the model class."""
    loaded = tiny(family)
    assert loaded.spec.own_attention is not loaded.model._supports_attention_backend


@pytest.mark.parametrize("family", OWN_ATTENTION)
def test_masks_are_refused_where_attention_is_the_models_own(tiny, family):
    loaded = tiny(family)
    before = loaded.model.config._attn_implementation
    with pytest.raises(ModelError, match="masks do not apply"):
        check_maskable(loaded)
    with pytest.raises(ModelError, match="masks do not apply"):  # never a silently unmasked run
        with masked_attention(loaded.model, "linear", "scale"):
            pass
    assert loaded.model.config._attn_implementation == before


def test_masked_attention_restores_on_error(tiny):
    loaded = tiny("gpt2")
    with pytest.raises(RuntimeError), masked_attention(loaded.model, "linear", "scale"):
        raise RuntimeError("boom")
    assert loaded.model.config._attn_implementation == "sdpa"


def test_unknown_names_suggest():
    with pytest.raises(ConfigError, match="did you mean 'linear'"):
        names.parse(names.MASKS, "lineer")
    with pytest.raises(ConfigError, match="unknown mask semantics 'logbias'"):
        names.parse(names.MASK_SEMANTICS, "logbias")


def test_an_attention_is_registered_once_through_the_public_interface():
    from transformers import AttentionInterface

    name = attention_name("exponential", "scale", "keys")
    assert name == "pecli_exponential_scale_keys" and name in AttentionInterface()
    registered = AttentionInterface()[name]
    assert attention_name("exponential", "scale", "keys") == name
    assert AttentionInterface()[name] is registered  # found, not registered again
    assert registered.keywords == {"weights": WEIGHTS["exponential"], "probs": PROBS["scale"],
                                   "mode": "keys"}


def test_log_bias_alibi_is_alibi():
    heads, q = 4, 6
    d = torch.arange(q)[:, None] - torch.arange(q)[None, :]  # [q, k]
    visible = (d >= 0)[None, None]
    dist = d.clamp(min=0).float()[None, None]
    m = WEIGHTS["alibi"](dist, dist.amax(-1, keepdim=True), heads)
    scores = torch.randn(1, heads, q, q)
    ours = PROBS["log-bias"](scores, visible, m, -math.inf)
    bias = -alibi_slopes(heads).view(1, heads, 1, 1) * dist  # ALiBi's additive bias
    ref = torch.softmax((scores + bias).masked_fill(~visible, -math.inf), -1)
    assert torch.allclose(ours, ref, atol=1e-6)
