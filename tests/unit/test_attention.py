"""pecli.measures.attention against literal computations from transformers' own attention
weights (eager, output_attentions=True) and hidden states, on tiny models of every family.

The capture computes attention block by block inside the model's forward; the reference is
one plain forward with every layer's full maps, and each statistic written out as its paper
defines it (Gu et al.'s Sink_1^eps as their script computes it).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pecli.measures.attention import (
    EPSILON,
    Stats,
    capture,
    distance_edges,
    heads_of,
    literal_route,
    nearest_inside_cosine,
    rotary_pairs,
    run_batch,
)
from pecli.models.architectures import ARCHITECTURES

FAMILIES = ARCHITECTURES.names()
T, N, BLOCK = 12, 3, 5  # the block does not divide T: a short last block


def _ids(loaded, n=N, t=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    vocab = min(loaded.model.config.vocab_size, 1000)
    return torch.randint(5, vocab, (n, t), generator=g)


def _captured(loaded, ids, block=BLOCK, hidden=True, probe_at=()):
    layers = len(list(loaded.model.base_model.get_submodule(loaded.spec.layers)))
    stats = Stats(len(ids), layers, heads_of(loaded), ids.shape[1], loaded.spec.causal, block,
                  probe_at)
    with torch.inference_mode(), capture(loaded, stats, hidden=hidden):
        stats.offset = 0
        run_batch(loaded, stats, ids[:2])
        stats.offset = 2
        run_batch(loaded, stats, ids[2:])
    return stats


def _literal(loaded, ids):
    """transformers' own eager weights and hidden states, every layer at once."""
    model = loaded.model
    old = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = model.base_model(input_ids=ids, attention_mask=torch.ones_like(ids),
                                   output_attentions=True, output_hidden_states=True)
    finally:
        model.set_attn_implementation(old)
    return torch.stack(out.attentions, 1).double(), out  # [n, L, H, T, T]


