"""The ablate experiment on tiny models of every family: exact checks that can fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pecli.experiments.ablate import measure, tables
from pecli.measures.intervals import wilson
from pecli.measures.metrics import random_pair_cosines, z_score
from pecli.measures.probes import probe_accuracy
from pecli.models.architectures import ARCHITECTURES
from pecli.positions.interventions import intervene

FAMILIES = ARCHITECTURES.names()
# Lengths from 2 to ~40 tokens.
TEXTS = [
    "a short one",
    "The film was long, slow and in the end rather pointless for everyone involved.",
    "Good.",
    "I liked the music and the acting but the plot had holes big enough to drive through, "
    "and the ending made no sense at all to me or to my friends.",
    "Two words",
    "An average movie with an average cast and an average script.",
    "What a ride",
]



def _by_token(m, name):
    """Final- and every-layer cosines keyed by (text, position), independent of batching."""
    order = np.lexsort((m.position, m.text))
    return m.cosine[name][:, order], m.text[order], m.position[order]


@pytest.mark.parametrize("family", FAMILIES)
def test_intact_vs_intact_is_one_for_every_token(family, tiny):
    loaded = tiny(family)
    m = measure(loaded, TEXTS, ["intact"])
    assert m.cosine["intact"].shape == (loaded.model.config.num_hidden_layers + 1, m.tokens)  # embeddings + layers
    np.testing.assert_allclose(m.cosine["intact"], 1.0, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_size_and_padding_do_not_change_results(family, tiny):
    # larger weights: a tiny random Llama at the default init barely attends by position
    loaded = tiny(family, initializer_range=0.3) if ARCHITECTURES.get(family).position != "learned" \
        else tiny(family)
    name = "zero"
    ref = measure(loaded, TEXTS, [name], batch_size=1)  # no padding at all
    for bs in (None, 3, len(TEXTS)):
        other = measure(loaded, TEXTS, [name], batch_size=bs)
        a, ta, pa = _by_token(ref, name)
        b, tb, pb = _by_token(other, name)
        assert np.array_equal(ta, tb) and np.array_equal(pa, pb)
        np.testing.assert_allclose(a, b, atol=2e-5)
    # the cosines are not all 1: the check above compares something that moved
    assert ref.cosine[name][-1].min() < 0.999


@pytest.mark.parametrize("family", FAMILIES)
def test_measure_restores_the_model(family, tiny):
    loaded = tiny(family)
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    from pecli.runs.names import INTERVENTIONS

    names = [n for n in ("zero", "shuffle", "reverse", "sinusoidal")
             if loaded.spec.position in INTERVENTIONS.get(n).applies_to]
    measure(loaded, TEXTS, names, pooled=True)
    for key, value in loaded.model.state_dict().items():
        assert torch.equal(before[key], value), key


def _final(loaded, ids):
    with torch.inference_mode():
        return loaded.model.base_model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_zero_makes_a_bidirectional_encoder_permutation_equivariant(family, tiny):
    loaded = tiny(family)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 300, (1, 20), generator=gen)  # [1, 20]
    perm = torch.randperm(20, generator=gen)
    with intervene(loaded, "zero"):
        out, out_perm = _final(loaded, ids), _final(loaded, ids[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-5, rtol=0)
    # with its own positions the same model is not equivariant
    out, out_perm = _final(loaded, ids), _final(loaded, ids[:, perm])
    assert (out_perm - out[:, perm]).abs().max() > 1e-2


def test_zero_makes_the_causal_model_differ_from_learned(tiny):
    # the decoder under zero is not equivariant (causal mask), but it must change
    m = measure(tiny("gpt2"), TEXTS, ["zero"])
    assert m.cosine["zero"][-1].mean() < 0.99


def test_tables_schema_and_numbers(tiny):
    loaded = tiny("bert")
    m = measure(loaded, TEXTS, ["zero"], pooled=True)
    labels = [0, 1, 0, 1, 0, 1, 0] * 2
    pooled = {k: np.concatenate([v, v + 0.01]) for k, v in m.pooled.items()}  # 14 rows
    probe = probe_accuracy(pooled, labels, seed=0)
    out = tables(m, {"model": "tiny", "model_id": "tiny", "model_revision": "x",
                     "random_init": True, "device": "cpu", "dtype": "float32",
                     "dataset": "t", "split": "s", "rows": len(TEXTS)},
                 seed=0, baseline_pairs=500, probe_rows=probe)
    main = out["ablate"]
    final = main[(main.final_layer) & (main.special_tokens == "included")].set_index("metric")["value"]
    cos = m.cosine["zero"][-1]
    assert final["cosine_mean"] == pytest.approx(cos.mean())
    assert final["cosine_median"] == pytest.approx(np.median(cos))
    assert final["token_count"] == m.tokens == len(cos)
    assert final["z_score"] == pytest.approx(z_score(cos.mean(), random_pair_cosines(32, 500, 0)))
    excl = main[(main.final_layer) & (main.special_tokens == "excluded")].set_index("metric")["value"]
    assert excl["token_count"] == m.tokens - 2 * len(TEXTS)  # [CLS] and [SEP] per text
    assert set(main.layer) == {0, 1, 2}
    pos = out["ablate_positions"]
    assert pos["tokens"].sum() == m.tokens and pos.position.min() == 0
    hist = out["ablate_random"]
    assert hist[hist.metric == "random_cosine_hist_count"]["value"].sum() == 500
    pr = out["ablate_probe"].set_index(["intervention", "metric"])["value"]
    assert 0 <= pr[("zero", "probe_accuracy")] <= 1 and ("zero", "probe_accuracy_transfer") in pr
    for df in out.values():
        assert df["git_commit"].notna().all() and (df["experiment"] == "ablate").all()


def test_tight_batches_cover_every_text_once_within_budget_and_waste():
    from pecli.experiments.ablate import tight_batches

    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 300, size=500).tolist()
    batches = tight_batches(lengths, token_budget=2048, max_waste=0.15, min_tokens=256)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(500))
    for b in batches:
        longest = max(lengths[i] for i in b)
        assert len(b) * longest <= 2048 or len(b) == 1
        real = sum(lengths[i] for i in b)
        # a batch is only allowed waste beyond the bound while it is still small
        assert 1 - real / (len(b) * longest) <= 0.15 or real - min(lengths[i] for i in b) < 256
    # 64 short questions are no longer one batch padded to the longest
    short = rng.integers(5, 34, size=64).tolist()
    tight = tight_batches(short, 4096)
    padded = sum(len(b) * max(short[i] for i in b) for b in tight)
    one_batch = len(short) * max(short)  # what length_batches does here
    assert padded < 1.3 * sum(short) < one_batch and len(tight) < 8


def test_an_interrupted_run_resumes_to_the_same_numbers(tiny, tmp_path, monkeypatch):
    import pecli.measures.metrics

    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path))
    loaded, names = tiny("bert"), ["zero", "shuffle"]
    full = measure(loaded, TEXTS, names, batch_size=2, pooled=True, checkpoint_every=None)
    real, calls = pecli.measures.metrics.cosine_by_layer, []

    def interrupted_at_the_fifth(*args):  # two interventions per batch: dies in batch 3
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(pecli.measures.metrics, "cosine_by_layer", interrupted_at_the_fifth)
    with pytest.raises(KeyboardInterrupt):
        measure(loaded, TEXTS, names, batch_size=2, pooled=True, checkpoint_every=0)
    [saved] = (tmp_path / "partial").glob("ablate-*.npz")
    calls.clear()
    monkeypatch.setattr(pecli.measures.metrics, "cosine_by_layer", lambda *a: calls.append(1) or real(*a))
    resumed = measure(loaded, TEXTS, names, batch_size=2, pooled=True, checkpoint_every=0)
    assert len(calls) == 2 * (4 - 2)  # 7 texts in 4 batches; the first 2 were not redone
    assert not saved.exists()  # a finished run leaves no partial file
    for attr in ("text", "position", "special"):
        np.testing.assert_array_equal(getattr(resumed, attr), getattr(full, attr))
    for name in names:
        np.testing.assert_array_equal(resumed.cosine[name], full.cosine[name])
    for name in ["intact", *names]:
        np.testing.assert_array_equal(resumed.pooled[name], full.pooled[name])
    assert (resumed.layers, resumed.width, resumed.tokens) == (full.layers, full.width, full.tokens)


# --- in-model baselines and intervals ---------------------------------------------------


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_in_model_baselines_equal_a_direct_computation(family, tiny):
    from pecli.measures.baselines import sample_baseline_pairs

    loaded = tiny(family)
    special = set(loaded.tokenizer.all_special_ids)
    texts = TEXTS * 2
    ids = [loaded.tokenizer(t)["input_ids"] for t in texts]
    pairs = sample_baseline_pairs(ids, special, pairs=200, seed=5)
    (a_tp, b_tp), (a_ss, b_ss) = pairs["token_pair"].transpose(1, 0, 2), pairs["self_similarity"].transpose(1, 0, 2)
    assert len(a_tp) == 200 and len(a_ss) == 200
    tok = lambda x: np.array([ids[t][p] for t, p in x])  # noqa: E731
    assert (a_tp[:, 0] != b_tp[:, 0]).all() and (tok(a_tp) != tok(b_tp)).all()
    assert (a_ss[:, 0] != b_ss[:, 0]).all()
    assert (tok(a_ss) == tok(b_ss)).all()
    assert not set(tok(a_tp)) & special and not set(tok(a_ss)) & special
    assert pairs["token_pair"].tolist() == sample_baseline_pairs(ids, special, 200, 5)["token_pair"].tolist()
    assert len(set(a_tp[:, 0]) | set(b_tp[:, 0])) == len(texts)  # drawn over all texts

    # measure() keeps the sampled states from its own batches (several, unsorted by text);
    # independently: each text alone, every hidden state, cosine by numpy
    m = measure(loaded, texts, ["zero"], batch_size=3, seed=5, baseline_pairs=200)
    states = []
    with torch.inference_mode():
        for t in range(len(texts)):
            out = loaded.model.base_model(input_ids=torch.tensor([ids[t]]), output_hidden_states=True)
            states.append(np.stack([h[0].double().numpy() for h in out.hidden_states]))  # [l, t, d]
    for name, (a, b) in (("token_pair", (a_tp, b_tp)), ("self_similarity", (a_ss, b_ss))):
        u = np.stack([states[t][:, p] for t, p in a], 1)  # [l, pairs, d]
        v = np.stack([states[t][:, p] for t, p in b], 1)
        want = (u * v).sum(-1) / np.linalg.norm(u, axis=-1) / np.linalg.norm(v, axis=-1)
        cos, pair_texts = m.baselines[name]
        np.testing.assert_allclose(cos, want, atol=1e-5)
        assert pair_texts.tolist() == np.stack([a[:, 0], b[:, 0]], 1).tolist()
    # the same token elsewhere is more alike than two different tokens, at the embeddings
    assert m.baselines["self_similarity"][0][0].mean() > m.baselines["token_pair"][0][0].mean()


def test_self_similarity_draws_partners_uniformly_among_other_texts_occurrences():
    from pecli.measures.baselines import sample_baseline_pairs

    # id 7: twice in text 0, once in text 1, three times in text 2; 5 and 6 never repeat
    ids = [[101, 7, 5, 7, 102], [101, 7, 102], [101, 7, 7, 6, 7, 102]]
    ss = sample_baseline_pairs(ids, {101, 102}, pairs=6000, seed=1)["self_similarity"]
    anchors = {tuple(x) for x in ss[:, 0].tolist()}
    assert anchors == {(0, 1), (0, 3), (1, 1), (2, 1), (2, 2), (2, 4)}  # every 7, no 5 or 6
    from_text1 = ss[ss[:, 0, 0] == 1, 1]  # partners of text 1's 7: five occurrences elsewhere
    counts = {k: (from_text1 == k).all(1).sum() for k in [(0, 1), (0, 3), (2, 1), (2, 2), (2, 4)]}
    assert min(counts.values()) > 0.6 * len(from_text1) / 5  # uniform: about a fifth each


def test_tables_carry_baselines_and_intervals(tiny):
    from pecli.measures.intervals import pair_interval, ratio_interval

    loaded = tiny("bert")
    m = measure(loaded, TEXTS * 3, ["zero"], baseline_pairs=100)
    prov = {"model": "tiny", "model_id": "tiny", "model_revision": "x", "random_init": True,
            "device": "cpu", "dtype": "float32", "dataset": "t", "split": "s", "rows": 21}
    main = tables(m, prov, seed=0, baseline_pairs=100, bootstrap=300)["ablate"]
    rows = main.set_index(["intervention", "layer", "special_tokens", "metric"])
    tp_cos, tp_texts = m.baselines["token_pair"]
    ss_cos, ss_texts = m.baselines["self_similarity"]
    for layer in range(3):
        tp = rows.loc[("intact", layer, "excluded", "token_pair_cosine_mean")]
        ss = rows.loc[("intact", layer, "excluded", "self_similarity_mean")]
        assert tp["value"] == pytest.approx(tp_cos[layer].mean())
        assert ss["value"] == pytest.approx(ss_cos[layer].mean())
        assert (tp["ci_low"], tp["ci_high"]) == pytest.approx(
            pair_interval(tp_cos[layer], *tp_texts.T, 21, n_boot=300, seed=0))
        assert tp["ci_low"] < tp["value"] < tp["ci_high"]
        assert rows.loc[("intact", layer, "excluded", "self_similarity_std"), "value"] == \
            pytest.approx(ss_cos[layer].std())
        cos = rows.loc[("zero", layer, "included", "cosine_mean")]
        # the interval resamples texts: per-text sums and counts, computed here by hand
        c = m.cosine["zero"][layer]
        sums = np.array([c[m.text == t].sum() for t in range(21)])
        counts = np.array([(m.text == t).sum() for t in range(21)])
        # equal up to the order of the per-text sums (tokens come in batch order there)
        assert (cos["ci_low"], cos["ci_high"]) == pytest.approx(
            ratio_interval(sums, counts, n_boot=300, seed=0), rel=1e-12)
        assert cos["ci_low"] < cos["value"] < cos["ci_high"]
        between = rows.loc[("zero", layer, "included", "between_baselines")]
        assert between["value"] == pytest.approx((cos["value"] - tp["value"]) / (ss["value"] - tp["value"]))
        # its interval, by hand: the same resampled texts for all three means
        rng = np.random.default_rng(0)
        stats = []
        for idx in rng.integers(0, 21, size=(300, 21)):
            w = np.bincount(idx, minlength=21).astype(float)
            pw_tp, pw_ss = (w[t[:, 0]] * w[t[:, 1]] for t in (tp_texts, ss_texts))
            lo = (pw_tp * tp_cos[layer]).sum() / pw_tp.sum()
            hi = (pw_ss * ss_cos[layer]).sum() / pw_ss.sum()
            stats.append(((w @ sums) / (w @ counts) - lo) / (hi - lo))
        assert (between["ci_low"], between["ci_high"]) == pytest.approx(tuple(np.percentile(stats, [2.5, 97.5])))
    off = tables(m, prov, seed=0, baseline_pairs=100, bootstrap=0)["ablate"]
    assert off["ci_low"].isna().all()


def test_probe_accuracy_interval_contains_the_accuracy():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 40)
    x = y[:, None] + rng.standard_normal((80, 5))
    rows = probe_accuracy({"intact": x, "zero": rng.standard_normal((80, 5))}, y, seed=0, bootstrap=500)
    for r in rows:
        assert r["ci_low"] <= r["value"] <= r["ci_high"] and r["ci_high"] - r["ci_low"] > 0
        # each held-out text right or wrong: Wilson's interval over them
        assert (r["ci_low"], r["ci_high"]) == wilson(round(r["value"] * r["test_rows"]), r["test_rows"])


def test_baseline_pairs_degrade_to_none_when_impossible():
    from pecli.measures.baselines import sample_baseline_pairs

    one_id = sample_baseline_pairs([[101, 7, 7, 102], [101, 7, 102]], {101, 102}, pairs=50)
    assert len(one_id["token_pair"]) == 0 and len(one_id["self_similarity"]) == 50
    one_text = sample_baseline_pairs([[101, 5, 6, 102]], {101, 102}, pairs=50)
    assert len(one_text["token_pair"]) == 0 and len(one_text["self_similarity"]) == 0
    no_repeat = sample_baseline_pairs([[101, 5, 102], [101, 6, 102]], {101, 102}, pairs=50)
    assert len(no_repeat["token_pair"]) == 50 and len(no_repeat["self_similarity"]) == 0


def test_probe_rows_give_their_difference_from_the_intact_probe_paired_over_held_out_texts():
    """Each probe row's diff_vs_intact is its accuracy minus the intact probe's on intact
    features, with Newcombe's paired interval over the same held-out texts (each right or
    wrong; recomputed here with sklearn's pipeline and intervals.paired_proportion_difference);
    the intact row has none."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from pecli.measures.intervals import paired_proportion_difference
    from pecli.measures.probes import PROBE_TEST_FRACTION

    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 40)
    feats = {"intact": y[:, None] + rng.standard_normal((80, 5)),
             "zero": 0.3 * y[:, None] + rng.standard_normal((80, 5))}
    rows = probe_accuracy(feats, y, seed=3, bootstrap=500)
    train, test = train_test_split(np.arange(80), test_size=PROBE_TEST_FRACTION, random_state=3, stratify=y)
    fit = {c: make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(x[train], y[train])
           for c, x in feats.items()}
    right = {c: (fit[c].predict(x[test]) == y[test]).astype(float) for c, x in feats.items()}
    transfer = (fit["intact"].predict(feats["zero"][test]) == y[test]).astype(float)
    got = {(r["intervention"], r["metric"]): (r["diff_vs_intact"], r["diff_ci_low"], r["diff_ci_high"])
           for r in rows}
    assert np.isnan(got["intact", "probe_accuracy"]).all()
    assert got["zero", "probe_accuracy"] == paired_proportion_difference(right["zero"], right["intact"])
    assert got["zero", "probe_accuracy_transfer"] == paired_proportion_difference(transfer, right["intact"])
    assert got["zero", "probe_accuracy"][0] == pytest.approx(right["zero"].mean() - right["intact"].mean())
