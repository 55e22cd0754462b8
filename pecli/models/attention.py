"""The attention function pecli registers in transformers' `AttentionInterface`: softmax
attention with mask weights m(q, k) under a semantics, read from the model's own boolean mask.

pecli.positions.masks names the shapes and semantics of study E3 and installs them; this is
the engine they run in, kept at the models layer so that loading a checkpoint pecli trained
with ALiBi (pecli.models.trained) can register the attention function its config names
without reaching up. The names, shapes and semantics: pecli.positions.masks' docstring.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

# m(q, k) of each mask shape (pecli.runs.names.MASKS):
# (dist[b,1,q,k], span[b,1,q,1], heads) -> weights broadcastable to [b,heads,q,k]
Weights = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
# How a weight enters attention, per mask semantics (pecli.runs.names.MASK_SEMANTICS):
# (scores[b,h,q,k] fp32, visible[b,1,q,k] bool, m[b,h|1,q,k], finfo_min) -> probs[b,h,q,k]
Probs = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def attention_key(mask: str, semantics: str, mode: str) -> str:
    """The registered name of (mask shape, semantics, mode)."""
    return f"pecli_{mask}_{semantics}_{mode}"


def alibi_slopes(heads: int) -> torch.Tensor:
    """ALiBi's per-head slopes (Press et al. 2022): 2^(-8/n), its powers, interleaved for n != 2^k."""
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    base = 2 ** int(math.floor(math.log2(heads)))
    slopes = power_of_two(base)
    if base < heads:  # the extra heads take every other slope of the next power of two
        slopes += power_of_two(2 * base)[0::2][: heads - base]
    return torch.tensor(slopes)


def alibi_weights(dist: torch.Tensor, span: torch.Tensor, heads: int) -> torch.Tensor:
    """The `alibi` mask shape: exp(-slope_h * d), ALiBi's bias under log-bias semantics."""
    return torch.exp(-alibi_slopes(heads).to(dist).view(1, heads, 1, 1) * dist)


# --- semantics ---------------------------------------------------------------------------


def _softmax(scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim; a row with no visible key gives zeros, not NaN."""
    probs = torch.softmax(scores, dim=-1)  # [b,h,q,k]
    return probs.masked_fill(~visible.any(-1, keepdim=True), 0.0)


def _legacy(scores, visible, m, finfo_min):
    # 4.x added (1 - m) * min to logits already set to min where causally masked; in fp32
    # that sum overflows to -inf. We write -inf there directly: the same result, and a
    # padding or future key stays invisible whatever m is.
    bias = (1 - m) * finfo_min  # [b,h|1,q,k], finite for m in [0, 1]
    return _softmax(torch.where(visible, scores + bias, -math.inf), visible)


def _boolean(scores, visible, m, finfo_min):
    seen = visible & (m != 0)  # [b,h|1,q,k]
    return _softmax(scores.masked_fill(~seen, -math.inf), seen)


def _log_bias(scores, visible, m, finfo_min):
    biased = torch.where(visible, scores + torch.log(m), -math.inf)  # log 0 = -inf hides a key
    return _softmax(biased, visible & (m != 0))


def _scale(scores, visible, m, finfo_min):
    return _softmax(scores.masked_fill(~visible, -math.inf), visible) * m


PROBS: dict[str, Probs] = {"legacy": _legacy, "boolean": _boolean, "log-bias": _log_bias,
                           "scale": _scale}


# --- geometry: distances from the model's boolean mask ----------------------------------


def mask_geometry(visible: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Distances and row spans over real tokens, read from the model's own boolean mask.

    Args:
        visible: [b, 1, q, k] bool, True where query q may attend key k (causal and
            padding already applied); queries are the last q of the k positions.
        mode: "relative" (each row from its own position) or "keys" (every row from the
            sequence's last real token, as one 1-D key mask).

    Returns:
        dist [b, 1, q, k] float (|query - key| in real tokens) and span [b, 1, q, 1] float
        (the largest distance the row sees).
    """
    b, _, q_len, k_len = visible.shape
    real = visible.any(dim=-2).any(dim=1)  # [b, k]: keys some query sees are real tokens
    key_pos = real.cumsum(-1).float() - 1  # [b, k] index among real tokens
    if mode == "keys":
        last = real.sum(-1, keepdim=True).float() - 1  # [b, 1] newest real token
        dist = (last - key_pos)[:, None, None, :].expand(b, 1, q_len, k_len)  # [b,1,q,k]
        span = last[:, None, None, :].expand(b, 1, q_len, 1)  # [b,1,q,1]
        return dist, span
    query_pos = key_pos[:, k_len - q_len:]  # [b, q]
    dist = (query_pos[:, :, None] - key_pos[:, None, :]).abs()[:, None]  # [b,1,q,k]
    span = dist.masked_fill(~visible, 0).amax(-1, keepdim=True)  # [b,1,q,1]
    return dist, span


def as_visible(attention_mask, module, query, key) -> torch.Tensor:
    """The model's mask as bool [b, 1, q, k] (True = may attend)."""
    q_len, k_len = query.shape[2], key.shape[2]
    if attention_mask is None:
        causal = getattr(module, "is_causal", False)
        full = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device)
        vis = full.tril(k_len - q_len) if causal else full
        return vis.expand(query.shape[0], 1, q_len, k_len)
    if attention_mask.dtype == torch.bool:
        return attention_mask[:, :1]
    return attention_mask[:, :1] == 0  # an additive float mask: 0 where visible