def gu_sink_rate(a: torch.Tensor, epsilon: float) -> float:
    """sail-sg/Attention-Sink's compute_attention_sink, written out: a [S, L, H, T, T];
    ratios run along the key axis (T - k queries see key k); column sums over queries divided
    by them; the share over (samples, layers, heads) above epsilon, for the first token."""
    s, L, H, t1, t2 = a.shape
    ratios = torch.arange(t1, 0, -1)[None, None, None, :].expand(s, L, H, t1, t2).to(a)
    importance = (a / ratios).sum(dim=-2)  # [S, L, H, T]
    metric1 = (importance > epsilon).to(torch.float).mean(dim=(0, 1, 2))
    return float(metric1[0])


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt_oss"])  # refused by attn
def test_every_statistic_equals_the_literal_one(tiny, family):
    loaded = tiny(family)
    ids = _ids(loaded)
    stats = _captured(loaded, ids)
    a, out = _literal(loaded, ids)
    n, L, H, t, _ = a.shape
    q = torch.arange(t)[:, None].double()
    k = torch.arange(t)[None, :].double()
    per = stats.per_text()
    close = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(per["first_token_mass"], a[..., :, 0].mean(-1).numpy(), **close)
    ent = -(a * torch.log(torch.where(a > 0, a, torch.ones_like(a)))).sum(-1)  # [n, L, H, T]
    np.testing.assert_allclose(per["entropy"], ent.mean(-1).numpy(), **close)
    np.testing.assert_allclose(stats.entropy_text.numpy(), ent.mean(2).numpy(), **close)
    np.testing.assert_allclose(per["mean_distance"], (a * (q - k).abs()).sum(-1).mean(-1).numpy(),
                               **close)
    prev = torch.stack([a[..., i, i - 1] for i in range(1, t)], -1).mean(-1)
    diag = torch.stack([a[..., i, i] for i in range(t)], -1).mean(-1)
    np.testing.assert_allclose(per["previous_token_mass"], prev.numpy(), **close)
    np.testing.assert_allclose(per["diagonal_mass"], diag.numpy(), **close)
    # the histogram: each (query, key) pair's weight in the bin its distance falls in
    edges = distance_edges(t) + [t]
    hist = np.zeros((L, H, len(edges) - 1))
    d = (q - k).abs()
    for j in range(len(edges) - 1):
        inside = (d >= edges[j]) & (d < edges[j + 1])
        hist[..., j] = (a * inside).sum((-1, -2)).sum(0).numpy() / (n * t)
    np.testing.assert_allclose(stats.distance_histogram(), hist, **close)
    # Gu et al.'s metric, per text and over the run
    rate = np.mean([gu_sink_rate(a[i:i + 1], EPSILON) for i in range(n)])
    # (their mean is taken in float32: 1/6 is 0.16666667 there)
    assert stats.sink_rate().mean() == pytest.approx(rate, abs=1e-7)
    assert stats.sink_rate().mean() == pytest.approx(gu_sink_rate(a, EPSILON), abs=1e-7)
    # hidden states: layer 0 is the first block's input, layer l block l's output (the model's
    # own hidden_states[l] for l < L; the last one of many families passes a final norm)
    hs = torch.stack(out.hidden_states[:L], 1).double()  # [n, L, T, d]
    np.testing.assert_allclose(stats.hidden_norm[:, :L].numpy(), hs.norm(dim=-1).numpy(), rtol=1e-5)
    np.testing.assert_allclose(stats.hidden_sum[:L].numpy(), hs.sum(0).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", [f for f in FAMILIES if not ARCHITECTURES.get(f).own_attention])
def test_the_captured_forward_is_the_models_own(tiny, family):
    """Blocks of eager attention joined give the model's output (its default attention)."""
    loaded = tiny(family)
    own = loaded.model.config._attn_implementation  # sdpa; eager where soft-caps or sinks need it
    ids = _ids(loaded)
    with torch.inference_mode():
        plain = loaded.model.base_model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        seen = []
        h = loaded.model.base_model.register_forward_hook(lambda m, a, o: seen.append(o.last_hidden_state))
        try:
            _captured(loaded, ids, block=4)
        finally:
            h.remove()
    torch.testing.assert_close(torch.cat(seen), plain, rtol=1e-5, atol=1e-5)
    assert loaded.model.config._attn_implementation == own  # restored


def test_literal_route_families_are_restored(tiny):
    loaded = tiny("t5")
    assert literal_route(loaded)
    old = loaded.model.config._attn_implementation
    stats = _captured(loaded, _ids(loaded))
    assert stats.seen_layers == set(range(stats.layers))
    assert loaded.model.config._attn_implementation == old


def test_a_mask_condition_equals_its_literal_weights(tiny):
    """Positions removed and the study's linear mask (log-bias): the capture runs the mask's own
    function block by block; the reference is the same function on the whole map."""
    from pecli.positions.interventions import intervene
    from pecli.positions.masks import masked_attention

    loaded = tiny("gpt2")
    ids = _ids(loaded)
    with intervene(loaded, "zero"), masked_attention(loaded.model, "linear", "log-bias"):
        stats = _captured(loaded, ids)
        with torch.inference_mode():
            out = loaded.model.base_model(input_ids=ids, output_attentions=True)
    a = torch.stack(out.attentions, 1).double()
    np.testing.assert_allclose(stats.per_text()["mean_distance"],
                               (a * (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs()).sum(-1)
                               .mean(-1).numpy(), rtol=1e-5, atol=1e-6)
    with torch.inference_mode():
        intact = _captured(loaded, ids)
    assert not np.allclose(intact.per_text()["mean_distance"], stats.per_text()["mean_distance"])


@pytest.mark.parametrize("family", ["llama", "phi"])
def test_frequency_usage_equals_the_projections_pair_norms(tiny, family):
    """Mean norm per rotary pair (i, i + r/2) of q and k, from the unrotated projections read by
    hooks: the capture reads the rotated q and k, and a rotation keeps every pair's norm."""
    loaded = tiny(family)
    ids = _ids(loaded)
    pairs, freqs = rotary_pairs(loaded)
    assert pairs and len(freqs) == pairs
    blocks = list(loaded.model.base_model.get_submodule(loaded.spec.layers))
    got: dict[tuple[int, str], torch.Tensor] = {}
    hooks = [getattr(b.self_attn, f"{w}_proj").register_forward_hook(
        lambda m, a, o, i=i, w=w: got.__setitem__((i, w), torch.cat([got[(i, w)], o]) if (i, w) in got else o))
        for i, b in enumerate(blocks) for w in ("q", "k")]
    try:
        stats = _captured(loaded, ids)
    finally:
        for h in hooks:
            h.remove()
    q_use, k_use = stats.frequency_usage()
    d = blocks[0].self_attn.head_dim
    for i in range(len(blocks)):
        for w, use in (("q", q_use), ("k", k_use)):
            x = got[(i, w)].double().view(N, T, -1, d)  # [n, T, heads, d]
            x = x[..., : 2 * pairs]
            norms = torch.sqrt(x[..., :pairs] ** 2 + x[..., pairs:] ** 2).mean((0, 1))  # [heads, pairs]
            np.testing.assert_allclose(use[i], norms.numpy(), rtol=1e-5)


def test_positional_vectors_and_the_nearest_inside_cosine():
    v = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.1]])
    got = nearest_inside_cosine(v, 2)
    assert got == pytest.approx([1 / math.sqrt(2), 0.1 / math.sqrt(1.01)])
    stats = Stats(2, 1, 1, 3, True)
    stats.add_hidden(0, torch.tensor([[[1.0, 0], [2, 0], [3, 0]], [[3.0, 0], [2, 0], [1, 0]]]), 1)
    # mean over texts per position is (2, 0) everywhere: no positional vector at all
    assert np.allclose(stats.positional_vectors(), 0)


def test_no_layer_keeps_a_full_map(tiny):
    """The registry route hands Stats blocks of at most `block` query rows (never a whole
    layer's map, so never every layer's)."""
    loaded = tiny("llama")
    ids = _ids(loaded, t=20)
    shapes = []
    layers = len(list(loaded.model.base_model.get_submodule(loaded.spec.layers)))
    stats = Stats(N, layers, heads_of(loaded), 20, True, 6)
    add = stats.add
    stats.add = lambda layer, start, p: (shapes.append(tuple(p.shape)), add(layer, start, p))
    with torch.inference_mode(), capture(loaded, stats):
        stats.offset = 0
        run_batch(loaded, stats, ids)
    assert max(s[2] for s in shapes) == 6 and len(shapes) == layers * 4
