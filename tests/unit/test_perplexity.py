"""Perplexity: metrics by hand, the protocol identities, batching/padding invariance, and the
`evaluate` definition re-implemented independently, on tiny GPT-2 and Llama models."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from pecli.measures.lm_scoring import plan, score, windows_for
from pecli.measures.metrics import aggregate, token_nll
from pecli.runs.batching import encode
from pecli.runs.errors import ConfigError, ModelError

TEXTS = [
    "What happens to you if you eat watermelon seeds?",
    "Where did fortune cookies originate?",
    "Why do veins appear blue?",
    "What is the spiciest part of a chili pepper?",
    "How long should you wait before filing a missing person report?",
    "Why do matadors wave red capes?",
    "Ok",
]
CAUSAL = ["gpt2", "llama"]
SEMS = ["legacy", "boolean", "log-bias", "scale"]
RTOL = 1e-5


def _prepared(loaded, texts=TEXTS, bos=True, **kw):
    ids = encode(loaded.tokenizer, texts, 10**12, add_special_tokens=False).ids
    return windows_for(ids, loaded.max_positions, loaded.tokenizer.bos_token_id if bos else None, **kw)


def _close(a: list[torch.Tensor], b: list[torch.Tensor], rtol=RTOL) -> None:
    x, y = torch.cat(a), torch.cat(b)
    assert x.shape == y.shape
    assert torch.allclose(x, y, rtol=rtol, atol=rtol), (x - y).abs().max()


# --- metrics ------------------------------------------------------------------------------


def test_token_nll_by_hand():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [1 / 3, 1 / 3, 1 / 3]]]))
    ids, mask = torch.tensor([[0, 1, 2]]), torch.tensor([[1, 1, 0]])
    nll = token_nll(logits, ids, mask)  # target 1 from row 0, target 2 (padding) from row 1
    assert nll.shape == (1, 2)
    assert nll[0, 0].item() == pytest.approx(-math.log(0.25)) and nll[0, 1].item() == 0.0


def test_aggregations_by_hand():
    a, b = torch.tensor([1.0, 3.0]), torch.tensor([2.0])
    agg = aggregate([a, b, torch.empty(0)])  # an unscored text is left out
    assert agg["corpus"] == pytest.approx(math.exp(2.0))
    assert agg["mean_per_text"] == pytest.approx((math.exp(2.0) + math.exp(2.0)) / 2)
    assert agg["median_per_text"] == pytest.approx(math.exp(2.0))
    assert agg["mean_per_token"] == pytest.approx((math.e + math.exp(3) + math.exp(2)) / 3)
    three = aggregate([torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([5.0])])
    assert three["median_per_text"] == pytest.approx(math.e)
    four = aggregate([torch.tensor([float(v)]) for v in (0, 1, 2, 9)])
    assert four["median_per_text"] == pytest.approx((math.e + math.exp(2)) / 2)


# --- windows --------------------------------------------------------------------------------


def test_windows_for_truncates_and_windows():
    ids = [list(range(10, 30)), [7]]
    cut = windows_for(ids, 8, bos_id=1)
    assert cut.truncated == 1 and cut.dropped_tokens == 13 and cut.tokens == 7 + 1
    win = windows_for(ids, 8, bos_id=1, long_text="window", stride=3)
    assert win.truncated == 1 and win.tokens == 20 + 1  # every target once
    scored = []  # absolute positions of scored targets of text 0
    begin = 0
    for w in [w for w in win.windows if w.text == 0]:
        scored += [begin + t for t in range(w.first, len(w.ids))]
        begin += 3
    assert scored == list(range(1, 21))
    assert windows_for(ids, 8, None).tokens == 7 + 0  # no start token: 1-token text has no target
    with pytest.raises(ConfigError, match="--stride only applies"):
        windows_for(ids, 8, 1, stride=4)
    for bad in (0, 9):
        with pytest.raises(ConfigError, match="between 1 and"):
            windows_for(ids, 8, 1, long_text="window", stride=bad)


def test_window_context_matches_truncation_where_they_overlap(tiny):
    loaded = tiny("gpt2")  # 64 positions
    long = " ".join(["the cat sat on the mat and looked at the dog"] * 12)
    cut = _prepared(loaded, [long])
    win = _prepared(loaded, [long], long_text="window", stride=16)
    assert cut.truncated == win.truncated == 1 and win.tokens > cut.tokens
    a, _ = score(loaded, cut)
    b, _ = score(loaded, win)
    _close([a[0]], [b[0][: len(a[0])]])  # first window = the truncated text


# --- exact identities ---------------------------------------------------------------------


@pytest.mark.parametrize("family", CAUSAL)
@pytest.mark.parametrize("shape", ["linear", "exponential", "alibi"])
def test_relative_one_pass_equals_prefix_by_prefix(tiny, family, shape):
    loaded = tiny(family)
    prepared = _prepared(loaded)
    for sem in SEMS:
        fast, how = score(loaded, prepared, shape, sem, "relative")
        slow, how_slow = score(loaded, prepared, shape, sem, "relative", fast=False)
        assert how.passes == "one-pass" and how_slow.passes == "prefix-by-prefix"
        _close(fast, slow)


@pytest.mark.parametrize("family", CAUSAL)
@pytest.mark.parametrize("shape", ["linear", "exponential", "alibi"])
def test_legacy_study_is_a_self_only_pass(tiny, family, shape):
    loaded = tiny(family)
    prepared = _prepared(loaded)
    fast, how = score(loaded, prepared, shape, "legacy", "study")
    assert how.computation == "self/boolean/relative" and how.passes == "one-pass"
    slow, how_slow = score(loaded, prepared, shape, "legacy", "study", fast=False)
    assert how_slow.passes == "prefix-by-prefix" and how_slow.attention.mode == "keys"
    _close(fast, slow)
    plain, _ = score(loaded, prepared)
    assert not torch.allclose(torch.cat(fast), torch.cat(plain), atol=1e-3)  # it is not the model
    relative, _ = score(loaded, prepared, shape, "legacy", "relative")  # self-only as well
    _close(relative, fast)


@pytest.mark.parametrize("family", CAUSAL)
def test_boolean_equals_default_under_both_protocols(tiny, family):
    loaded = tiny(family)
    prepared = _prepared(loaded)
    plain, _ = score(loaded, prepared)
    for protocol in ("relative", "study"):
        for shape in ("linear", "exponential"):
            slow, how = score(loaded, prepared, shape, "boolean", protocol, fast=False)
            assert how.attention is not None
            _close(slow, plain)
            assert plan(shape, "boolean", protocol).attention is None


@pytest.mark.parametrize("family", CAUSAL)
@pytest.mark.parametrize("sem", ["log-bias", "scale"])
def test_soft_semantics_differ_between_protocols(tiny, family, sem):
    loaded = tiny(family)
    prepared = _prepared(loaded)
    rel, _ = score(loaded, prepared, "linear", sem, "relative")
    study, _ = score(loaded, prepared, "linear", sem, "study")
    # a text's first target is predicted from a single key: the same under both
    assert all(torch.allclose(r[:1], s[:1], atol=1e-5) for r, s in zip(rel, study, strict=True))
    assert (torch.cat(rel) - torch.cat(study)).abs().max() > 1e-5


def test_default_mask_is_plain_evaluation_exactly(tiny, tmp_path):
    from pecli.experiments import EXPERIMENTS, perplexity  # noqa: F401 (registers it)
    from pecli.measures.lm_scoring import score_windows

    loaded = tiny("gpt2")
    pd.DataFrame({"text": TEXTS}).to_csv(tmp_path / "t.csv", index=False)
    tables = EXPERIMENTS.get("perplexity").run_with(
        dict(dataset=str(tmp_path / "t.csv"), mask="default", mask_semantics=SEMS,
             protocol=["relative", "study"]), "test", loaded=loaded)
    prepared = _prepared(loaded)
    with torch.inference_mode():
        plain = score_windows(loaded, prepared.windows)  # no attention switch at all
    want = aggregate(plain)
    got = tables["perplexity"]
    assert len(got) == 4 * 2 * 4
    for agg, value in want.items():
        assert (got.loc[got["aggregation"] == agg, "value"] == value).all()  # bit for bit


# --- batching and padding -----------------------------------------------------------------


@pytest.mark.parametrize("family", CAUSAL)
def test_batch_size_and_padding_side_do_not_matter(tiny, family):
    loaded = tiny(family)
    prepared = _prepared(loaded)
    for shape, sem, protocol in [("default", "legacy", "relative"), ("linear", "log-bias", "relative"),
                                 ("linear", "scale", "study")]:
        ref, _ = score(loaded, prepared, shape, sem, protocol, batch_size=1)
        for bs in (4, 16):
            for side in ("right", "left"):
                got, _ = score(loaded, prepared, shape, sem, protocol, batch_size=bs, side=side)
                _close(got, ref)


# --- evaluate's mean_perplexity, written independently ------------------------------------


def _evaluate_style(model, tokenizer, texts, batch_size=3, add_start_token=True):
    """A straightforward re-statement of evaluate's perplexity loop (right padding to the
    batch's longest, start token prepended, CrossEntropyLoss masked, exp of the mean)."""
    enc = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    ppls = []
    for start in range(0, len(texts), batch_size):
        ids = enc["input_ids"][start:start + batch_size]
        att = enc["attention_mask"][start:start + batch_size]
        if add_start_token:
            bos = torch.full((ids.shape[0], 1), tokenizer.bos_token_id)
            ids, att = torch.cat([bos, ids], 1), torch.cat([torch.ones_like(bos), att], 1)
        with torch.no_grad():
            logits = model(ids, attention_mask=att).logits
        loss = torch.nn.CrossEntropyLoss(reduction="none")(logits[:, :-1].transpose(1, 2), ids[:, 1:])
        m = att[:, 1:]
        ppls += torch.exp((loss * m).sum(1) / m.sum(1)).tolist()
    return float(np.mean(ppls)), ppls