def masked_attention_forward(module, query, key, value, attention_mask, scaling=None,
                             dropout=0.0, *, weights: Weights, probs: Probs, mode: str,
                             **kwargs):
    """Attention with mask weights m(q, k) under `semantics` (the AttentionInterface signature),
    keeping what else the layer's attention does: its scaling, `softcap`, and sink logits `s_aux`
    (a column every query sees with weight 1, dropped after the softmax); its sliding window or
    chunks come in its own mask.

    query [b, h, q, d], key/value [b, h_kv, k, d]; returns (output [b, q, h, d], probs [b, h, q, k]).
    """
    heads = query.shape[1]
    groups = heads // key.shape[1]  # grouped-query attention: kv heads serve `groups` heads
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)  # [b, h, k, d]
        value = value.repeat_interleave(groups, dim=1)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    # fp32 logits: legacy's (1 - m) * min must not meet bf16 rounding
    scores = (query.float() @ key.float().transpose(-1, -2)) * scaling  # [b, h, q, k]
    if kwargs.get("softcap") is not None:  # the layer's own logit soft-capping (Gemma 2)
        cap = kwargs["softcap"]
        scores = torch.tanh(scores / cap) * cap
    visible = as_visible(attention_mask, module, query, key)  # [b, 1, q, k]
    dist, span = mask_geometry(visible, mode)
    m = weights(dist, span, heads).float()  # [b, h|1, q, k]
    sink = kwargs.get("s_aux")  # gpt-oss's learned sink logit per head: a column of weight 1
    if sink is not None:
        b, _, q_len, k_len = scores.shape
        scores = torch.cat([scores, sink.float().view(1, heads, 1, 1).expand(b, heads, q_len, 1)], -1)
        visible = torch.cat([visible, visible.new_ones(b, 1, q_len, 1)], -1)
        m = torch.cat([m.expand(b, -1, q_len, k_len), m.new_ones(b, m.shape[1], q_len, 1)], -1)
    p = probs(scores, visible, m, torch.finfo(query.dtype).min)
    if sink is not None:
        p = p[..., :-1]  # the sink weighs, and is dropped: it has no value
    p = torch.nn.functional.dropout(p, p=dropout, training=module.training)
    out = p.to(value.dtype) @ value  # [b, h, q, d]
    return out.transpose(1, 2).contiguous(), p


def boolean_mask_factory(*args, **kwargs):
    """Always the materialised boolean mask (never None), so the attention sees padding."""
    from transformers.masking_utils import sdpa_mask

    kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    return sdpa_mask(*args, **kwargs)


def registered(name: str, weights: Weights, semantics: str, mode: str) -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    # An AttentionInterface instance is a mapping over every registered function (the
    # class-wide ones included): `in` is its public membership test.
    if name not in AttentionInterface():
        fn = functools.partial(masked_attention_forward, weights=weights,
                               probs=PROBS[semantics], mode=mode)
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, boolean_mask_factory)
    return name
