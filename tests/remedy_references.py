"""Literal references for the remedies (tests/unit/test_remedies.py and the SmolLM2
integration test): written from the papers' definitions, sharing no code with
pecli.positions.remedies but the search for each block's attention module.

- `literal_attention`: an eager attention that builds the full score matrix from a distance matrix,
  q . R(D[i, j]) k per rotary pair, merged before one softmax, with what else the layer does
  (its sliding window in true order, Gemma 2's soft-cap, gpt-oss's sink logits);
- `streaming_nll`: sinks as a token-by-token streaming decode with a rolling cache of keys
  kept before rotation and rotated at their cache positions.
"""

from __future__ import annotations

import math

import torch

from pecli.positions.remedies import attention_modules


def rotary_of(loaded):
    return loaded.model.base_model.rotary_emb



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


def string_distance(i, j, s, w):
    """STRING (An et al. 2025; HKUNLP/STRING): P[i][j] = i - j where i - j < w, the
    diagonal kept; beyond, the position matrix shifted: i - j - s."""
    d = i - j
    return d if d < w else d - s


def dca_distance(i, j, chunk, local):
    """Dual Chunk Attention (An et al. 2024; HKUNLP/ChunkLlama): chunks of s = chunk - local
    tokens, key position j mod s; query position i mod s within its own chunk (intra), i mod s
    + s capped at chunk for the chunk just before (successive), chunk capped at 2s - 1 for
    every chunk before that (inter)."""
    s = chunk - local
    pk = j % s
    if i // s == j // s:
        return i % s - pk
    if i // s == j // s + 1:
        return min(i % s + s, chunk) - pk
    return min(2 * s - 1, chunk) - pk


def log_length_scale(i, c, trained):
    """Log-length logit scaling (YaRN's 0.1 ln s + 1, Scalable-Softmax's s ln n): a query that
    sees n = i + 1 tokens, more than the trained `trained`, has its logits times 1 + c ln(n / trained)."""
    n = i + 1
    return 1 + c * math.log(n / trained) if n > trained else 1.0


def literal_attention(loaded, distance, keep=None, logit_scale=None):
    """A context manager: the model's attention replaced by the literal eager one.

    distance(layer, i, j) -> the distance of that pair, or None where unseen; keep(layer) ->
    bool [pairs] of the rotary pairs that rotate (None: all); logit_scale(i) -> the factor of
    query i's logits (None: 1)."""
    from contextlib import contextmanager

    from transformers import AttentionInterface

    rotary = rotary_of(loaded)
    types = getattr(loaded.model.config, "layer_types", None)

    def rotary_of_layer(layer):
        """(inv_freq, attention scaling) of the layer: Gemma 3 keeps one per layer type
        (`sliding_attention_inv_freq`, base 1e4; `full_attention_inv_freq`, base 1e6)."""
        own = f"{types[layer]}_" if types and hasattr(rotary, f"{types[layer]}_inv_freq") else ""
        return (getattr(rotary, f"{own}inv_freq").double(),
                float(getattr(rotary, f"{own}attention_scaling", 1.0)))

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        layer = module.layer_idx
        inv_freq, scale = rotary_of_layer(layer)  # [pairs]
        pairs = inv_freq.shape[0]
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
        q, k = last_first(loaded, query.double()), last_first(loaded, key.double().repeat_interleave(g, dim=1))
        q1, q2, qp = q[..., :pairs], q[..., pairs:2 * pairs], q[..., 2 * pairs:]
        k1, k2, kp = k[..., :pairs], k[..., pairs:2 * pairs], k[..., 2 * pairs:]
        # rotate-half convention: R(a) q . R(b) k = (q1 k1 + q2 k2) cos(a-b) + (q1 k2 - q2 k1) sin(a-b)
        same = q1[:, :, :, None] * k1[:, :, None] + q2[:, :, :, None] * k2[:, :, None]
        cross = q1[:, :, :, None] * k2[:, :, None] - q2[:, :, :, None] * k1[:, :, None]
        scores = (same * angle.cos() + cross * angle.sin()).sum(-1) * scale ** 2
        scores = scores + qp @ kp.transpose(-1, -2)  # partial rotary: the unrotated dims
        if logit_scale is not None:
            scores = scores * torch.tensor([logit_scale(i) for i in range(n)], dtype=torch.float64)[:, None]
        scores = scores * (scaling or d ** -0.5)
        if kwargs.get("softcap") is not None:  # Gemma 2: cap * tanh(logit / cap)
            scores = torch.tanh(scores / kwargs["softcap"]) * kwargs["softcap"]
        window = kwargs.get("sliding_window")  # the layer's window: i - j < W in true order
        if window is not None:
            seen = seen & (torch.arange(n)[:, None] - torch.arange(n)[None] < window)
        scores = scores.masked_fill(~seen, -math.inf)
        sinks = kwargs.get("s_aux")  # gpt-oss: one more logit per head, with no value
        if sinks is not None:
            scores = torch.cat([scores, sinks.double().view(1, h, 1, 1).expand(b, h, n, 1)], -1)
        probs = torch.softmax(scores, -1)[..., :n]
        out = probs @ value.double().repeat_interleave(g, dim=1)
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    @contextmanager
    def installed():
        AttentionInterface.register("pecli_test_literal", attend)
        old = loaded.model.config._attn_implementation
        hooks = [m.register_forward_pre_hook(identity_rotation, with_kwargs=True)
                 for m in attention_modules(loaded)]
        loaded.model.set_attn_implementation("pecli_test_literal")
        try:
            yield
        finally:
            loaded.model.set_attn_implementation(old)
            for hook in hooks:
                hook.remove()

    return installed()


