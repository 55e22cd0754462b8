"""What checkpoints pecli trained (pecli.measures.training) need to load again.

Their config.json names an attention function pecli registers in transformers'
`AttentionInterface` (`alibi`: ALiBi through pecli.models.attention; `t5`: T5's relative bias,
Raffel et al. 2020, a learned scalar per head and distance bucket added to the logits). This
module registers both on import, and pecli.models.loading imports it before loading a
checkpoint whose config says `pecli_position`: a new process loads them without importing the
training code. A `t5` checkpoint also gets its bias tables back (`after_load`), as
transformers' GPT-2 does not build or read them.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from pecli.models.attention import (
    alibi_weights,
    as_visible,
    attention_key,
    boolean_mask_factory,
    registered,
)

T5_BUCKETS, T5_MAX_DISTANCE = 32, 128  # T5's defaults


def alibi_attention_name() -> str:
    """The registered attention implementation that gives ALiBi (the `alibi` mask shape of
    pecli.positions.masks, log-bias semantics, relative mode: logits - slope_h * (q - k)),
    under the very name `--mask alibi --mask-semantics log-bias` registers; registers it."""
    return registered(attention_key("alibi", "log-bias", "relative"), alibi_weights, "log-bias",
                      "relative")


ALIBI_ATTENTION = alibi_attention_name()  # registered on import, so alibi checkpoints reload


def t5_buckets(q_len: int, k_len: int) -> torch.Tensor:
    """T5's unidirectional bucket of every (query, key) pair, queries the last q_len of k_len
    positions: transformers' `T5Attention._relative_position_bucket(key - query)`. [q, k]."""
    from transformers.models.t5.modeling_t5 import T5Attention

    query = torch.arange(k_len - q_len, k_len)[:, None]
    key = torch.arange(k_len)[None, :]
    return T5Attention._relative_position_bucket(key - query, bidirectional=False,
                                                 num_buckets=T5_BUCKETS,
                                                 max_distance=T5_MAX_DISTANCE)


def t5_bias_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      **kwargs):
    """Softmax attention with `module.relative_bias` (T5's bias) added to the logits, under
    the model's boolean mask (the AttentionInterface signature: q [b, h, q, d], k/v
    [b, h, k, d]; returns (output [b, q, h, d], probabilities [b, h, q, k]))."""
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    scores = (query @ key.transpose(-1, -2)) * scaling  # [b, h, q, k]
    buckets = t5_buckets(query.shape[2], key.shape[2]).to(query.device)  # [q, k]
    scores = scores + module.relative_bias(buckets).permute(2, 0, 1)[None]  # [1, h, q, k]
    visible = as_visible(attention_mask, module, query, key)  # [b, 1, q, k]
    probs = torch.softmax(scores.masked_fill(~visible, -math.inf), dim=-1)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    return (probs @ value).transpose(1, 2).contiguous(), probs


def t5_attention_name() -> str:
    """Register (once) and return the attention implementation of the `t5` scheme."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    name = "pecli_t5_relative_bias"
    if name not in AttentionInterface():
        AttentionInterface.register(name, t5_bias_attention)
        AttentionMaskInterface.register(name, boolean_mask_factory)
    return name


T5_ATTENTION = t5_attention_name()  # registered on import, so t5 checkpoints reload
ATTENTION = {"alibi": ALIBI_ATTENTION, "t5": T5_ATTENTION}  # schemes with their own attention


def attach_relative_bias(model) -> None:
    """Give every attention layer of a GPT-2 its T5 bias table (zeros: no preference at first)."""
    for block in model.transformer.h:
        block.attn.relative_bias = torch.nn.Embedding(T5_BUCKETS, model.config.n_head)
        torch.nn.init.zeros_(block.attn.relative_bias.weight)


def after_load(model, path: Path) -> None:
    """Complete a pecli-trained checkpoint that transformers loaded (pecli.models.loading
    calls this): a `t5` model gets its relative-bias tables back from the weights
    file, which transformers' GPT-2 does not read."""
    if getattr(model.config, "pecli_position", None) != "t5":
        return
    from safetensors.torch import load_file

    attach_relative_bias(model)
    weights = load_file(Path(path) / "model.safetensors")
    for i, block in enumerate(model.transformer.h):
        block.attn.relative_bias.weight.data.copy_(weights[f"transformer.h.{i}.attn.relative_bias.weight"])