@pytest.mark.parametrize("family", CAUSAL)
@pytest.mark.parametrize("start", [True, False])
def test_mean_per_text_is_evaluates_mean_perplexity(tiny, family, start):
    loaded = tiny(family)
    loaded.tokenizer.padding_side = "right"
    texts = TEXTS[:-1]  # evaluate refuses one-token texts without a start token
    want, per_text = _evaluate_style(loaded.model, loaded.tokenizer, texts, add_start_token=start)
    nlls, _ = score(loaded, _prepared(loaded, texts, bos=start))
    got = aggregate(nlls)
    assert got["mean_per_text"] == pytest.approx(want, rel=1e-5)
    assert [math.exp(x.double().mean()) for x in nlls] == pytest.approx(per_text, rel=1e-5)


def test_encoders_are_refused(tiny):
    loaded = tiny("bert")
    with pytest.raises(ModelError, match="needs a causal LM"):
        score(loaded, windows_for([[5, 6, 7]], 64, None), "linear", "log-bias", "study")



def test_an_interrupted_grid_resumes_its_finished_computations(tiny, tmp_path, monkeypatch):
    import pecli.measures.lm_scoring
    from pecli.experiments import perplexity as exp

    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path))
    loaded = tiny("gpt2")
    pd.DataFrame({"text": TEXTS}).to_csv(tmp_path / "t.csv", index=False)
    grid = exp.PerplexityOptions.build(dict(
        dataset=str(tmp_path / "t.csv"), intervention=["intact", "zero"], mask="linear",
        mask_semantics="log-bias", protocol=["relative", "study"]), "test")
    full = exp.run(grid, loaded=loaded)  # 5 computations: the intact baseline (intact, default) + 2 x 2
    real, calls = pecli.measures.lm_scoring.score, []

    def interrupted_in_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pecli.measures.lm_scoring, "score", interrupted_in_the_third)
    with pytest.raises(KeyboardInterrupt):
        exp.run(grid, loaded=loaded)
    [saved] = (tmp_path / "partial").glob("perplexity-*.npz")
    calls.clear()
    monkeypatch.setattr(pecli.measures.lm_scoring, "score", lambda *a, **k: calls.append(1) or real(*a, **k))
    resumed = exp.run(grid, loaded=loaded)
    assert len(calls) == 3 and not saved.exists()  # only the unfinished three were computed
    for name in ("perplexity", "texts"):
        pd.testing.assert_frame_equal(resumed[name], full[name])


