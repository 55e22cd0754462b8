"""Fine-tuning with positions removed (`pecli finetune`): deterministic per seed, the position
table kept as the condition set it, intervals over seeds as written."""

from __future__ import annotations

import math

import pytest
import torch

from pecli.measures.finetuning import (
    steps_to_within,
    train_classifier,
    train_lm,
)
from pecli.models.architectures import position_embedding
from pecli.positions.interventions import intervene

TEXTS = [[101, 7, 8, 9, 10, 102], [101, 11, 12, 102], [101, 13, 14, 15, 16, 17, 102],
         [101, 18, 19, 102], [101, 20, 21, 22, 102], [101, 23, 24, 25, 26, 102]]
LABELS = [0, 1, 0, 1, 0, 1]


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _classify(loaded, seed):
    return train_classifier(loaded, TEXTS, LABELS, epochs=2, batch=2, lr=1e-3, head_lr=1e-2,
                            seed=seed, train_layers=None)


def test_the_encoder_trains_the_same_twice_for_a_seed_and_keeps_zero_zero(tiny):
    runs = []
    for _ in range(2):
        loaded = tiny("bert")  # the same initial weights (seeded)
        table = position_embedding(loaded.model, loaded.spec)
        own = table.weight.detach().clone()
        with intervene(loaded, "zero"):
            head = _classify(loaded, seed=3)
            assert torch.equal(table.weight, torch.zeros_like(table.weight))  # zero stayed zero
        assert torch.equal(table.weight, own)  # and the model's own table is back, untrained
        runs.append((_weights(loaded.model), _weights(head)))
    (w1, h1), (w2, h2) = runs
    assert all(torch.equal(w1[k], w2[k]) for k in w1) and all(torch.equal(h1[k], h2[k]) for k in h1)
    loaded = tiny("bert")
    before = _weights(loaded.model)
    with intervene(loaded, "zero"):
        other = _weights(_classify(loaded, seed=4))
    assert any(not torch.equal(other[k], h1[k]) for k in other)  # another seed, another head
    moved = [k for k in before if not torch.equal(before[k], loaded.model.state_dict()[k])]
    assert "embeddings.word_embeddings.weight" in moved  # full fine-tuning
    assert "embeddings.position_embeddings.weight" not in moved


def test_last_layers_fine_tuning_trains_only_them(tiny):
    loaded = tiny("bert")
    before = _weights(loaded.model)
    train_classifier(loaded, TEXTS, LABELS, epochs=1, batch=2, lr=1e-3, head_lr=1e-2, seed=0,
                     train_layers=1)
    moved = {k for k in before if not torch.equal(before[k], loaded.model.state_dict()[k])}
    assert moved and all(k.startswith("encoder.layer.1.") for k in moved)


def test_the_causal_lm_trains_the_same_twice_for_a_seed(tiny):
    seqs = [list(range(3, 3 + n)) for n in (12, 9, 15, 7, 11, 8)]
    results = []
    for _ in range(2):
        loaded = tiny("llama")
        evals = iter(range(100))
        with intervene(loaded, "zero"):
            curve = train_lm(loaded, seqs, steps=4, batch=3, lr=1e-3, seed=5, eval_every=2,
                             evaluate=lambda it=evals: float(next(it)))
        results.append((_weights(loaded.model), curve))
    (w1, c1), (w2, c2) = results
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert [s for s, _, _ in c1] == [0, 2, 4] and math.isnan(c1[0][1])
    assert [x[1] for x in c1[1:]] == [x[1] for x in c2[1:]]  # the same training losses


def test_steps_to_within_is_the_first_step_at_or_below_the_target():
    assert steps_to_within([(0, 300.0), (10, 120.0), (20, 108.0), (30, 100.0)], 110.0) == 20.0
    assert math.isnan(steps_to_within([(0, 300.0)], 110.0))


def test_over_seeds_gives_the_seeds_mean_in_every_per_seed_statistic():
    """train lm's length.csv held seed 0's `perplexity` beside the seeds' mean `value` (issue 44)."""
    import numpy as np
    import pandas as pd

    from pecli.measures.training import over_seeds

    by_seed = pd.DataFrame({"model": "m", "seed": [0, 1, 2], "value": [18.0, 17.0, 16.0],
                            "perplexity": [18.0, 17.0, 16.0], "nll_mean": np.log([18.0, 17.0, 16.0]),
                            "model_revision": "r", "diff_vs_intact": [5.6, 7.0, 6.1],
                            "diff_ci_low": [4.8, 6.0, 5.0], "diff_ci_high": [6.8, 8.0, 7.0]})
    row = over_seeds(by_seed, ["model"]).iloc[0]
    assert row["value"] == row["perplexity"] == 17.0
    assert row["nll_mean"] == pytest.approx(np.log([18.0, 17.0, 16.0]).mean(), rel=1e-12)
    # seed 0's paired difference is not the mean's: train lm's positions table showed it so
    assert np.isnan(row[["diff_vs_intact", "diff_ci_low", "diff_ci_high"]].astype(float)).all()


def test_a_conditions_fine_tuning_rows_carry_its_difference_from_intact_seed_by_seed():
    """Each seed against intact's same seed (paired over the same texts); the mean over seeds
    with seeds and texts crossed: one draw of texts serves every seed, written out here."""
    import numpy as np

    from pecli.experiments.finetune import _with_paired
    from pecli.measures.intervals import paired_proportion_difference
    from pecli.runs import names

    rng = np.random.default_rng(2)
    intact = [rng.integers(0, 2, 30).astype(float) for _ in range(3)]
    zero = [rng.integers(0, 2, 30).astype(float) for _ in range(3)]
    rows = [{"metric": "finetune_accuracy", "value": z.mean()} for z in zero]
    rows.append({"metric": "finetune_accuracy_mean", "value": np.mean([z.mean() for z in zero])})
    cond = names.parse(names.INTERVENTIONS, "zero")
    out = _with_paired(rows, zero, intact, cond, seed=4)
    for r, z, i in zip(out[:-1], zero, intact, strict=True):  # each seed: Newcombe's, texts right or wrong
        assert (r["diff_vs_intact"], r["diff_ci_low"], r["diff_ci_high"]) == paired_proportion_difference(z, i)
    d = np.array([z - i for z, i in zip(zero, intact, strict=True)])  # [seed, text]
    g = np.random.default_rng(4)
    texts = g.integers(0, 30, (1000, 30))
    within = np.stack([d[s][texts].mean(1) for s in range(3)], 1)  # [B, seed]
    seeds = g.integers(0, 3, (1000, 3))
    stats = np.take_along_axis(within, seeds, 1).mean(1)
    assert out[-1]["diff_vs_intact"] == pytest.approx(d.mean())
    np.testing.assert_allclose([out[-1]["diff_ci_low"], out[-1]["diff_ci_high"]],
                               np.percentile(stats, [2.5, 97.5]), rtol=1e-12)
    same = _with_paired(rows, intact, intact, names.parse(names.INTERVENTIONS, "intact"), seed=4)
    assert all(math.isnan(r["diff_vs_intact"]) for r in same)  # intact's own rows