def last_first(loaded, x):
    """DeepSeek's MLA rotates the last qk_rope_head_dim dims of each head (its interleaved pairs
    come out of its own rotation at angle 0 de-interleaved, as rotate-half takes them): those
    dims moved to the front, where the references rotate."""
    r = getattr(loaded.model.config, "qk_rope_head_dim", None)
    return torch.cat([x[..., -r:], x[..., :-r]], -1) if r else x


def identity_rotation(mod, args, kwargs):
    cos, sin = kwargs["position_embeddings"]
    return args, {**kwargs, "position_embeddings": (torch.ones_like(cos), torch.zeros_like(sin))}



def streaming_nll(loaded, ids: torch.Tensor, k: int, w: int) -> torch.Tensor:
    """NLL of ids[1:] from a token-by-token decode with a rolling cache of K sinks + W recent
    (k, v) per layer, keys kept before rotation and rotated at their cache positions."""
    from transformers import AttentionInterface

    rotary = rotary_of(loaded)
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
        keys = torch.stack([rot(last_first(loaded, kk), p) for p, (kk, _) in enumerate(cache)], 1)
        values = torch.stack([v for _, v in cache], 1)  # keys [h_kv, c, d]
        q = rot(last_first(loaded, query[0, :, 0]), len(cache) - 1)  # the query at the last slot
        scores = (q[:, None] @ keys.repeat_interleave(g, 0).transpose(-1, -2))[:, 0] * scaling
        out = (torch.softmax(scores, -1)[:, None] @ values.repeat_interleave(g, 0))[:, 0]  # [h, d]
        return out[None, None], None

    AttentionInterface.register("pecli_test_streaming", attend)
    old = loaded.model.config._attn_implementation
    hooks = [m.register_forward_pre_hook(identity_rotation, with_kwargs=True) for m in attention_modules(loaded)]
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


def without_shortcut(loaded):
    """A context manager: the remedies' exact shortcut off (pecli_remedy_literal) in every layer."""
    from contextlib import contextmanager

    @contextmanager
    def off():
        modules = attention_modules(loaded)
        for m in modules:
            m.pecli_remedy_literal = True
        try:
            yield
        finally:
            for m in modules:
                del m.pecli_remedy_literal

    return off()


def cached_and_full(loaded, ids, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token logits of ids[start:] decoded one token at a time with transformers' KV cache
    after a prefill of ids[:start], and the same from one full pass over each prefix."""
    with torch.no_grad():
        out = loaded.model(input_ids=ids[:, :start], use_cache=True)
        steps = []
        for t in range(start, ids.shape[1]):
            out = loaded.model(input_ids=ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits[0, -1])
        full = [loaded.model(input_ids=ids[:, :t + 1]).logits[0, -1] for t in range(start, ids.shape[1])]
    return torch.stack(steps), torch.stack(full)


def random_ids(loaded, n: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, loaded.model.config.vocab_size, (batch, n), generator=gen)


def logits_of(loaded, ids, mask=None) -> torch.Tensor:
    """The model's logits, position ids counting real tokens (as pecli's scoring gives them)."""
    mask = torch.ones_like(ids) if mask is None else mask
    with torch.no_grad():
        return loaded.model(input_ids=ids, attention_mask=mask,
                            position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits


def nll_of(loaded, ids) -> torch.Tensor:
    """NLL of ids[0, 1:] from one forward (float64 log-softmax)."""
    with torch.inference_mode():
        logits = loaded.model(input_ids=ids).logits[0, :-1].double()
    return -torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]

