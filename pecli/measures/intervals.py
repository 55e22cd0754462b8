"""Bootstrap intervals over texts: the one way pecli puts an interval on a headline number.

Texts, not tokens, are resampled: the tokens of one text are correlated, so a token-level
bootstrap would give intervals that are too narrow. Every statistic pecli reports is a ratio
of per-text sums (a token-weighted mean cosine, a corpus NLL, an accuracy: sum / count), or a
plain mean of per-text values, so one function covers them all:

    low, high = ratio_interval(numerators, denominators, n_boot=1000, seed=0)
    low, high = ratio_interval(nll_sums, token_counts, transform=np.exp)   # corpus perplexity
    low, high = statistic_interval(per_text_values, np.median)             # any other statistic

Deterministic for a seed; `n_boot=0` turns intervals off (NaN bounds).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

LEVEL = 0.95
METHOD = ("95 % percentile bootstrap over texts (texts resampled with replacement, "
          "statistic recomputed per resample)")

_CHUNK_ELEMENTS = 4_000_000  # resample indices held at once: bounded memory for 25k texts


def ratio_interval(numerators, denominators=None, n_boot: int = 1000, seed: int = 0,
                   level: float = LEVEL, transform: Callable[[np.ndarray], np.ndarray] | None = None
                   ) -> tuple[float, float]:
    """Percentile bootstrap interval of transform(sum(num[S]) / sum(den[S])) over resamples S.

    Args:
        numerators: one value per text (e.g. the sum of its token cosines, its NLL sum, 1/0
            for a correct item).
        denominators: one count per text (its tokens); None means 1 per text (a plain mean).
        n_boot: resamples; 0 gives (nan, nan).
        seed: the resamples depend on it alone (and on the number of texts).
        level: coverage of the interval.
        transform: applied to each resampled ratio (np.exp for a perplexity).

    Returns:
        (low, high); (nan, nan) when there are no texts or n_boot is 0. Resamples whose
        denominator is 0 are dropped.
    """
    num = np.asarray(numerators, dtype=np.float64).ravel()
    den = np.ones_like(num) if denominators is None else np.asarray(denominators, np.float64).ravel()
    if num.shape != den.shape:
        raise ValueError(f"numerators {num.shape} and denominators {den.shape} differ")
    if num.size == 0 or n_boot <= 0:
        return float("nan"), float("nan")
    stats = np.empty(n_boot)
    for start, idx in _resamples(num.size, n_boot, seed):
        with np.errstate(invalid="ignore", divide="ignore"):
            stats[start:start + len(idx)] = num[idx].sum(1) / den[idx].sum(1)
    return _percentiles(stats, level, transform)


def statistic_interval(values, statistic: Callable[..., np.ndarray], n_boot: int = 1000,
                       seed: int = 0, level: float = LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval of any statistic of one value per text (e.g. np.median).

    `statistic(resampled, axis=1)` gets a [resamples, texts] array and returns [resamples];
    the resamples are the same as ratio_interval's for the same seed and number of texts.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0 or n_boot <= 0:
        return float("nan"), float("nan")
    stats = np.empty(n_boot)
    for start, idx in _resamples(v.size, n_boot, seed):
        stats[start:start + len(idx)] = statistic(v[idx], axis=1)
    return _percentiles(stats, level)


def _resamples(n: int, n_boot: int, seed: int):
    """(first resample, idx[m, n]) chunks of n_boot resamples of n texts, seeded."""
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, n_boot, chunk):
        yield start, rng.integers(0, n, size=(min(chunk, n_boot - start), n))


def _percentiles(stats: np.ndarray, level: float, transform=None) -> tuple[float, float]:
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        return float("nan"), float("nan")
    if transform is not None:
        with np.errstate(over="ignore"):
            stats = transform(stats)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(stats, [tail, 100 - tail])
    return float(low), float(high)


def mean_interval(values, n_boot: int = 1000, seed: int = 0, level: float = LEVEL
                  ) -> tuple[float, float]:
    """Interval of the plain mean of one value per text (a mean of per-text perplexities)."""
    return ratio_interval(values, None, n_boot=n_boot, seed=seed, level=level)


def by_text(values, text, texts: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-text (sums[texts], counts[texts]) of token values whose text index is text[n]."""
    text = np.asarray(text, dtype=np.int64).ravel()
    sums = np.bincount(text, weights=np.asarray(values, np.float64).ravel(), minlength=texts)
    return sums, np.bincount(text, minlength=texts).astype(np.float64)