# --- the study's E2/E3 grid and intervals --------------------------------------------------


def test_conditions_put_the_intact_baseline_first_and_read_e3_without_pe():
    from pecli.experiments.options.perplexity import PerplexityOptions
    from pecli.experiments.perplexity import conditions

    def pairs(intervention, mask, semantics="legacy", protocol="relative"):
        options = PerplexityOptions.build(dict(intervention=intervention, mask=mask,
                                               mask_semantics=semantics, protocol=protocol), "t")
        return [(str(p.intervention), str(p.mask)) for p in conditions(options)]

    assert pairs(None, "default") == [("intact", "default")]
    assert pairs(None, "linear") == [("intact", "default"), ("zero", "default"), ("zero", "linear")]
    # an explicit intervention keeps its meaning, after the baseline
    assert pairs("zero", "linear") == [("intact", "default"), ("zero", "linear")]
    assert pairs(["intact", "zero"], ["default", "linear"]) == [
        ("intact", "default"), ("intact", "linear"), ("zero", "default"), ("zero", "linear")]
    assert len(pairs(None, "linear", "legacy,log-bias", "study")) == 6


def test_intervals_of_every_aggregation_by_hand():
    from pecli.experiments.perplexity import intervals
    from pecli.measures.metrics import aggregate

    gen = torch.Generator().manual_seed(0)
    nlls = [torch.rand(int(n), generator=gen) * 6 for n in torch.randint(1, 30, (40,), generator=gen)]
    nlls.append(torch.zeros(0))  # a text with no scored token: left out
    point, ci = aggregate(nlls), intervals(nlls, 2000, seed=3)
    for agg in point:
        assert ci[agg][0] < point[agg] < ci[agg][1], agg
    # by hand: the same resamples of the 40 scored texts, each statistic recomputed
    idx = np.random.default_rng(3).integers(0, 40, size=(2000, 40))
    scored = [x.double().numpy() for x in nlls[:40]]
    sums = np.array([x.sum() for x in scored])
    counts = np.array([x.size for x in scored])
    exps = np.array([np.exp(x).sum() for x in scored])
    ppl = np.exp(sums / counts)
    by_hand = {"corpus": np.exp(sums[idx].sum(1) / counts[idx].sum(1)),
               "mean_per_text": ppl[idx].mean(1), "median_per_text": np.median(ppl[idx], 1),
               "mean_per_token": exps[idx].sum(1) / counts[idx].sum(1)}
    for agg, stats in by_hand.items():
        np.testing.assert_allclose(ci[agg], np.percentile(stats, [2.5, 97.5]), rtol=1e-9)
    assert intervals(nlls, 2000, seed=3) == ci  # deterministic
    assert all(np.isnan(v).all() for v in intervals(nlls, 0, seed=3).values())


