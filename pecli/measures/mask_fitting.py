"""Fitting a mask to stand in for positions (the study's open question 2), and the language
modelling loss both `pecli mask fit` and `pecli finetune` train on.

`fit` freezes a causal LM, removes its positions (an intervention, `zero` by default), and
fits the few parameters of one mask form (pecli.runs.names.MASK_FORMS) by gradient descent on
the mean next-token NLL of training texts, through the model's own attention layers: the mask
is an attention function in transformers' registry (pecli.positions.masks.live_attention)
whose weights are recomputed from the parameters on every call, read as log-bias (an additive
bias on the logits, renormalised by the softmax).

`gap_closed` is the share of the gap between the model without positions and the intact
model that a condition closes, in log perplexity (corpus NLL per token):

    (NLL_zero - NLL_condition) / (NLL_zero - NLL_intact)

1 = as good as intact, 0 = no better than positions removed, negative = worse.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from pecli.positions.conditions import plan
from pecli.positions.masks import FittedMask, bucket_edges, form_bias, live_attention
from pecli.runs.batching import pad

PER_HEAD = ("bucket-head", "slope", "linear")
SLOPE_START, OLDEST_START = 0.01, 0.1  # slope: nearly the default mask; linear: the study's 0.1


def lm_loss(model, seqs: list[list[int]], pad_id: int, device) -> torch.Tensor:
    """Mean next-token NLL over the real tokens of `seqs` (right padding, positions counted
    over real tokens): what fitting and fine-tuning minimise."""
    from torch.utils.checkpoint import checkpoint

    from pecli.measures.metrics import HEAD_CHUNK, head_nll

    ids, mask = pad(seqs, pad_id, device, "right")  # [b, t]
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    hidden = model.base_model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                              use_cache=False).last_hidden_state  # [b, t, d]
    real = mask[:, 1:] != 0  # [b, t-1]: real targets
    picked, target = hidden[:, :-1][real], ids[:, 1:][real]  # [n, d], [n]
    # the head's logits in chunks, recomputed in the backward pass rather than kept: never
    # [n, vocab] at once (Gemma's 262k vocabulary)
    total = sum(checkpoint(lambda h, t: head_nll(model, h, t).sum(), picked[i:i + HEAD_CHUNK],
                           target[i:i + HEAD_CHUNK], use_reentrant=False)
                for i in range(0, len(picked), HEAD_CHUNK))
    return total / len(picked)


def sequences(tokenizer, texts: list[str], max_length: int, bos: int | None) -> list[list[int]]:
    """Token ids per text (no special tokens, as evaluation tokenises), `bos` prepended,
    truncated to `max_length`; texts with fewer than 2 tokens are left out."""
    from pecli.runs.batching import encode

    ids = encode(tokenizer, texts, max_length=10**12, add_special_tokens=False).ids
    out = [(([bos] if bos is not None else []) + list(x))[:max_length] for x in ids]
    return [x for x in out if len(x) >= 2]


def batch_order(n: int, steps: int, batch: int, seed: int) -> list[list[int]]:
    """Which texts each step trains on: seeded epochs of a permutation, `batch` per step."""
    gen = torch.Generator().manual_seed(seed)
    order: list[int] = []
    while len(order) < steps * batch:
        order += torch.randperm(n, generator=gen).tolist()
    return [order[i * batch:(i + 1) * batch] for i in range(steps)]


def initial(form: str, heads: int, max_length: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The unconstrained parameters a fit starts from, and the buckets of a bucket form."""
    rows = heads if form in PER_HEAD else 1
    if form in ("bucket", "bucket-head"):
        edges = bucket_edges(max_length - 1)
        return torch.zeros(rows, len(edges)), edges  # the default mask
    if form == "slope":
        return torch.full((rows, 1), math.log(math.expm1(SLOPE_START))), ()  # softplus^-1
    return torch.full((rows, 1), math.log(OLDEST_START / (1 - OLDEST_START))), ()  # logit


def constrained(form: str, raw: torch.Tensor) -> torch.Tensor:
    """Parameters as form_bias reads them: slopes >= 0 (softplus), oldest weights in (0, 1)
    (sigmoid), bucket biases as they are."""
    if form == "slope":
        return torch.nn.functional.softplus(raw)
    if form == "linear":
        return torch.sigmoid(raw)
    return raw


def fit(loaded, form: str, seqs: list[list[int]], *, steps: int, lr: float, batch: int,
        seed: int, intervention: str = "zero",
        progress: Callable[[int, float], None] | None = None) -> tuple[FittedMask, list[float]]:
    """Fit a mask of `form` on `seqs` with the model frozen and `intervention` applied.

    Adam on the unconstrained parameters, `steps` steps of `batch` texts (seeded order);
    deterministic for a seed on CPU. Returns the mask and the training loss of every step.
    """
    model = loaded.model
    heads = model.config.num_attention_heads
    max_length = max(map(len, seqs))
    raw, edges = initial(form, heads, max_length)
    raw = raw.to(loaded.device).requires_grad_(True)

    def weights(dist, span, h):
        return torch.exp(form_bias(form, constrained(form, raw), dist, span, edges))

    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    was_training = model.training
    model.eval()
    torch.manual_seed(seed)
    opt = torch.optim.Adam([raw], lr=lr)
    history = []
    pad_id = loaded.tokenizer.pad_token_id
    try:
        with plan(intervention=intervention).applied(loaded, seed), live_attention(model, weights, "log-bias"):
            for step, idx in enumerate(batch_order(len(seqs), steps, batch, seed)):
                loss = lm_loss(model, [seqs[i] for i in idx], pad_id, loaded.device)
                opt.zero_grad()
                loss.backward()
                opt.step()
                history.append(loss.item())
                if progress:
                    progress(step + 1, history[-1])
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
        model.train(was_training)
    values = constrained(form, raw.detach()).cpu()
    return FittedMask(form, tuple(tuple(r) for r in values.tolist()), heads, edges), history


def gap_closed(nll_zero: float, nll_condition: float, nll_intact: float) -> float:
    """(NLL_zero - NLL_condition) / (NLL_zero - NLL_intact): the share of the gap in log
    perplexity between positions removed and the intact model that a condition closes; NaN
    (undefined) where there is no gap: positions removed are not worse than intact."""
    if not nll_zero - nll_intact > 0:
        return math.nan
    return (nll_zero - nll_condition) / (nll_zero - nll_intact)


def gap_interval(sums: dict[str, np.ndarray], counts: np.ndarray, condition: str,
                 n_boot: int, seed: int) -> tuple[float, float]:
    """95 % bootstrap interval of gap_closed over texts: each resample draws the same texts
    for the three conditions (`sums`: per-text NLL sums of zero, intact and `condition`)."""
    from pecli.measures.intervals import percentile_interval, resampled

    def statistic(c: np.ndarray) -> np.ndarray:  # c [m, texts]: how often each text was drawn
        n = c @ counts
        z, i, x = (c @ sums[k] / n for k in ("zero", "intact", condition))
        return (z - x) / (z - i)

    return percentile_interval(resampled(statistic, len(counts), n_boot, seed))
