"""Remedies past the context, frequency bands and per-layer surgery against literal references.

- sinks: a token-by-token streaming decode, one token per forward, with a rolling cache (the
  first K entries + the W most recent) of keys kept *before* rotation and rotated at their
  cache positions 0..len-1, the query at the last slot (Xiao et al. 2023, §3.2);
- Self-Extend, ReRoPE (and leaky), LM-Infinite, bands and @LAYERS: an eager attention that
  builds the full score matrix from a distance matrix written from each paper's definition,
  q . R(D[i, j]) k per rotary pair, merged before one softmax.

Both references receive unrotated queries and keys through their own pre-hook (identity
cos/sin) and rotate with angles p * inv_freq computed here, not by pecli's code.
"""

from __future__ import annotations

import math

import pytest
import torch

from pecli.positions.interventions import intervene
from pecli.positions.remedies import attention_modules
from pecli.runs.errors import InterventionError

N = 40  # tokens per sequence in the unit tests
FAMILIES = ("llama", "pythia")


@pytest.fixture(params=FAMILIES)
def model(request, tiny):
    # sharper attention (init 0.3): position changes show far above float noise
    return tiny(request.param, initializer_range=0.3)


def _ids(loaded, n=N, batch=1, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, loaded.model.config.vocab_size, (batch, n), generator=gen)


def _logits(loaded, ids, mask=None):
    mask = torch.ones_like(ids) if mask is None else mask
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return loaded.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits


def _rotary(loaded):
    return loaded.model.base_model.rotary_emb


# --- the literal eager reference ------------------------------------------------------------


