"""pecli.measures.intervals: deterministic for a seed, contains the estimate, narrows as texts grow."""

from __future__ import annotations

import numpy as np
import pytest

from pecli.measures.intervals import (
    by_text,
    mean_interval,
    ratio_interval,
    statistic_interval,
    wilson,
)


def _texts(n: int, seed: int = 1):
    """n texts of 5-40 tokens with per-token values around 0.7 (a cosine-like quantity)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 40, size=n)
    text = np.repeat(np.arange(n), lengths)
    values = 0.7 + 0.1 * rng.standard_normal(text.size) + 0.05 * rng.standard_normal(n)[text]
    return values, text


def test_deterministic_for_a_seed_and_different_for_another():
    values, text = _texts(60)
    sums, counts = by_text(values, text, 60)
    a = ratio_interval(sums, counts, n_boot=500, seed=3)
    assert a == ratio_interval(sums, counts, n_boot=500, seed=3)
    assert a != ratio_interval(sums, counts, n_boot=500, seed=4)
    m = statistic_interval(sums / counts, np.median, n_boot=500, seed=3)
    assert m == statistic_interval(sums / counts, np.median, n_boot=500, seed=3)


@pytest.mark.parametrize("n", [10, 80, 400])
def test_contains_the_point_estimate(n):
    values, text = _texts(n)
    sums, counts = by_text(values, text, n)
    assert np.isclose(sums.sum() / counts.sum(), values.mean())  # by_text is the token mean
    low, high = ratio_interval(sums, counts, n_boot=1000, seed=0)
    assert low < values.mean() < high
    per_text = sums / counts
    low, high = statistic_interval(per_text, np.median, n_boot=1000, seed=0)
    assert low <= np.median(per_text) <= high
    nll = np.abs(values) * 3  # a perplexity: exp of the token-weighted mean NLL
    nll_sums, _ = by_text(nll, text, n)
    low, high = ratio_interval(nll_sums, counts, n_boot=1000, seed=0, transform=np.exp)
    assert low < np.exp(nll.mean()) < high


def test_narrows_as_texts_grow():
    widths = []
    for n in (20, 80, 320, 1280):
        values, text = _texts(n)
        sums, counts = by_text(values, text, n)
        low, high = ratio_interval(sums, counts, n_boot=1000, seed=0)
        widths.append(high - low)
    assert all(a > b for a, b in zip(widths, widths[1:], strict=False))
    assert widths[0] / widths[-1] > 4  # about sqrt(64) = 8 in expectation


def test_resamples_texts_not_tokens():
    # One text of many identical tokens and one of others: a token bootstrap would give a
    # narrow interval; over 2 texts the resamples are {a,a}, {a,b}, {b,b}, so the bounds
    # reach the per-text means.
    sums, counts = np.array([100.0, 0.0]), np.array([100.0, 100.0])
    low, high = ratio_interval(sums, counts, n_boot=2000, seed=0)
    assert low == 0.0 and high == 1.0


def test_off_and_empty_give_nan():
    assert np.isnan(ratio_interval([1.0, 2.0], n_boot=0)).all()
    assert np.isnan(mean_interval([], n_boot=10)).all()
    assert np.isnan(statistic_interval([], np.median)).all()


def test_pe_order_accuracy_carries_its_interval():
    from pecli.experiments.pe import matrix_analyses
    from pecli.measures import pe_analysis as pa

    matrix = pa.sinusoidal(40, 16) + np.random.default_rng(0).standard_normal((40, 16))
    rows, _ = matrix_analyses(matrix, folds=5, pairs=200, seed=0)
    acc = {r["metric"]: r for r in rows}["order_accuracy"]
    assert acc["value"] == pa.order_accuracy(matrix, folds=5, pairs=200, seed=0)
    assert acc["ci_low"] <= acc["value"] <= acc["ci_high"] and acc["ci_high"] - acc["ci_low"] > 0
    correct = pa.order_correct(matrix, folds=5, pairs=200, seed=0)
    # each test pair right or wrong: Wilson's interval over them
    assert (acc["ci_low"], acc["ci_high"]) == wilson(int(correct.sum()), correct.size)


def test_toy_exact_match_carries_its_interval():
    from pecli.experiments.options.toy import ToyOptions
    from pecli.experiments.toy import run

    acc = run(ToyOptions(pe="none", max_n=12, steps=2, layers=1, width=16, heads=2))["accuracy"]
    em = acc[acc["metric"] == "exact_match"]
    assert len(em) == 3
    # two training steps: every item wrong, and still an interval (Wilson's), not [0, 0]
    assert (em["value"] == 0).all() and (em["ci_low"] == 0).all() and (em["ci_high"] > 0).all()
    for _, r in em.iterrows():
        assert (r["ci_low"], r["ci_high"]) == wilson(0, int(r["rows"]))
        assert r["interval"] == "95 % Wilson score interval over test examples"


def test_accuracy_intervals_are_wilsons_for_answers_and_a_bootstrap_for_partial_credit():
    """The one rule every accuracy keeps (probes, toy, pe, mc, ruler, lm-eval's documents)."""
    from pecli.measures.intervals import accuracy_interval, accuracy_method

    right = np.array([1.0] * 17 + [0.0] * 3)
    assert accuracy_interval(right, seed=4) == wilson(17, 20)
    assert accuracy_interval(np.ones(20)) == wilson(20, 20)  # all right: a bootstrap gives [1, 1]
    assert accuracy_method(right, "items") == "Wilson score interval over items"
    credit = np.linspace(0, 1, 20)  # MC2 probabilities, RULER's partial recall
    assert accuracy_interval(credit, seed=4) == mean_interval(credit, seed=4)
    assert accuracy_method(credit, "samples") == "percentile bootstrap over samples"
    assert np.isnan(accuracy_interval(right, n_boot=0)).all()  # --bootstrap 0: no intervals
    with pytest.warns(UserWarning, match="fewer than 2"):
        assert np.isnan(accuracy_interval([1.0])).all()


def test_difference_method_names_the_interval_each_difference_function_takes():
    """Newcombe's interval (paired or independent) where both sides are answers right or wrong:
    the point of `paired_mean_difference` equals that of `paired_proportion_difference`, and
    `independent_mean_difference` that of `independent_proportion_difference`; a bootstrap for
    partial credit."""
    from pecli.measures.intervals import (
        difference_method,
        independent_mean_difference,
        independent_proportion_difference,
        paired_mean_difference,
        paired_proportion_difference,
    )

    right, other = np.array([1.0] * 17 + [0.0] * 3), np.array([1.0] * 8 + [0.0] * 12)
    assert paired_mean_difference(right, other) == paired_proportion_difference(right, other)
    assert difference_method(right, other, paired=True).startswith("95 % Newcombe (1998, method 10) score "
                                                                   "interval for a difference of paired")
    assert independent_mean_difference(right, other) == independent_proportion_difference(17, 20, 8, 20)
    assert difference_method(right, other, paired=False).endswith("interval for independent proportions")
    credit = np.linspace(0, 1, 20)  # one side with partial credit: no longer answers
    assert difference_method(credit, other, paired=True) == "95 % paired percentile bootstrap"
    assert "bootstrap of independent means" in difference_method(credit, other, paired=False)


def test_no_interval_from_one_text_and_a_warning_that_says_so():
    with pytest.warns(UserWarning, match="fewer than 2 texts"):
        assert np.isnan(ratio_interval([0.7021], [1.0], n_boot=1000)).all()
    with pytest.warns(UserWarning, match="fewer than 2 texts"):
        assert np.isnan(statistic_interval([3.0], np.median, n_boot=1000)).all()
    low, high = ratio_interval([0.70, 0.72], [1.0, 1.0], n_boot=1000)
    assert low < high  # two texts: an interval


@pytest.mark.parametrize("n_boot", [1, 2, 99])
def test_too_few_resamples_are_refused_where_options_are_built(n_boot):
    from pecli.experiments.options.ablate import AblateOptions
    from pecli.experiments.options.recover import RecoverOptions
    from pecli.runs.errors import ConfigError

    for cls in (AblateOptions, RecoverOptions):
        with pytest.raises(ConfigError, match="no meaningful 95 % interval; use 0"):
            cls(bootstrap=n_boot)
    with pytest.raises(ConfigError, match="at most 100000"):
        AblateOptions(bootstrap=10**9)
    assert AblateOptions(bootstrap=0).bootstrap == 0 and AblateOptions(bootstrap=100).bootstrap == 100


def test_pair_interval_weights_a_pair_by_both_texts_draws():
    from pecli.measures.intervals import pair_interval, resampled

    rng = np.random.default_rng(0)
    text_a, text_b = rng.integers(0, 30, size=(2, 500))
    values = 0.3 + 0.1 * rng.standard_normal(500) + 0.05 * text_a / 30
    low, high = pair_interval(values, text_a, text_b, 30, n_boot=400, seed=2)
    assert low < values.mean() < high
    # by hand, with the resamples ratio_interval uses for the same seed
    draws = np.random.default_rng(2).integers(0, 30, size=(400, 30))
    w = np.stack([np.bincount(d, minlength=30) for d in draws]).astype(float)
    stats = [(wk[text_a] * wk[text_b] * values).sum() / (wk[text_a] * wk[text_b]).sum() for wk in w]
    assert (low, high) == pytest.approx(tuple(np.percentile(stats, [2.5, 97.5])))
    assert resampled(lambda c: c.sum(1), 30, 400, 2).tolist() == [30.0] * 400  # counts sum to texts


def test_memory_stays_bounded_for_the_largest_bootstrap():
    import tracemalloc

    from pecli.measures.intervals import MAX_RESAMPLES

    values, text = _texts(2000)
    sums, counts = by_text(values, text, 2000)
    tracemalloc.start()
    ratio_interval(sums, counts, n_boot=MAX_RESAMPLES, seed=0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # resampled indices for all 100,000 x 2000 draws would be 1.6 GB; chunks keep it small
    assert peak < 200e6, peak


# --- the rule (issue 46): no zero-width interval, none from fewer than 2 distinct units ------


def test_a_statistic_that_cannot_vary_gets_no_interval_not_a_zero_width_one():
    from pecli.measures.intervals import pair_interval, t_interval

    # attn's sink rate 0 on every text; lm-eval's difference of a condition identical to intact
    assert np.isnan(mean_interval([0.0, 0.0, 0.0], n_boot=1000)).all()
    assert np.isnan(mean_interval(np.zeros(200), n_boot=1000)).all()
    # the same ratio on every text, whatever its length: rounding is not variation
    assert np.isnan(ratio_interval([0.1 * k for k in (3, 7, 11)], [3, 7, 11], n_boot=1000)).all()
    assert np.isnan(statistic_interval([5.0] * 4, np.median, n_boot=1000)).all()
    assert np.isnan(pair_interval(np.ones(6), [0, 0, 1, 1, 2, 2], [1, 2, 0, 2, 0, 1], 3)).all()
    # toy length's exact match 0 over seeds; finetune's step 0, the same model for every seed
    assert np.isnan(t_interval([0.0, 0.0, 0.0])).all()
    assert np.isnan(t_interval([321.16, 321.16])).all()
    assert np.isnan(wilson(1, 1)).all()  # one trial is one unit
    assert wilson(3, 3)[1] == 1.0 and wilson(3, 3)[0] > 0.0  # all right: Wilson's is not [1, 1]


def test_the_intact_conditions_gap_closed_is_blank_by_construction():
    from pecli.measures.mask_fitting import gap_interval

    rng = np.random.default_rng(0)
    counts = rng.integers(20, 60, 12).astype(float)
    sums = {"zero": counts * 6.0 + rng.random(12), "intact": counts * 4.0 + rng.random(12)}
    sums["half"] = (sums["zero"] + sums["intact"]) / 2 + rng.normal(0, 5, 12)
    assert np.isnan(gap_interval(sums, counts, "intact", 1000, 0)).all()  # 1 on every resample
    assert np.isnan(gap_interval(sums, counts, "zero", 1000, 0)).all()  # 0 on every resample
    low, high = gap_interval(sums, counts, "half", 1000, 0)
    assert low < 0.5 < high


def test_lm_evals_difference_from_intact_pairs_documents_by_metric_kind():
    """Right-or-wrong documents get Newcombe's paired interval (still an interval where no
    document changes, where a bootstrap of the pairs collapses); continuous values a paired
    bootstrap, with none where every document's difference is zero; intact's row none."""
    import pandas as pd

    from pecli.measures.intervals import (
        paired_difference,
        paired_proportion_difference,
        paired_with_intact,
    )

    key, soft = ("t", "acc", "none"), ("t", "mc2", "none")
    docs = {i: float(i % 3 == 0) for i in range(30)}
    other = {i: float(i % 2 == 0) for i in range(30)}
    probs = {i: 0.1 + 0.8 * (i % 7) / 7 for i in range(30)}
    shifted = {i: p + 0.05 * ((i * 5) % 3) for i, p in probs.items()}
    df = pd.DataFrame({"task": "t", "metric": ["acc"] * 3 + ["mc2"] * 3, "filter": "none", "rows": 30,
                       "condition_index": [0, 1, 2] * 2})
    out = paired_with_intact(df, [{key: docs, soft: probs}, {key: dict(docs), soft: dict(probs)},
                                  {key: other, soft: shifted}], 1000, 0)
    bounds = out[["diff_vs_intact", "diff_ci_low", "diff_ci_high"]].to_numpy()
    assert np.isnan(bounds[[0, 3]]).all()
    same = [docs[i] for i in range(30)]
    assert tuple(bounds[1]) == paired_proportion_difference(same, same)
    assert bounds[1, 1] < 0 < bounds[1, 2]  # no document changed: an interval about 0, not none
    assert tuple(bounds[2]) == paired_proportion_difference([other[i] for i in range(30)], same)
    assert bounds[4, 0] == 0.0 and np.isnan(bounds[4, 1:]).all()  # zero by construction
    d = np.array([shifted[i] - probs[i] for i in range(30)])
    assert bounds[5, 0] == pytest.approx(d.mean())
    assert bounds[5, 1] < d.mean() < bounds[5, 2]
    assert (bounds[5, 1], bounds[5, 2]) == paired_difference(
        [shifted[i] for i in range(30)], [probs[i] for i in range(30)], seed=0)[1:]


def test_seeds_and_texts_of_a_corpus_perplexity_by_hand():
    """The recovery curve's interval: each drawn seed's corpus perplexity over its resampled
    texts (exp of total NLL over total tokens), averaged over the drawn seeds."""
    from pecli.measures.intervals import seeds_and_texts_interval

    rng = np.random.default_rng(2)
    tokens = [rng.integers(5, 60, 12) for _ in range(3)]  # 12 texts of different lengths per seed
    nll = [[rng.normal(4.0 + s / 10, 0.5, n) for n in t] for s, t in enumerate(tokens)]
    means = [[x.mean() for x in seed] for seed in nll]
    low, high = seeds_and_texts_interval(means, weights=tokens, transform=np.exp, n_boot=500, seed=7)
    g = np.random.default_rng(7)
    within = np.zeros((500, 3))
    for s in range(3):
        drawn = g.integers(0, 12, (500, 12))
        for b in range(500):
            picked = [nll[s][i] for i in drawn[b]]
            within[b, s] = np.exp(np.concatenate(picked).sum() / sum(len(x) for x in picked))
    seeds = g.integers(0, 3, (500, 3))
    stats = np.array([within[b, seeds[b]].mean() for b in range(500)])
    np.testing.assert_allclose([low, high], np.percentile(stats, [2.5, 97.5]), rtol=1e-10)
    corpus = [np.exp(np.concatenate(seed).mean()) for seed in nll]  # the point estimate's parts
    assert low < np.mean(corpus) < high


def test_seeds_crossed_with_the_same_texts_share_each_draw_of_texts():
    """Seeds scored on the same texts: one draw of texts per resample serves every seed, so
    identical seeds give exactly the texts' own bootstrap (nested draws would shrink it)."""
    from pecli.measures.intervals import mean_interval, seeds_and_texts_interval

    rng = np.random.default_rng(3)
    texts = rng.normal(0.0, 1.0, 40)
    same = seeds_and_texts_interval([texts] * 5, n_boot=800, seed=1, same_texts=True)
    g = np.random.default_rng(1)
    drawn = g.integers(0, 40, (800, 40))
    np.testing.assert_allclose(same, np.percentile(texts[drawn].mean(1), [2.5, 97.5]), rtol=1e-12)
    nested = seeds_and_texts_interval([texts] * 5, n_boot=800, seed=1)
    assert nested[1] - nested[0] < 0.8 * (same[1] - same[0])  # what nesting would claim
    low, high = mean_interval(texts, n_boot=800, seed=1)
    assert abs((high - low) - (same[1] - same[0])) < 0.2 * (high - low)
    with pytest.raises(ValueError, match="same texts"):
        seeds_and_texts_interval([texts, texts[:30]], same_texts=True)


def test_paired_difference_is_a_bootstrap_of_pairs_written_plainly():
    from pecli.measures.intervals import diff_columns, paired_difference

    rng = np.random.default_rng(5)
    base = rng.uniform(0.2, 0.9, 30)  # per-text accuracy of intact; a condition 0.05 lower
    cond = base - 0.05 + rng.normal(0, 0.01, 30)
    idx = np.random.default_rng(0).integers(0, 30, size=(1000, 30))
    by_hand = np.percentile(cond[idx].mean(1) - base[idx].mean(1), [2.5, 97.5])
    d, low, high = paired_difference(cond, base, n_boot=1000, seed=0)
    assert d == pytest.approx(cond.mean() - base.mean(), abs=1e-15)
    np.testing.assert_allclose([low, high], by_hand, rtol=1e-12)
    assert high < 0  # the unpaired intervals overlap; the paired one excludes zero
    a, b = mean_interval(cond), mean_interval(base)
    assert a[1] > b[0]
    assert np.isnan(list(diff_columns(base, base, reference_row=True).values())).all()
    assert np.isnan(paired_difference(base, base)[1:]).all()  # intact against itself: zero width
    with pytest.raises(ValueError, match="same texts"):
        paired_difference(cond[:5], base)


def test_seeds_and_texts_together_by_hand_and_inside_the_values_range():
    from pecli.measures.intervals import seeds_and_texts_interval, t_interval

    per_seed = [np.r_[np.ones(k), np.zeros(20 - k)] for k in (1, 0, 3)]  # accuracy near 0
    low, high = seeds_and_texts_interval(per_seed, n_boot=1000, seed=4)
    # by hand: texts resampled within every seed, then seeds drawn, from one generator
    rng = np.random.default_rng(4)
    within = np.stack([v[rng.integers(0, 20, (1000, 20))].mean(1) for v in per_seed], 1)
    drawn = rng.integers(0, 3, (1000, 3))
    stats = np.array([within[b, drawn[b]].mean() for b in range(1000)])
    np.testing.assert_allclose([low, high], np.percentile(stats, [2.5, 97.5]), rtol=1e-12)
    assert 0.0 <= low < high <= 1.0
    assert t_interval([v.mean() for v in per_seed])[0] < 0  # what the t interval over 3 seeds gave
    assert np.isnan(seeds_and_texts_interval([np.zeros(20)] * 3)).all()  # all wrong: no interval


def test_seeds_and_texts_paired_difference_is_the_crossed_bootstrap_written_plainly():
    """With a reference, each seed's statistic is its transform(weighted mean) minus the
    reference's on the same draw of texts; seeds resampled after (written out)."""
    from pecli.measures.intervals import seeds_and_texts_interval

    rng = np.random.default_rng(7)
    ref = [rng.normal(2.8, 0.3, 25) for _ in range(4)]  # [seed][text] log perplexity, intact
    x = [r + 0.3 + rng.normal(0, 0.05, 25) for r in ref]  # zero: higher on every text
    w = [rng.integers(20, 64, 25).astype(float)] * 4  # tokens per text, the same texts
    got = seeds_and_texts_interval(x, n_boot=600, seed=3, weights=w, transform=np.exp,
                                   same_texts=True, reference=ref)
    g = np.random.default_rng(3)
    texts = g.integers(0, 25, (600, 25))

    def corpus(v, wt):
        return np.exp((v[texts] * wt[texts]).sum(1) / wt[texts].sum(1))

    within = np.stack([corpus(a, wt) - corpus(b, wt) for a, b, wt in zip(x, ref, w, strict=True)], 1)
    stats = np.take_along_axis(within, g.integers(0, 4, (600, 4)), 1).mean(1)
    np.testing.assert_allclose(got, np.percentile(stats, [2.5, 97.5]), rtol=1e-12)
    assert got[0] > 0
    with pytest.raises(ValueError, match="same_texts"):
        seeds_and_texts_interval(x, reference=ref)
    with pytest.raises(ValueError, match="same texts"):
        seeds_and_texts_interval(x, same_texts=True, reference=[r[:20] for r in ref])


def _newcombe_literal(a: int, b: int, c: int, d: int, level: float = 0.95) -> tuple[float, float, float]:
    """Newcombe (1998, Stat Med 17:2635), method 10, as the paper writes it: a both right, b the
    first only, c the second only, d neither; Wilson margins (scipy's), phi continuity-corrected."""
    from scipy.stats import binomtest

    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    w1 = binomtest(a + b, n).proportion_ci(level, method="wilson")
    w2 = binomtest(a + c, n).proportion_ci(level, method="wilson")
    big_a = (a + b) * (c + d) * (a + c) * (b + d)
    big_b = a * d - b * c
    big_c = big_b - n / 2 if big_b > n / 2 else (0 if big_b >= 0 else big_b)
    phi = big_c / big_a ** 0.5 if big_a else 0.0
    delta = ((p1 - w1.low) ** 2 - 2 * phi * (p1 - w1.low) * (w2.high - p2) + (w2.high - p2) ** 2) ** 0.5
    eps = ((w1.high - p1) ** 2 - 2 * phi * (w1.high - p1) * (p2 - w2.low) + (p2 - w2.low) ** 2) ** 0.5
    return p1 - p2, p1 - p2 - delta, p1 - p2 + eps


def _pairs(a: int, b: int, c: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    first = np.r_[np.ones(a), np.ones(b), np.zeros(c), np.zeros(d)]
    second = np.r_[np.ones(a), np.zeros(b), np.ones(c), np.zeros(d)]
    return first, second


@pytest.mark.parametrize("table", [(14, 5, 0, 22), (12, 9, 2, 4), (0, 20, 0, 0), (3, 0, 0, 17),
                                   (10, 3, 6, 1), (0, 0, 0, 20), (5, 2, 8, 5)])
def test_paired_proportion_difference_is_newcombes_method_10(table):
    """The interval equals the paper's formula written out with scipy's Wilson margins (Altman
    et al. 2000's Table 6.2 first), and swapping the two conditions mirrors it."""
    from pecli.measures.intervals import paired_proportion_difference

    got = paired_proportion_difference(*_pairs(*table))
    want = _newcombe_literal(*table)
    assert got == pytest.approx((want[0], max(want[1], -1), min(want[2], 1)), abs=1e-9)
    a, b, c, d = table
    mirrored = paired_proportion_difference(*_pairs(a, c, b, d))
    assert mirrored == pytest.approx((-got[0], -got[2], -got[1]), abs=1e-9)


def test_pairs_all_right_against_wrong_still_get_an_interval():
    """20 trials right under one condition and wrong under the other: a bootstrap over the pairs
    cannot vary (every resample gives +1, no interval); Newcombe's bounds it below by the margins'
    Wilson intervals. 20 pairs with no change at all give an interval around 0."""
    from pecli.measures.intervals import paired_difference, paired_proportion_difference

    ones, zeros = np.ones(20), np.zeros(20)
    assert np.isnan(paired_difference(ones, zeros)[1])
    d, low, high = paired_proportion_difference(ones, zeros)
    assert d == 1.0 and 0.7 < low < 0.8 and high == 1.0
    d, low, high = paired_proportion_difference(zeros, zeros)
    assert d == 0.0 and low == pytest.approx(-high) and 0.1 < high < 0.2
    assert np.isnan(paired_proportion_difference([1.0], [0.0])[1])  # one pair: no interval
    with pytest.raises(ValueError, match="0/1"):
        paired_proportion_difference([0.5, 1.0], [0.0, 1.0])


@pytest.mark.parametrize("p_first, p_second, rho", [(0.9, 0.3, 0.0), (0.6, 0.5, 0.4), (0.95, 0.85, 0.3)])
def test_paired_proportion_difference_covers_the_true_difference(p_first, p_second, rho):
    """Coverage by simulation: 20 correlated pairs per draw, 1,500 draws; the interval holds the
    true difference in about 95 % of them (Newcombe reports coverage near nominal at this size;
    a sign error in phi or a swapped bound drops it far below)."""
    from pecli.measures.intervals import paired_proportion_difference

    rng = np.random.default_rng(7)
    z = rng.standard_normal((1500, 20, 2))
    z[..., 1] = rho * z[..., 0] + (1 - rho ** 2) ** 0.5 * z[..., 1]
    from scipy.stats import norm

    first = (z[..., 0] < norm.ppf(p_first)).astype(float)
    second = (z[..., 1] < norm.ppf(p_second)).astype(float)
    truth = p_first - p_second
    held = [low <= truth <= high for _, low, high in
            (paired_proportion_difference(f, s) for f, s in zip(first, second, strict=True))
            if low == low]
    assert 0.92 <= np.mean(held) <= 0.99


def test_diff_columns_bounds_answers_by_newcombe_and_other_means_by_a_paired_bootstrap():
    """The one rule every table's difference from intact keeps (paired_mean_difference)."""
    from pecli.measures.intervals import (
        DIFF_COLUMNS,
        diff_columns,
        paired_difference,
        paired_proportion_difference,
    )

    rng = np.random.default_rng(3)
    right, ref = (rng.random(40) < p for p in (0.7, 0.4))
    x, r = right.astype(float), ref.astype(float)
    newcombe = dict(zip(DIFF_COLUMNS, paired_proportion_difference(x, r), strict=True))
    assert diff_columns(x, r, seed=1) == newcombe
    assert diff_columns(right, ref) == newcombe  # booleans are answers too
    assert diff_columns(r, r)["diff_ci_low"] < 0 < diff_columns(r, r)["diff_ci_high"]
    off = diff_columns(x, r, n_boot=0)
    assert off["diff_vs_intact"] == newcombe["diff_vs_intact"] and np.isnan(off["diff_ci_low"])
    few = diff_columns(x[:5], r[:5], least=10)
    assert np.isnan([few["diff_ci_low"], few["diff_ci_high"]]).all()
    soft = x * 0.5 + rng.random(40) * 0.3
    assert tuple(diff_columns(soft, r, seed=2).values()) == paired_difference(soft, r, seed=2)
    counts = rng.integers(5, 9, 40).astype(float)
    assert tuple(diff_columns(x * counts, r * counts, counts, seed=2).values()) == paired_difference(
        x * counts, r * counts, counts, seed=2)
    assert np.isnan(list(diff_columns(x, r, reference_row=True).values())).all()


# Newcombe (1998), "Interval estimation for the difference between independent proportions",
# Stat Med 17:873-890, Table II, method 10 (score, no continuity correction), to 4 decimals
NEWCOMBE_UNPAIRED = [((56, 70, 48, 80), (0.0524, 0.3339)), ((9, 10, 3, 10), (0.1705, 0.8090)),
                     ((5, 56, 0, 29), (-0.0381, 0.1926)), ((0, 10, 0, 20), (-0.1611, 0.2775)),
                     ((0, 10, 0, 10), (-0.2775, 0.2775)), ((10, 10, 0, 20), (0.6791, 1.0)),
                     ((10, 10, 0, 10), (0.6075, 1.0))]


@pytest.mark.parametrize(("counts", "published"), NEWCOMBE_UNPAIRED)
def test_independent_proportion_difference_is_newcombes_method_10(counts, published):
    """The paper's formula written out with scipy's Wilson intervals: lower = d - sqrt((p1 -
    l1)^2 + (u2 - p2)^2), upper = d + sqrt((u1 - p1)^2 + (p2 - l2)^2); equal to the paper's
    worked examples, and swapping the two sides mirrors it."""
    from scipy.stats import binomtest

    from pecli.measures.intervals import independent_proportion_difference

    x1, n1, x2, n2 = counts
    p1, p2 = x1 / n1, x2 / n2
    w1 = binomtest(x1, n1).proportion_ci(0.95, method="wilson")
    w2 = binomtest(x2, n2).proportion_ci(0.95, method="wilson")
    low = p1 - p2 - ((p1 - w1.low) ** 2 + (w2.high - p2) ** 2) ** 0.5
    high = p1 - p2 + ((w1.high - p1) ** 2 + (p2 - w2.low) ** 2) ** 0.5
    got = independent_proportion_difference(*counts)
    assert got == pytest.approx((p1 - p2, max(low, -1), min(high, 1)), abs=1e-12)
    assert got[1:] == pytest.approx(published, abs=5e-5)
    assert independent_proportion_difference(x2, n2, x1, n1) == pytest.approx(
        (-got[0], -got[2], -got[1]), abs=1e-12)


def test_independent_proportions_refuse_what_are_not_counts():
    """Counts only: a right count above its trials, a fraction or a negative is refused; a
    side with one trial gives the difference without an interval, none gives NaN."""
    from pecli.measures.intervals import independent_proportion_difference

    for bad in [(21, 20, 3, 20), (2.5, 20, 3, 20), (-1, 20, 3, 20)]:
        with pytest.raises(ValueError, match="counts"):
            independent_proportion_difference(*bad)
    d, low, high = independent_proportion_difference(1, 1, 3, 20)
    assert d == pytest.approx(0.85) and np.isnan(low) and np.isnan(high)
    assert np.isnan(independent_proportion_difference(0, 0, 3, 20)[0])


def test_independent_mean_difference_resamples_each_side_apart_and_agrees_with_welch():
    """Partial recalls of two runs' own draws: a percentile bootstrap drawing each side's units
    on its own (written plainly here, the same generator), near Welch's t interval where the
    means are close to normal; 0/1 answers get Newcombe's interval for independent proportions."""
    from scipy import stats

    from pecli.measures.intervals import (
        independent_mean_difference,
        independent_proportion_difference,
    )

    rng = np.random.default_rng(3)
    x, r = rng.uniform(0, 0.6, 200), rng.uniform(0.1, 0.5, 150)
    draw = np.random.default_rng(0)
    ix, ir = draw.integers(0, 200, (2000, 200)), draw.integers(0, 150, (2000, 150))
    by_hand = np.percentile(x[ix].mean(1) - r[ir].mean(1), [2.5, 97.5])
    d, low, high = independent_mean_difference(x, r, n_boot=2000, seed=0)
    assert d == pytest.approx(x.mean() - r.mean(), abs=1e-15)
    np.testing.assert_allclose([low, high], by_hand, rtol=1e-12)
    welch = stats.ttest_ind(x, r, equal_var=False).confidence_interval(0.95)
    assert (low, high) == pytest.approx((welch.low, welch.high), abs=0.01)
    right, ref = np.r_[np.ones(12), np.zeros(8)], np.r_[np.ones(5), np.zeros(15)]
    assert independent_mean_difference(right, ref) == independent_proportion_difference(12, 20, 5, 20)
    assert np.isnan(independent_mean_difference(x[:1], r)[1:]).all()  # one unit: no bounds
    assert np.isnan(independent_mean_difference(x, r, n_boot=0)[1:]).all()
    assert np.isnan(independent_mean_difference(np.full(5, 0.5), np.full(5, 0.5))[1:]).all()  # zero width
