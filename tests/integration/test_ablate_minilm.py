"""`ablate` on the real MiniLM and 20 IMDB reviews: finite numbers, cosine in (0, 1]."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_minilm_zero_on_imdb(minilm, shared_data):
    from pecli.data.datasets import load_data
    from pecli.experiments.ablate import measure, probe_accuracy, tables

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