def se_distance(i, j, g, w):
    """Self-Extend (datamllab/LongLM, prefill): neighbours i - j < w keep i - j; beyond,
    (i // g + w - w / g) - j // g."""
    return i - j if i - j < w else (i // g + w - w / g) - j // g


def rerope_distance(i, j, w, k=None):
    """Su: min(d, w); leaky (k): w + (d - w) / k past w."""
    d = i - j
    return d if d < w else w + ((d - w) / k if k else 0)


def lminfinite_distance(i, j, k, w, cap):
    """Han et al.: the first k tokens and the w most recent are seen; beyond w, distance cap."""
    d = i - j
    if d < w:
        return d
    return cap if j < k else None  # None: not seen


def sinks_distance(i, j, k, w):
    d = i - j
    if d < w:
        return d
    return min(i, k + w - 1) - j if j < k else None


def _reference(loaded, distance, keep=None):
    """A context manager: the model's attention replaced by the literal eager one.

    distance(layer, i, j) -> the distance of that pair, or None where unseen; keep(layer) ->
    bool [pairs] of the rotary pairs that rotate (None: all)."""
    from contextlib import contextmanager

    from transformers import AttentionInterface

    rotary = _rotary(loaded)
    inv_freq = rotary.inv_freq.double()  # [pairs]
    scale = float(getattr(rotary, "attention_scaling", 1.0))
    pairs = inv_freq.shape[0]

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        layer = module.layer_idx
        b, h, n, d = query.shape
        g = h // key.shape[1]
        dist = torch.zeros(n, n, dtype=torch.float64)
        seen = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            for j in range(i + 1):
                dd = distance(layer, i, j)
                if dd is not None:
                    dist[i, j], seen[i, j] = dd, True
        angle = dist[:, :, None] * inv_freq  # [n, n, pairs]
        if keep is not None:
            angle = angle * keep(layer).double()
        q, k = query.double(), key.double().repeat_interleave(g, dim=1)
        q1, q2, qp = q[..., :pairs], q[..., pairs:2 * pairs], q[..., 2 * pairs:]
        k1, k2, kp = k[..., :pairs], k[..., pairs:2 * pairs], k[..., 2 * pairs:]
        # rotate-half convention: R(a) q . R(b) k = (q1 k1 + q2 k2) cos(a-b) + (q1 k2 - q2 k1) sin(a-b)
        same = q1[:, :, :, None] * k1[:, :, None] + q2[:, :, :, None] * k2[:, :, None]
        cross = q1[:, :, :, None] * k2[:, :, None] - q2[:, :, :, None] * k1[:, :, None]
        scores = (same * angle.cos() + cross * angle.sin()).sum(-1) * scale ** 2
        scores = scores + qp @ kp.transpose(-1, -2)  # partial rotary: the unrotated dims
        scores = (scores * (scaling or d ** -0.5)).masked_fill(~seen, -math.inf)
        out = torch.softmax(scores, -1) @ value.double().repeat_interleave(g, dim=1)
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    @contextmanager
    def installed():
        from pecli.positions.remedies import _mask_factory  # noqa: F401 (any mask will do)

        AttentionInterface.register("pecli_test_literal", attend)
        old = loaded.model.config._attn_implementation
        hooks = [m.register_forward_pre_hook(_identity, with_kwargs=True)
                 for m in attention_modules(loaded)]
        loaded.model.set_attn_implementation("pecli_test_literal")
        try:
            yield
        finally:
            loaded.model.set_attn_implementation(old)
            for hook in hooks:
                hook.remove()

    return installed()


def _identity(mod, args, kwargs):
    cos, sin = kwargs["position_embeddings"]
    return args, {**kwargs, "position_embeddings": (torch.ones_like(cos), torch.zeros_like(sin))}


CASES = {
    "selfextend:2:8": lambda layer, i, j: se_distance(i, j, 2, 8),
    "selfextend:3:8": lambda layer, i, j: se_distance(i, j, 3, 8),  # W not divisible by G
    "rerope:8": lambda layer, i, j: rerope_distance(i, j, 8),
    "rerope:8:4": lambda layer, i, j: rerope_distance(i, j, 8, 4.0),
    "lminfinite:2:8": lambda layer, i, j: lminfinite_distance(i, j, 2, 8, 8),
    "lminfinite:3:10:6": lambda layer, i, j: lminfinite_distance(i, j, 3, 10, 6),
    "sinks:2:8": lambda layer, i, j: sinks_distance(i, j, 2, 8),
    "sinks:0:8": lambda layer, i, j: sinks_distance(i, j, 0, 8),
    "selfextend:2:8@1": lambda layer, i, j: se_distance(i, j, 2, 8) if layer == 1 else i - j,
    "zero@0": lambda layer, i, j: 0 if layer == 0 else i - j,
    "shift:5@1": lambda layer, i, j: i - j,  # a shift keeps every distance
}


@pytest.mark.parametrize("name", CASES)
def test_each_method_equals_the_literal_eager_reference(model, name):
    ids = _ids(model)
    with intervene(model, name):
        ours = _logits(model, ids)
    with _reference(model, CASES[name]):
        literal = _logits(model, ids)
    intact = _logits(model, ids)
    assert torch.allclose(ours, literal, atol=2e-5, rtol=1e-4), (ours - literal).abs().max()
    if not name.startswith("shift"):
        assert (ours - intact).abs().max() > 1e-3  # the condition changes the numbers


@pytest.mark.parametrize("name, which", [("droplow:0.5", "low"), ("drophigh:0.25", "high"),
                                         ("droplow:0.5@0", "low")])
def test_bands_equal_the_reference_without_those_pairs(model, name, which):
    pairs = _rotary(model).inv_freq.shape[0]
    fraction = float(name.split(":")[1].split("@")[0])
    n = round(fraction * pairs)
    keep = torch.ones(pairs, dtype=torch.bool)
    if which == "low":  # inv_freq falls with the index: the lowest frequencies are last
        keep[pairs - n:] = False
    else:
        keep[:n] = False
    only = 0 if "@" in name else None
    ids = _ids(model)
    with intervene(model, name):
        ours = _logits(model, ids)
    with _reference(model, lambda layer, i, j: i - j,
                    keep=lambda layer: keep if only in (None, layer) else torch.ones_like(keep)):
        literal = _logits(model, ids)
    assert torch.allclose(ours, literal, atol=2e-5, rtol=1e-4)
    if n:
        assert (ours - _logits(model, ids)).abs().max() > 1e-4


# --- sinks: the streaming decode ------------------------------------------------------------


def _streaming_nll(loaded, ids: torch.Tensor, k: int, w: int) -> torch.Tensor:
    """NLL of ids[1:] from a token-by-token decode with a rolling cache of K sinks + W recent
    (k, v) per layer, keys kept before rotation and rotated at their cache positions."""
    from transformers import AttentionInterface

    rotary = _rotary(loaded)
    inv_freq = rotary.inv_freq.float()
    caches: dict[int, list] = {}

    def rot(x, p):  # x [h, d] rotated at position p (rotate-half, partial rotary kept)
        r = 2 * inv_freq.shape[0]
        ang = torch.cat([p * inv_freq, p * inv_freq])
        turned, kept = x[..., :r], x[..., r:]
        half = torch.cat([-turned[..., r // 2:], turned[..., :r // 2]], -1)
        return torch.cat([turned * ang.cos() + half * ang.sin(), kept], -1)

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        cache = caches.setdefault(module.layer_idx, [])
        cache.append((key[0, :, 0], value[0, :, 0]))  # [h_kv, d] each, unrotated
        if len(cache) > k + w:
            del cache[k]  # evict the oldest entry after the sinks
        h = query.shape[1]
        g = h // key.shape[1]
        keys = torch.stack([rot(kk, p) for p, (kk, _) in enumerate(cache)], 1)  # [h_kv, c, d]
        values = torch.stack([v for _, v in cache], 1)
        q = rot(query[0, :, 0], len(cache) - 1)  # the query at the last slot
        scores = (q[:, None] @ keys.repeat_interleave(g, 0).transpose(-1, -2))[:, 0] * scaling
        out = (torch.softmax(scores, -1)[:, None] @ values.repeat_interleave(g, 0))[:, 0]  # [h, d]
        return out[None, None], None

    AttentionInterface.register("pecli_test_streaming", attend)
    old = loaded.model.config._attn_implementation
    hooks = [m.register_forward_pre_hook(_identity, with_kwargs=True) for m in attention_modules(loaded)]
    loaded.model.set_attn_implementation("pecli_test_streaming")
    nll = []
    try:
        with torch.no_grad():
            for t in range(ids.shape[1] - 1):
                logits = loaded.model(input_ids=ids[:, t:t + 1], position_ids=torch.zeros(1, 1, dtype=torch.long),
                                      use_cache=False).logits[0, -1]
                nll.append(-torch.log_softmax(logits.double(), -1)[ids[0, t + 1]])
    finally:
        loaded.model.set_attn_implementation(old)
        for hook in hooks:
            hook.remove()
    return torch.stack(nll)


def _one_pass_nll(loaded, ids, name):
    with intervene(loaded, name):
        logits = _logits(loaded, ids)[0, :-1].double()
    return -torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]


@pytest.mark.parametrize("k, w", [(2, 8), (0, 8), (4, 5), (1, 16)])
def test_sinks_equal_the_streaming_decode(model, k, w):
    ids = _ids(model, n=30)
    streamed = _streaming_nll(model, ids, k, w)
    ours = _one_pass_nll(model, ids, f"sinks:{k}:{w}")
    assert torch.allclose(ours, streamed, atol=1e-4), (ours - streamed).abs().max()
    intact = _one_pass_nll(model, ids, "intact")
    assert (ours - intact).abs().max() > 1e-3


def test_streaming_reference_is_the_plain_model_when_nothing_is_evicted(model):
    """The reference itself: with a cache that never fills, it is ordinary causal decoding."""
    ids = _ids(model, n=20)
    assert torch.allclose(_streaming_nll(model, ids, 4, 16), _one_pass_nll(model, ids, "intact"),
                          atol=1e-4)


# --- exact reductions ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sinks:30:10", "sinks:0:40", "selfextend:1:8", "selfextend:4:40",
                                  "rerope:40", "rerope:64:4", "lminfinite:4:40", "droplow:0",
                                  "drophigh:0", "zero@none", "selfextend:2:8@none", "sinks:2:8@none"])
def test_reductions_are_bit_identical_to_the_intact_model(model, name):
    ids = _ids(model)
    intact = _logits(model, ids)
    with intervene(model, name):
        assert torch.equal(_logits(model, ids), intact)
    assert torch.equal(_logits(model, ids), intact)  # and restored


@pytest.mark.parametrize("name", ["sinks:30:10", "selfextend:1:8", "rerope:40", "lminfinite:4:40"])
def test_reductions_through_the_blocked_path_equal_the_intact_model(model, name):
    """The same reductions with the exact shortcut switched off: the merged score sets give the
    plain attention to float noise."""
    ids = _ids(model)
    modules = attention_modules(model)
    for m in modules:
        m.pecli_remedy_literal = True
    try:
        with intervene(model, name):
            ours = _logits(model, ids)
    finally:
        for m in modules:
            del m.pecli_remedy_literal
    assert torch.allclose(ours, _logits(model, ids), atol=2e-5, rtol=1e-4)


def test_every_layer_is_the_whole_intervention(model):
    ids = _ids(model)
    with intervene(model, "zero"):
        everywhere = _logits(model, ids)
    with intervene(model, "zero@all"):
        assert torch.equal(_logits(model, ids), everywhere)


@pytest.mark.parametrize("name", ["sinks:2:8", "selfextend:2:8", "rerope:8:4"])
def test_padding_and_batching_do_not_change_a_row(model, name):
    ids = _ids(model, n=N, batch=2)
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0  # right padding: row 1 is 25 tokens long
    with intervene(model, name):
        batched = _logits(model, ids, mask)
        alone = _logits(model, ids[1:, :25])
    assert torch.allclose(batched[1, :25], alone[0], atol=2e-5, rtol=1e-4)
    assert not batched.isnan().any()


def test_small_query_blocks_change_nothing(model, monkeypatch):
    from pecli.positions import remedies

    ids = _ids(model)
    for name in ("sinks:2:8", "selfextend:2:8", "rerope:8"):
        with intervene(model, name):
            whole = _logits(model, ids)
        monkeypatch.setattr(remedies, "SCORE_BUDGET", 1)  # 16-query blocks
        with intervene(model, name):
            assert torch.allclose(_logits(model, ids), whole, atol=1e-5)
        monkeypatch.undo()


# --- what is refused --------------------------------------------------------------------------


@pytest.mark.parametrize("family, name, words", [
    ("gpt2", "rerope:64", ["does not apply", "learned positions"]),
    ("gpt2", "zero@even", ["per-layer surgery applies to rotary"]),
    ("gptj", "selfextend:2:8", ["its own code"]),
    ("gptj", "zero@0", ["its own code"]),
    ("llama", "zero@7", ["has 2 layers"]),
    ("modernbert", "droplow:0.5", ["one rotation per layer type"]),
    ("modernbert", "sinks:2:8", ["an encoder"]),
])
def test_meaningless_conditions_are_refused_in_one_line(tiny, family, name, words):
    loaded = tiny(family)
    with pytest.raises(InterventionError) as err:
        with intervene(loaded, name):
            pass
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message