def test_the_difference_from_intact_is_a_paired_bootstrap_by_hand():
    from pecli.measures.intervals import paired_perplexity

    gen = torch.Generator().manual_seed(1)
    lengths = [int(n) for n in torch.randint(1, 30, (40,), generator=gen)]
    intact = [torch.rand(n, generator=gen) * 6 for n in lengths]
    # a condition 0.1 nats worse on every token, plus per-text noise the texts share
    zero = [x + 0.1 + 0.05 * torch.rand(1, generator=gen) for x in intact]
    got = paired_perplexity(zero, intact, 2000, seed=3)
    # by hand: the same 2000 resamples of the 40 texts for both conditions, difference per resample
    idx = np.random.default_rng(3).integers(0, 40, size=(2000, 40))
    s1, s0 = (np.array([x.double().sum().item() for x in xs]) for xs in (zero, intact))
    n = np.array(lengths, np.float64)
    diffs = np.exp(s1[idx].sum(1) / n[idx].sum(1)) - np.exp(s0[idx].sum(1) / n[idx].sum(1))
    corpus = got["corpus"]
    assert corpus["diff_vs_intact"] == pytest.approx(np.exp(s1.sum() / n.sum()) - np.exp(s0.sum() / n.sum()),
                                                     rel=1e-12)
    np.testing.assert_allclose([corpus["diff_ci_low"], corpus["diff_ci_high"]],
                               np.percentile(diffs, [2.5, 97.5]), rtol=1e-9)
    # paired: far narrower than the two conditions' own intervals, and away from zero
    from pecli.experiments.perplexity import intervals

    own = intervals(zero, 2000, 3)["corpus"]
    assert 0 < corpus["diff_ci_low"] and corpus["diff_ci_high"] - corpus["diff_ci_low"] < (own[1] - own[0]) / 3
    assert np.isnan(got["median_per_text"]["diff_ci_low"])
    assert all(np.isnan(v).all() for d in paired_perplexity(intact, None, 2000, 3).values() for v in d.values())


def test_study_values_only_for_the_studys_model_and_data():
    from pecli.experiments.perplexity import _study_value

    def value(model, data, pe, mask, semantics):
        return _study_value(model, data, plan(mask, semantics, "study", pe))

    assert value("gpt2", "truthfulqa", "intact", "default", "boolean") == 111.2409
    assert value("gpt2", "truthfulqa", "zero", "linear", "legacy") == 11897.4824
    assert np.isnan(value("gpt2", "truthfulqa", "zero", "linear", "log-bias"))
    assert np.isnan(value("random:gpt2", "truthfulqa", "intact", "default", "legacy"))
    assert np.isnan(value("gpt2", "imdb", "intact", "default", "legacy"))
