"""Metrics as pure functions: tensors / arrays in, numbers out. No models, no files.

Shapes use b = batch, t = tokens, d = width, l = layers, n = selected tokens.
A `mask[b, t]` is 1 (or True) for tokens that count and 0 for padding.
"""

from __future__ import annotations

import numpy as np
import torch

# --- cosine similarity of features (E1, E2) ----------------------------------------


def token_cosine(h_ref: torch.Tensor, h_int: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cosine similarity per counted token: h_ref[b, t, d], h_int[b, t, d], mask[b, t] -> [n].

    Tokens come out in row-major (b, t) order of the True entries of `mask`. A zero vector
    has cosine 0 with anything. See `cosine_by_layer` for the precision.
    """
    if h_ref.shape != h_int.shape or h_ref.shape[:2] != mask.shape:
        raise ValueError(f"shapes differ: {tuple(h_ref.shape)}, {tuple(h_int.shape)}, mask {tuple(mask.shape)}")
    return cosine_by_layer([h_ref], [h_int], mask)[0]


def cosine_by_layer(h_ref, h_int, mask: torch.Tensor) -> torch.Tensor:
    """token_cosine at every layer: h_ref, h_int [l, b, t, d] (or sequences of l [b, t, d],
    e.g. a model's `hidden_states`, never stacked), mask[b, t] -> [l, n] float64.

    The three dot products per token are reduced in the features' dtype (float32: relative
    error about 1e-7) and combined in float64, a few times faster than casting the features
    to float64 first; they run on the padded [b, t, d] tensors and only their [b, t] results
    are selected (no copies of the features: twice as fast, the same numbers). Identical
    vectors give exactly 1.
    """
    keep = mask.bool()
    out = []
    for a, b in zip(h_ref, h_int, strict=True):  # one layer at a time: no [l, n, d] copies
        dot = torch.linalg.vecdot(a, b)[keep].double()  # [n]
        norms = (torch.linalg.vecdot(a, a)[keep].double() * torch.linalg.vecdot(b, b)[keep].double()).sqrt()
        out.append(dot / norms.clamp_min(1e-24))
    return torch.stack(out)  # [l, n]


def summarize(values) -> dict[str, float]:
    """mean, std (population, ddof=0), median and count of a 1-D array of values."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        return {"mean": float("nan"), "std": float("nan"), "median": float("nan"), "count": 0}
    return {"mean": float(v.mean()), "std": float(v.std()), "median": float(np.median(v)),
            "count": int(v.size)}


def mean_by_index(values, index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group values[n] by integer index[n]: (sorted distinct indices[k], means[k], counts[k])."""
    v = np.asarray(values, dtype=np.float64).ravel()
    idx = np.asarray(index, dtype=np.int64).ravel()
    keys, inverse, counts = np.unique(idx, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=v, minlength=len(keys))
    return keys, sums / counts, counts


# --- is a cosine high? the random baseline -------------------------------------------


def random_pair_cosines(dim: int, pairs: int, seed: int = 0) -> np.ndarray:
    """Cosine of `pairs` independent pairs of standard-normal vectors in R^dim -> [pairs].

    Their directions are uniform on the sphere: mean 0, std about 1/sqrt(dim).
    """
    if dim < 1 or pairs < 2:
        raise ValueError("need dim >= 1 and at least 2 pairs")
    rng = np.random.default_rng(seed)
    out = np.empty(pairs)
    chunk = max(1, 2_000_000 // dim)  # bounded memory for wide models / many pairs
    for start in range(0, pairs, chunk):
        m = min(chunk, pairs - start)
        a = rng.standard_normal((m, dim))  # [m, dim]
        b = rng.standard_normal((m, dim))  # [m, dim]
        out[start:start + m] = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return out


def z_score(observed: float, reference) -> float:
    """(observed - mean) / std of the reference sample (std with ddof=1)."""
    r = np.asarray(reference, dtype=np.float64)
    return float((observed - r.mean()) / r.std(ddof=1))


def percentile_of(observed: float, reference) -> float:
    """Empirical percentile (0-100) of `observed` in the reference: % of values strictly below,
    plus half of those equal."""
    r = np.asarray(reference, dtype=np.float64)
    return float(100.0 * ((r < observed).sum() + 0.5 * (r == observed).sum()) / r.size)


def histogram(values, bins: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """(counts[bins], edges[bins + 1]) of values over their own range."""
    return np.histogram(np.asarray(values, dtype=np.float64), bins=bins)


# --- perplexity (another section; add below) ----------------------------------------

# Token negative log-likelihoods and the ways to average them (study E2), natural logs.
# The four aggregations differ a lot on the same NLLs (the last two are dominated by
# outliers), so every table names the one it reports:
#   corpus          exp(token-weighted mean NLL over all texts)
#   mean_per_text   mean over texts of exp(mean NLL of the text): `evaluate`'s
#                   `mean_perplexity` (huggingface/evaluate, measurements/perplexity)
#   median_per_text median of the same per-text perplexities
#   mean_per_token  mean over all tokens of exp(NLL)

AGGREGATIONS = ("corpus", "mean_per_text", "median_per_text", "mean_per_token")


def target_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """NLL of each target under its own logits.

    Args:
        logits: [n, vocab] (any float dtype; computed in fp32).
        targets: [n] token ids.

    Returns:
        [n] fp32 NLL, natural log.
    """
    return torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")


HEAD_CHUNK = 256  # scored rows per LM-head matmul at most: [256, vocab] logits at a time
HEAD_LOGITS = 1 << 26  # and at most this many logits (256 MiB of fp32): 256 rows of Gemma's 262k
# (64 rows read the 670 MB head 4x as often: 1.73x against 1.61x the forward without logits at
# 8,192 tokens, peak memory 0.97x against 1.10x; benchmarks/bench_vocab.py)


def head_nll(model, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """NLL [n] of targets[n] from the final hidden states hidden[n, d] (after the final norm:
    a base model's last_hidden_state), through the LM head a chunk of rows at a time, so that
    a 262k vocabulary's logits never exist whole; Gemma's final_logit_softcapping
    (cap * tanh(logits / cap)) applied where the config has it."""
    head = model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)
    step = max(1, min(HEAD_CHUNK, HEAD_LOGITS // head.weight.shape[0]))

    def nll(rows: slice) -> torch.Tensor:
        logits = head(hidden[rows])
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return target_nll(logits, targets[rows])

    return torch.cat([nll(slice(i, i + step)) for i in range(0, len(hidden), step)]
                     or [torch.zeros(0, device=hidden.device)])


def token_nll(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """NLL of every next token of a padded batch, labels shifted by one.

    Position t of the result is the NLL of input_ids[:, t + 1] given logits[:, t]; it is 0
    wherever the target is padding (mask[:, t + 1] == 0), which is also what `evaluate` does
    (it multiplies the per-token loss by the shifted attention mask).

    Args:
        logits: [b, t, vocab].
        input_ids: [b, t] (the labels are the inputs themselves).
        mask: [b, t] 1 for real tokens, 0 for padding.

    Returns:
        [b, t - 1] fp32 NLL, zero at padded targets.
    """
    shift_logits = logits[:, :-1]  # [b, t-1, v]: position t predicts token t+1
    labels, keep = input_ids[:, 1:], mask[:, 1:].to(torch.float32)  # [b, t-1]
    nll = target_nll(shift_logits.reshape(-1, shift_logits.shape[-1]), labels.reshape(-1))
    return nll.view_as(keep) * keep


def per_text_perplexity(nll: torch.Tensor) -> float:
    """exp(mean NLL) of one text's scored tokens ([n]); NaN for a text with no scored token."""
    return float(nll.double().mean().exp()) if nll.numel() else float("nan")


def aggregate(nlls: list[torch.Tensor]) -> dict[str, float]:
    """The four aggregations (see the comment above AGGREGATIONS) of per-text NLLs.

    Args:
        nlls: one [n_i] tensor of token NLLs per text (n_i may be 0: such a text is left
            out of the per-text aggregations, as it has no perplexity).

    Returns:
        {aggregation: value} for every name in AGGREGATIONS.
    """
    scored = [x.double() for x in nlls if x.numel()]
    if not scored:
        return dict.fromkeys(AGGREGATIONS, float("nan"))
    tokens = torch.cat(scored)  # [N]
    texts = torch.stack([x.mean() for x in scored]).exp()  # [texts]
    return {
        "corpus": tokens.mean().exp().item(),
        "mean_per_text": texts.mean().item(),
        "median_per_text": texts.quantile(0.5).item(),  # the middle pair's mean when even
        "mean_per_token": tokens.exp().mean().item(),
    }
