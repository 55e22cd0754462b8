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

    Tokens come out in row-major (b, t) order of the True entries of `mask`. Computed in
    float64; a zero vector has cosine 0 with anything (eps 1e-12 in the norms).
    """
    if h_ref.shape != h_int.shape or h_ref.shape[:2] != mask.shape:
        raise ValueError(f"shapes differ: {tuple(h_ref.shape)}, {tuple(h_int.shape)}, mask {tuple(mask.shape)}")
    keep = mask.bool()
    a = h_ref[keep].double()  # [n, d]
    b = h_int[keep].double()  # [n, d]
    return torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-12)  # [n]


def cosine_by_layer(h_ref: torch.Tensor, h_int: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """token_cosine at every layer: h_ref[l, b, t, d], h_int[l, b, t, d], mask[b, t] -> [l, n]."""
    keep = mask.bool()
    a = h_ref[:, keep].double()  # [l, n, d]
    b = h_int[:, keep].double()  # [l, n, d]
    return torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-12)  # [l, n]


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
