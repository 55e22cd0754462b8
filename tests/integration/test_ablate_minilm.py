"""`ablate` on the real MiniLM and 20 IMDB reviews: finite numbers, cosine in (0, 1]."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_minilm_zero_on_imdb(minilm, shared_data):
    from pecli.data.datasets import load_data
    from pecli.experiments.ablate import measure, tables
    from pecli.measures.probes import probe_accuracy

    data = load_data("imdb", "test", data_dir_=shared_data, limit=20, seed=0)
    m = measure(minilm, data.texts(), ["zero"], pooled=True)
    cos = m.cosine["zero"]  # [7, n]
    assert cos.shape[0] == 7 and np.isfinite(cos).all()
    assert m.truncated == sum(len(minilm.tokenizer(t)["input_ids"]) > 512 for t in data.texts())
    probe = probe_accuracy(m.pooled, data.labels(), seed=0)
    out = tables(m, {**minilm.provenance(), **data.provenance()}, seed=0, baseline_pairs=2000,
                 probe_rows=probe)
    main = out["ablate"]
    final = main[main.final_layer & (main.special_tokens == "included")].set_index("metric")["value"]
    assert 0 < final["cosine_mean"] <= 1
    assert 0 < final["cosine_median"] <= 1
    # the study's point: far above chance (1/sqrt(384) = 0.051)
    assert final["z_score"] > 5 and final["percentile"] == 100.0
    means = main[(main.metric == "cosine_mean") & (main.special_tokens == "included")]
    assert means["value"].between(0, 1, inclusive="right").all()
    assert np.isfinite(out["ablate_probe"]["value"]).all()


def _exact_baselines(states: list[np.ndarray], ids: list[list[int]], special: set[int]):
    """token_pair and self_similarity under their stated definitions, exactly, over all
    texts: the mean over real tokens a of the mean cosine with every eligible partner b
    (token_pair: another text and another id; self_similarity: the same id in another
    text, a only where such a b exists), from sums of unit vectors. states: per text [l, t, d]."""
    rows = [(t, p, i) for t, x in enumerate(ids) for p, i in enumerate(x) if i not in special]
    text, pos, tok = (np.array(c) for c in zip(*rows, strict=True))
    u = np.stack([states[t][:, p] for t, p in zip(text, pos, strict=True)], 1)  # [l, n, d]
    u = u / np.linalg.norm(u, axis=-1, keepdims=True)

    def grouped(keys):  # at each token: the sum of unit vectors and the count of its group
        _, inv = np.unique(keys, axis=0, return_inverse=True)
        inv = inv.ravel()
        sums = np.zeros((u.shape[0], inv.max() + 1, u.shape[2]))
        for layer in range(u.shape[0]):
            np.add.at(sums[layer], inv, u[layer])
        return sums[:, inv], np.bincount(inv)[inv]

    total, n = u.sum(1, keepdims=True), u.shape[1]
    by_text, n_text = grouped(text[:, None])
    by_id, n_id = grouped(tok[:, None])
    by_both, n_both = grouped(np.stack([text, tok], 1))
    partners = total - by_text - by_id + by_both
    token_pair = ((partners * u).sum(-1) / (n - n_text - n_id + n_both)).mean(1)
    same = n_id - n_both > 0
    self_sim = (((by_id - by_both) * u).sum(-1)[:, same] / (n_id - n_both)[same]).mean(1)
    return token_pair, self_sim


def test_baseline_intervals_cover_the_exact_all_texts_value(minilm, shared_data):
    """The in-model baselines are estimated from pairs drawn over all texts, with intervals
    that resample texts; on 24 real reviews each interval covers the exact value under the
    stated definition, computed here from every token's state, at every layer."""
    import torch

    from pecli.data.datasets import load_data
    from pecli.experiments.ablate import measure, tables

    data = load_data("imdb", "test", data_dir_=shared_data, limit=24, seed=0)
    texts = [t[:600] for t in data.texts()]  # ~130 tokens each: the exact sums stay small
    m = measure(minilm, texts, ["zero"])
    main = tables(m, {**minilm.provenance(), **data.provenance()}, seed=0, baseline_pairs=100,
                  bootstrap=1000)["ablate"]
    ids = [minilm.tokenizer(t, truncation=True, max_length=512)["input_ids"] for t in texts]
    with torch.inference_mode():
        states = [np.stack([h[0].double().numpy() for h in minilm.model.base_model(
            input_ids=torch.tensor([x]), output_hidden_states=True).hidden_states]) for x in ids]
    exact = dict(zip(("token_pair_cosine_mean", "self_similarity_mean"),
                     _exact_baselines(states, ids, set(minilm.tokenizer.all_special_ids)), strict=True))
    for metric, values in exact.items():
        rows = main[main.metric == metric].sort_values("layer")
        assert len(rows) == 7
        for (_, r), want in zip(rows.iterrows(), values, strict=True):
            assert r.ci_low <= want <= r.ci_high, (metric, r.layer, r.ci_low, want, r.ci_high)
            assert r.ci_high - r.ci_low < 0.2  # an interval that says something
