"""Bootstrap intervals over texts: the one way pecli puts an interval on a headline number.

Texts, not tokens, are resampled: the tokens of one text are correlated, so a token-level
bootstrap would give intervals that are too narrow. Every statistic pecli reports is a ratio
of per-text sums (a token-weighted mean cosine, a corpus NLL, an accuracy: sum / count), or a
plain mean of per-text values, so one function covers them all:

    low, high = ratio_interval(numerators, denominators, n_boot=1000, seed=0)
    low, high = ratio_interval(nll_sums, token_counts, transform=np.exp)   # corpus perplexity
    low, high = statistic_interval(per_text_values, np.median)             # any other statistic

Statistics of pairs of tokens from two texts (the in-model baselines) resample texts too:
a pair counts as often as both its texts are drawn (`pair_interval`, `resampled`).

Independent trials with a right-or-wrong outcome (passkey retrieval) get the Wilson score
interval instead (`wilson`): exact where a bootstrap of all-right trials would give [1, 1];
two conditions on the same trials, Newcombe's paired interval (`paired_proportion_difference`).
Every accuracy (a mean of one score per unit) takes that choice in one place,
`accuracy_interval` (Wilson where each unit is right or wrong, `answers`; a bootstrap
otherwise), and every difference of plain means over shared units in another,
`paired_mean_difference` (behind `diff_columns`: Newcombe, or a paired bootstrap). Probes,
multiple choice, RULER, toy tasks and lm-eval's per-document values go through them
(`document_interval`, `paired_with_intact`).

Means over training seeds get a Student t interval (`t_interval`).

Deterministic for a seed; `n_boot=0` turns intervals off (NaN bounds). The rule every function
here keeps (issue 46): no interval from fewer than MIN_TEXTS distinct units (a bootstrap of one
text, or of texts that all give the same value, cannot vary: NaN bounds, with a warning for too
few texts), and none of zero width (`proper`: a quantity fixed by construction, such as the
intact model's difference from itself or the share of its own gap it closes, gets NaN bounds,
not [x, x]). `--bootstrap` is 0 or MIN_RESAMPLES..MAX_RESAMPLES (pecli.runs.fields checks it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from pecli.runs.fields import MAX_RESAMPLES, MIN_RESAMPLES

LEVEL = 0.95
METHOD = ("95 % percentile bootstrap over texts (texts resampled with replacement, "
          "statistic recomputed per resample)")

_CHUNK_ELEMENTS = 4_000_000  # resample indices held at once: bounded memory for 25k texts
MIN_TEXTS = 2  # fewer texts give no interval
MIN_WINDOWS = 10  # windows of long documents: fewer give none (the table shows how many)
_ZERO_WIDTH = 1e-9  # relative: a width below it is rounding, not variation
__all__ = ["MAX_RESAMPLES", "MIN_RESAMPLES", "MIN_TEXTS", "pair_interval", "ratio_interval",
           "resampled", "statistic_interval", "wilson", "mean_interval", "accuracy_interval",
           "accuracy_method", "answers", "by_text", "percentile_interval",
           "proper", "t_interval", "MIN_WINDOWS", "seeds_and_texts_interval", "paired_difference", "diff_columns", "DIFF_COLUMNS",
           "DEFAULT_DIFF_COLUMNS",
           "verdict", "NO_DIFFERENCE", "paired_proportion_difference", "PAIRED_PROPORTION_METHOD",
           "independent_proportion_difference", "independent_mean_difference",
           "paired_mean_difference", "PAIRED_MEAN_METHOD", "difference_method"]


def proper(low: float, high: float) -> tuple[float, float]:
    """(low, high), or NaN bounds where they are not an interval: NaN, or of zero width (every
    unit gave the same value: the statistic did not vary, so nothing says how far it could)."""
    low, high = float(low), float(high)
    if not (np.isfinite(low) and np.isfinite(high)):
        return float("nan"), float("nan")
    if high - low <= _ZERO_WIDTH * max(abs(low), abs(high), 1e-300):
        return float("nan"), float("nan")
    return low, high


NO_DIFFERENCE = "no detectable difference"


def verdict(low: float, high: float, up: str, down: str, none: str = f"shows {NO_DIFFERENCE}",
            null: float = 0.0) -> str:
    """The words an interval licenses (REPORT's findings): `up` ("rises", "beats") only where
    the whole interval lies above `null` (0 for a difference; chance for an accuracy), `down`
    only where it lies below, `none` (which says NO_DIFFERENCE) otherwise, no interval included."""
    low, high = proper(low, high)
    if low == low and low > null:
        return up
    if high == high and high < null:
        return down
    return none


def _enough(texts: int, n_boot: int, least: int = MIN_TEXTS) -> bool:
    """Whether an interval can mean anything; warns once when texts are too few (units that
    must number `least`, such as windows, say so in their table: no warning)."""
    if n_boot <= 0:
        return False
    if texts < least:
        if least == MIN_TEXTS:
            warnings.warn(f"{texts} text(s): no 95 % interval from fewer than {MIN_TEXTS} texts "
                          "(ci_low, ci_high are NaN); evaluate more texts", stacklevel=1)
        return False
    return n_boot >= MIN_RESAMPLES


def ratio_interval(numerators, denominators=None, n_boot: int = 1000, seed: int = 0,
                   level: float = LEVEL, transform: Callable[[np.ndarray], np.ndarray] | None = None,
                   least: int = MIN_TEXTS) -> tuple[float, float]:
    """Percentile bootstrap interval of transform(sum(num[S]) / sum(den[S])) over resamples S.

    Args:
        numerators: one value per text (e.g. the sum of its token cosines, its NLL sum, 1/0
            for a correct item).
        denominators: one count per text (its tokens); None means 1 per text (a plain mean).
        n_boot: resamples; 0 gives (nan, nan).
        seed: the resamples depend on it alone (and on the number of texts).
        level: coverage of the interval.
        transform: applied to each resampled ratio (np.exp for a perplexity).
        least: the fewest units that give an interval (MIN_WINDOWS for windows of a long
            document: a handful of them cannot say how the next would score).

    Returns:
        (low, high); (nan, nan) when there are no texts or n_boot is 0. Resamples whose
        denominator is 0 are dropped.
    """
    num = np.asarray(numerators, dtype=np.float64).ravel()
    den = np.ones_like(num) if denominators is None else np.asarray(denominators, np.float64).ravel()
    if num.shape != den.shape:
        raise ValueError(f"numerators {num.shape} and denominators {den.shape} differ")
    if not _enough(num.size, n_boot, least):
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
    if not _enough(v.size, n_boot):
        return float("nan"), float("nan")
    stats = np.empty(n_boot)
    for start, idx in _resamples(v.size, n_boot, seed):
        stats[start:start + len(idx)] = statistic(v[idx], axis=1)
    return _percentiles(stats, level)


def resampled(statistic: Callable[[np.ndarray], np.ndarray], texts: int, n_boot: int = 1000,
              seed: int = 0, least: int = MIN_TEXTS) -> np.ndarray | None:
    """`statistic(counts)` on every resample of `texts` texts: counts[m, texts] says how often
    each text was drawn (the same resamples as ratio_interval's for the same seed), and the
    statistic returns [m]. None when no interval can be given (see MIN_TEXTS)."""
    if not _enough(texts, n_boot, least):
        return None
    stats = np.empty(n_boot)
    for start, idx in _resamples(texts, n_boot, seed):
        m = len(idx)
        counts = np.bincount((idx + texts * np.arange(m)[:, None]).ravel(), minlength=m * texts)
        with np.errstate(invalid="ignore", divide="ignore"):
            stats[start:start + m] = statistic(counts.reshape(m, texts).astype(np.float64))
    return stats


def pair_weighted_mean(values, text_a, text_b):
    """The statistic of a mean over pairs of tokens from texts (a, b), for `resampled`: a pair
    counts as often as both its texts were drawn, counts[:, a] * counts[:, b]."""
    v = np.asarray(values, np.float64)

    def mean(counts: np.ndarray) -> np.ndarray:
        w = counts[:, text_a] * counts[:, text_b]  # [m, pairs]
        return (w @ v) / w.sum(1)
    return mean


def pair_interval(values, text_a, text_b, texts: int, n_boot: int = 1000, seed: int = 0,
                  level: float = LEVEL) -> tuple[float, float]:
    """Interval of the mean of pair values (one per pair of tokens from texts a and b),
    texts resampled."""
    stats = resampled(pair_weighted_mean(values, text_a, text_b), texts, n_boot, seed)
    return percentile_interval(stats, level)


DIFF_COLUMNS = ("diff_vs_intact", "diff_ci_low", "diff_ci_high")
# pecli tune's best setting against the papers' recommended one, paired the same way
DEFAULT_DIFF_COLUMNS = ("diff_vs_default", "diff_default_ci_low", "diff_default_ci_high")
_PAIRED_BOOTSTRAP = ("paired percentile bootstrap over texts: the condition and intact scored on "
                     "the same texts, each resample drawing the same texts for both")
PAIRED_METHOD = f"95 % {_PAIRED_BOOTSTRAP}"
PAIRED_MEAN_METHOD = ("95 % paired interval over texts (paired_mean_difference): Newcombe's score "
                      f"interval where each text's value is right or wrong, else {_PAIRED_BOOTSTRAP}")


def paired_difference(numerators, reference, denominators=None, reference_denominators=None,
                      n_boot: int = 1000, seed: int = 0, level: float = LEVEL,
                      transform: Callable[[np.ndarray], np.ndarray] | None = None,
                      least: int = MIN_TEXTS) -> tuple[float, float, float]:
    """(difference, low, high): transform(sum(num) / sum(den)) minus the same of `reference`,
    both scored on the same texts (one value per text, in the same order), with a percentile
    bootstrap interval that draws the same texts for both on every resample (ratio_interval's
    resamples): sharper than two unpaired intervals, since what the texts share cancels.
    Denominators default to 1 per text (a plain mean); the reference's to the condition's;
    `least` as ratio_interval's."""
    num, ref = (np.asarray(x, np.float64).ravel() for x in (numerators, reference))
    den = np.ones_like(num) if denominators is None else np.asarray(denominators, np.float64).ravel()
    rden = den if reference_denominators is None else np.asarray(reference_denominators, np.float64).ravel()
    if not num.shape == ref.shape == den.shape == rden.shape:
        raise ValueError(f"a paired difference needs the same texts: {num.shape}, {ref.shape}")
    t = transform or (lambda x: x)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        point = float(t(num.sum() / den.sum()) - t(ref.sum() / rden.sum())) if num.size else float("nan")
        stats = resampled(lambda c: t(c @ num / (c @ den)) - t(c @ ref / (c @ rden)), num.size, n_boot,
                          seed, least)
    return (point, *percentile_interval(stats, level))


def paired_mean_difference(values, reference, n_boot: int = 1000, seed: int = 0,
                           least: int = MIN_TEXTS) -> tuple[float, float, float]:
    """(difference, low, high) of two conditions' means over the same units (values[i] and
    reference[i] one unit under both). Where every value is 0 or 1 (an answer right or wrong),
    Newcombe's paired interval (`paired_proportion_difference`): a bootstrap of pairs that all
    changed alike collapses to a point. Otherwise a paired percentile bootstrap
    (`paired_difference`). No bounds with `n_boot` 0 or fewer than `least` units."""
    x, r = (np.asarray(v, np.float64).ravel() for v in (values, reference))
    if x.shape == r.shape and answers(np.concatenate([x, r])):
        point, low, high = paired_proportion_difference(x, r)
        return (point, low, high) if n_boot and x.size >= least else (point, float("nan"), float("nan"))
    return paired_difference(x, r, n_boot=n_boot, seed=seed, least=least)


def diff_columns(*args, reference_row: bool = False, **kwargs) -> dict[str, float]:
    """A table's DIFF_COLUMNS (NaN on the intact row itself): the one way every table that
    scores conditions on shared texts gives each condition's difference from intact. A plain
    mean of one value per unit (two arrays) goes through `paired_mean_difference`, so answers
    right or wrong get Newcombe's interval in every table; ratios and transforms
    (denominators, `transform`) through `paired_difference`."""
    if reference_row:
        return dict.fromkeys(DIFF_COLUMNS, float("nan"))
    ratio = len(args) > 2 or {"denominators", "reference_denominators", "transform"} & set(kwargs)
    difference = paired_difference if ratio else paired_mean_difference
    return dict(zip(DIFF_COLUMNS, difference(*args, **kwargs), strict=True))


def percentile_interval(stats: np.ndarray | None, level: float = LEVEL) -> tuple[float, float]:
    """(low, high) percentiles of resampled statistics; NaN for none."""
    return (float("nan"), float("nan")) if stats is None else _percentiles(stats, level)


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
    return proper(*np.percentile(stats, [tail, 100 - tail]))


def mean_interval(values, n_boot: int = 1000, seed: int = 0, level: float = LEVEL
                  ) -> tuple[float, float]:
    """Interval of the plain mean of one value per text (a mean of per-text perplexities)."""
    return ratio_interval(values, None, n_boot=n_boot, seed=seed, level=level)


def answers(values) -> bool:
    """Whether every value is 0 or 1 (each unit an answer right or wrong), the case in which
    `accuracy_interval` and `paired_mean_difference` use score intervals, not a bootstrap."""
    v = np.asarray(values, np.float64).ravel()
    return bool(v.size) and bool(np.isin(v, (0.0, 1.0)).all())


def accuracy_interval(values, n_boot: int = 1000, seed: int = 0, level: float = LEVEL
                      ) -> tuple[float, float]:
    """Interval of an accuracy, the mean of one score per unit (an answer right or wrong, or a
    partial credit such as MC2's probability or RULER's recall): Wilson's score interval where
    every score is 0 or 1 (`answers`: a bootstrap of answers that all agree collapses to a
    point), else `mean_interval`'s bootstrap over units. For scores only: a rate that happens
    to be 0 on every text (attn's sink rate) is no answer, and keeps `mean_interval`. No bounds
    with `n_boot` 0 or fewer than MIN_TEXTS units; `accuracy_method` names the one taken."""
    v = np.asarray(values, np.float64).ravel()
    if not _enough(v.size, n_boot):
        return float("nan"), float("nan")
    if answers(v):
        return wilson(int(v.sum()), v.size, level)
    return mean_interval(v, n_boot=n_boot, seed=seed, level=level)


def accuracy_method(values, units: str) -> str:
    """The interval `accuracy_interval` gives these scores, in words ("... over {units}")."""
    kind = "Wilson score interval" if answers(values) else "percentile bootstrap"
    return f"{kind} over {units}"


def by_text(values, text, texts: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-text (sums[texts], counts[texts]) of token values whose text index is text[n]."""
    text = np.asarray(text, dtype=np.int64).ravel()
    sums = np.bincount(text, weights=np.asarray(values, np.float64).ravel(), minlength=texts)
    return sums, np.bincount(text, minlength=texts).astype(np.float64)


def wilson(successes: int, trials: int, level: float = LEVEL) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (scipy's); NaN bounds for fewer than
    MIN_TEXTS trials."""
    if trials < MIN_TEXTS:
        return float("nan"), float("nan")
    from scipy.stats import binomtest

    ci = binomtest(successes, trials).proportion_ci(confidence_level=level, method="wilson")
    return proper(ci.low, ci.high)


PAIRED_PROPORTION_METHOD = ("95 % Newcombe (1998, method 10) score interval for a difference of "
                            "paired proportions: the trials paired, each answer right or wrong")


def paired_proportion_difference(right, reference, level: float = LEVEL) -> tuple[float, float, float]:
    """(difference, low, high) of two proportions of right answers on the same trials (right[i]
    and reference[i] one trial under two conditions): Newcombe's (1998) method 10, the Wilson
    interval of each margin combined with the pairs' correlation. It stays an interval where
    a bootstrap cannot (every pair right-wrong gives [1, 1]); NaN bounds for fewer than MIN_TEXTS
    pairs, and NaN for none."""
    x, r = (np.asarray(v, np.float64).ravel() for v in (right, reference))
    if x.shape != r.shape or not np.isin(np.concatenate([x, r]), (0.0, 1.0)).all():
        raise ValueError(f"paired proportions need 0/1 answers on the same trials: {x.shape}, {r.shape}")
    n = x.size
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    both, only_x = float((x * r).sum()), float((x * (1 - r)).sum())
    only_r, neither = float(((1 - x) * r).sum()), float(((1 - x) * (1 - r)).sum())
    p1, p2 = (both + only_x) / n, (both + only_r) / n
    if n < MIN_TEXTS:
        return p1 - p2, float("nan"), float("nan")
    margins = (both + only_x) * (only_r + neither) * (both + only_r) * (only_x + neither)
    cross = both * neither - only_x * only_r  # phi's numerator, continuity-corrected toward 0
    cross = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
    phi = cross / np.sqrt(margins) if margins > 0 else 0.0
    return _newcombe(p1, wilson(round(both + only_x), n, level), p2, wilson(round(both + only_r), n, level), phi)


def _newcombe(p1: float, w1: tuple[float, float], p2: float, w2: tuple[float, float],
              phi: float = 0.0) -> tuple[float, float, float]:
    """(p1 - p2, low, high): Newcombe's (1998) method 10, the two proportions' Wilson intervals
    w1, w2 combined with the correlation phi of paired trials (0 for independent ones)."""
    (l1, u1), (l2, u2) = w1, w2
    low = (p1 - p2) - np.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    high = (p1 - p2) + np.sqrt(max((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2, 0.0))
    return (p1 - p2, *proper(max(low, -1.0), min(high, 1.0)))


def independent_proportion_difference(successes: int, trials: int, reference_successes: int,
                                      reference_trials: int, level: float = LEVEL
                                      ) -> tuple[float, float, float]:
    """(difference, low, high) of two proportions of right answers on independent trials (two
    models' own samples, two lengths' own draws): Newcombe's (1998) method 10 for unpaired
    proportions, each proportion's Wilson interval combined as if the pairs' correlation were 0.
    NaN bounds where either side has fewer than MIN_TEXTS trials."""
    counts = (successes, trials, reference_successes, reference_trials)
    if any(int(c) != c or c < 0 for c in counts) or successes > trials or reference_successes > reference_trials:
        raise ValueError(f"independent proportions need counts with 0 <= right <= trials: {counts}")
    if trials == 0 or reference_trials == 0:
        return float("nan"), float("nan"), float("nan")
    return _newcombe(successes / trials, wilson(int(successes), int(trials), level),
                     reference_successes / reference_trials,
                     wilson(int(reference_successes), int(reference_trials), level))


def difference_method(values, reference, paired: bool) -> str:
    """The interval `paired_mean_difference` (paired) or `independent_mean_difference` gives
    these two sides' values, in words, as `accuracy_method` names `accuracy_interval`'s."""
    if answers(np.concatenate([np.asarray(v, np.float64).ravel() for v in (values, reference)])):
        return (PAIRED_PROPORTION_METHOD.split(":")[0] if paired
                else "95 % Newcombe (1998, method 10) interval for independent proportions")
    return ("95 % paired percentile bootstrap" if paired else
            "95 % percentile bootstrap of independent means, each side's units resampled apart")


def independent_mean_difference(values, reference, n_boot: int = 1000, seed: int = 0,
                                level: float = LEVEL, least: int = MIN_TEXTS) -> tuple[float, float, float]:
    """(difference, low, high) of two means over independent units (two runs' own draws):
    Newcombe's interval for independent proportions where every value is 0 or 1; otherwise
    a percentile bootstrap that resamples each side's units on its own (partial recalls). No
    bounds with `n_boot` 0 or fewer than `least` units on either side."""
    x, r = (np.asarray(v, np.float64).ravel() for v in (values, reference))
    if x.size == 0 or r.size == 0:
        return float("nan"), float("nan"), float("nan")
    point = float(x.mean() - r.mean())
    if not n_boot or min(x.size, r.size) < least:
        return point, float("nan"), float("nan")
    if answers(np.concatenate([x, r])):
        return independent_proportion_difference(int(x.sum()), x.size, int(r.sum()), r.size, level)
    rng = np.random.default_rng(seed)
    stats = (x[rng.integers(0, x.size, (n_boot, x.size))].mean(axis=1)
             - r[rng.integers(0, r.size, (n_boot, r.size))].mean(axis=1))
    return (point, *proper(*percentile_interval(stats, level)))


def t_interval(values, level: float = LEVEL) -> tuple[float, float]:
    """Student t interval of the mean (mean +- t * sd / sqrt(n)) of one value per unit (a
    training seed); NaN bounds for fewer than MIN_TEXTS units or units that all agree."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if len(v) < MIN_TEXTS:
        return float("nan"), float("nan")
    from scipy.stats import t

    half = t.ppf(0.5 + level / 2, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))
    return proper(v.mean() - half, v.mean() + half)


def perplexity_intervals(nlls: list, n_boot: int, seed: int) -> dict[str, tuple[float, float]]:
    """95 % bootstrap interval of every perplexity aggregation (metrics.AGGREGATIONS) over
    texts, from per-text NLL tensors (pecli perplexity, mask fit, finetune).

    corpus and mean_per_token are ratios of per-text sums (NLL, exp(NLL)) to token counts;
    mean_ and median_per_text are statistics of the per-text perplexities (texts without a
    scored token left out, as in `aggregate`).
    """
    scored = [x.double() for x in nlls if x.numel()]
    counts = np.array([x.numel() for x in scored], np.float64)
    nll_sums = np.array([x.sum().item() for x in scored])
    exp_sums = np.array([x.exp().sum().item() for x in scored])
    per_text = np.exp(nll_sums / np.maximum(counts, 1))
    return {
        "corpus": ratio_interval(nll_sums, counts, n_boot=n_boot, seed=seed, transform=np.exp),
        "mean_per_text": mean_interval(per_text, n_boot=n_boot, seed=seed),
        "median_per_text": statistic_interval(per_text, np.median, n_boot=n_boot, seed=seed),
        "mean_per_token": ratio_interval(exp_sums, counts, n_boot=n_boot, seed=seed),
    }


def paired_perplexity(nlls: list, intact: list | None, n_boot: int, seed: int) -> dict[str, dict]:
    """Each perplexity aggregation's DIFF_COLUMNS: a condition's per-text NLL tensors against
    the intact model's on the same texts (`intact`; None for the intact rows: NaN), texts
    resampled in pairs. The median per text has none (NaN): it is not a ratio of sums."""
    from pecli.measures.metrics import AGGREGATIONS

    if intact is None:
        return {a: diff_columns(reference_row=True) for a in AGGREGATIONS}
    keep = [i for i, (x, y) in enumerate(zip(nlls, intact, strict=True)) if x.numel() and y.numel()]

    def per_text(xs):
        xs = [xs[i].double() for i in keep]
        return (np.array([x.sum().item() for x in xs]), np.array([x.exp().sum().item() for x in xs]),
                np.array([x.numel() for x in xs], np.float64))

    (nll, exp, n), (nll0, exp0, n0) = per_text(nlls), per_text(intact)
    boot = {"n_boot": n_boot, "seed": seed}
    out = {"corpus": diff_columns(nll, nll0, n, n0, transform=np.exp, **boot),
           "mean_per_text": diff_columns(np.exp(nll / n), np.exp(nll0 / n0), **boot),
           "mean_per_token": diff_columns(exp, exp0, n, n0, **boot)}
    return {a: out.get(a, diff_columns(reference_row=True)) for a in AGGREGATIONS}


SEEDS_AND_TEXTS = ("95 % two-level percentile bootstrap: training seeds resampled, then the "
                   "texts within each drawn seed; the mean over seeds of each seed's statistic")
SEEDS_CROSSED_TEXTS = ("95 % two-level percentile bootstrap: training seeds resampled, and the "
                       "texts every seed was scored on resampled once for all of them; the mean "
                       "over seeds of each seed's statistic")  # seeds_and_texts_interval(same_texts=True)


def seeds_and_texts_interval(per_seed: list, n_boot: int = 1000, seed: int = 0,
                             level: float = LEVEL, weights: list | None = None,
                             transform: Callable[[np.ndarray], np.ndarray] | None = None,
                             same_texts: bool = False,
                             reference: list | None = None) -> tuple[float, float]:
    """Interval of the mean over training seeds of each seed's mean over its texts (or items),
    where both vary: every resample draws seeds with replacement, then each drawn seed's texts
    with replacement (`per_seed`: one array of per-text values per seed). Bounds stay inside
    the values' range (an accuracy's in [0, 1]), which a t interval over 3 seeds does not; one
    seed gives the bootstrap over its texts. NaN where nothing can vary (`proper`).

    `weights` (per seed, one per text) make each seed's statistic a weighted mean, and
    `transform` maps it before the mean over seeds: a corpus perplexity is exp of the
    token-weighted mean of the texts' mean NLL (weights: their token counts; transform: exp).
    `same_texts`: every seed was scored on the same texts, in the same order (texts crossed
    with seeds, not nested in them): one draw of texts serves every seed of a resample, so the
    texts' variance is not averaged away over seeds (with identical seeds the interval is the
    texts' bootstrap). `reference` (same_texts only: per seed, the same texts under the
    reference condition, e.g. intact): each seed's statistic becomes its own minus the
    reference's, both on the same draw of texts: a paired difference over seeds and texts."""
    arrays = [np.asarray(v, np.float64).ravel() for v in per_seed]
    weighed = [np.asarray(w, np.float64).ravel() for w in weights] if weights is not None else \
        [np.ones_like(v) for v in arrays]
    refs = None
    if reference is not None:
        refs = [np.asarray(v, np.float64).ravel() for v in reference]
        if not same_texts or len(refs) != len(arrays):
            raise ValueError("a reference pairs each seed's texts with its own: give one per seed, same_texts")
        if len({v.size for v in (*arrays, *refs, *weighed)}) > 1:
            raise ValueError("a paired interval needs every seed and the reference on the same texts")
    kept = [i for i, (v, _) in enumerate(zip(arrays, weighed, strict=True)) if v.size]
    # a paired difference needs enough texts in each seed; a mean, enough over all seeds
    texts = arrays[0].size if refs is not None and arrays else sum(arrays[i].size for i in kept)
    if not kept or n_boot <= 0 or texts < MIN_TEXTS:
        return float("nan"), float("nan")
    if same_texts and len({arrays[i].size for i in kept}) != 1:
        raise ValueError("same_texts: every seed must give one value per text of the same texts")
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, arrays[kept[0]].size, (n_boot, arrays[kept[0]].size)) if same_texts else None
    transform = transform or (lambda a: a)

    def within(values: list) -> np.ndarray:  # [B, S]: each seed's statistic on its drawn texts
        columns = []
        for i in kept:
            drawn_texts = shared if same_texts else rng.integers(0, values[i].size, (n_boot, values[i].size))
            w = weighed[i][drawn_texts]
            columns.append(transform((values[i][drawn_texts] * w).sum(1) / w.sum(1)))
        return np.stack(columns, 1)

    stats = within(arrays) - within(refs) if refs is not None else within(arrays)
    drawn = rng.integers(0, len(kept), (n_boot, len(kept)))
    return _percentiles(np.take_along_axis(stats, drawn, 1).mean(1), level)


# --- lm-eval's numbers per document (pecli lm-eval) ---------------------------------------


def document_interval(per_doc: list, stderr, value: float, n_boot: int, seed: int):
    """(low, high, method) of a 95 % interval over documents by `accuracy_interval` (Wilson's
    where every document is right or wrong, a bootstrap otherwise), else (no documents logged,
    or `n_boot` 0) value ± 1.96 lm-eval stderr; NaN when there is nothing to build one from (a
    single document)."""
    if len(per_doc) >= MIN_TEXTS and n_boot:
        low, high = accuracy_interval(per_doc, n_boot=n_boot, seed=seed)
        return low, high, accuracy_method(per_doc, "documents")
    if isinstance(stderr, int | float) and np.isfinite(stderr) and len(per_doc) != 1:
        low, high = proper(value - 1.96 * stderr, value + 1.96 * stderr)
        return low, high, "normal: value ± 1.96 lm-eval stderr" if np.isfinite(low) else ""
    return float("nan"), float("nan"), ""


def paired_with_intact(df, per_doc: list[dict], n_boot: int, seed: int):
    """Add `diff_vs_intact` (the condition's value minus the intact model's, from the same
    documents) and its 95 % interval paired over documents (`paired_mean_difference`: Newcombe's
    for right-or-wrong metrics such as acc, else a bootstrap resampling each document's pair
    together): sharper than comparing the two conditions' own intervals. NaN for the intact
    rows, and where the documents' values are not logged."""
    diffs = []
    for row in df.itertuples():
        key = (row.task, row.metric, row.filter)
        intact, here = per_doc[0].get(key, {}), per_doc[row.condition_index].get(key, {})
        docs = sorted(set(intact) & set(here))
        if row.condition_index == 0 or not docs or len(docs) != row.rows:
            diffs.append((np.nan, np.nan, np.nan))
            continue
        diffs.append(paired_mean_difference([here[k] for k in docs], [intact[k] for k in docs],
                                            n_boot=n_boot, seed=seed))
    return df.assign(**dict(zip(("diff_vs_intact", "diff_ci_low", "diff_ci_high"),
                                np.array(diffs, dtype=float).T, strict=True)))
