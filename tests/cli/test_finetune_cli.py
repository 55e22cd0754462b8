"""`pecli finetune` end to end: the causal LM's recovery curve and a saved checkpoint that
`pecli perplexity` and `pecli ablate` load with its hash as revision (and the same number);
the encoder's sentiment table beside the frozen-feature probe."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

TINY = "models/tiny-gpt2-imdb"


def test_lm_recovery_and_its_checkpoint(invoke, shared_data, imdb_revision, tmp_path):
    out, models = tmp_path / "ft", tmp_path / "models"
    r = invoke("finetune", TINY, "--intervention", "zero", "--steps", "4", "--eval-every", "2",
               "--seeds", "2", "--train-limit", "16", "--limit", "6", "--batch", "4",
               "--lr", "1e-3", "--model-out", str(models), "--out", str(out))
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "recovery.csv")
    assert (df["data_revision"] == imdb_revision["test"]).all()  # scored on the test split,
    assert (df["train_data_revision"] == imdb_revision["train"]).all()  # trained on the train split
    curve = df[(df["metric"] == "perplexity") & (df["seed_run"] == 0)].sort_values("step")
    assert curve["step"].tolist() == [0, 2, 4]
    intact = df[df["metric"] == "intact_perplexity"]["value"].item()
    within = df[df["metric"] == "steps_to_within_10pct"]
    for _, row in within.iterrows():  # the first evaluated step at or below 1.1 x intact
        seed = df[(df["metric"] == "perplexity") & (df["seed_run"] == row["seed_run"])]
        hits = seed[seed["value"] <= 1.1 * intact]["step"]
        assert (row["value"] == hits.min()) if len(hits) else row["value"] != row["value"]
    mean = df[(df["metric"] == "perplexity_mean") & (df["step"] == 4)]["value"].item()
    assert mean == pytest.approx(df[(df["metric"] == "perplexity") & (df["step"] == 4)]["value"].mean())

    ckpt = models / "zero"
    card = json.loads((ckpt / "pecli_training.json").read_text())
    assert card["intervention"] == "zero" and card["seed"] == 0
    revision = curve["checkpoint_revision"].iloc[0]
    assert revision.startswith("sha256:")
    # loaded back as a plain model: its (zero, trained) table is in the checkpoint, so its own
    # perplexity on the same held-out texts is the curve's last point
    r = invoke("perplexity", str(ckpt), "--dataset", "imdb", "--split", "test", "--limit", "6",
               "--out", str(tmp_path / "ppl"))
    assert r.exit_code == 0, r.output
    ppl = pd.read_csv(tmp_path / "ppl" / "perplexity.csv")
    row = ppl[ppl["aggregation"] == "corpus"].iloc[0]
    assert row["model_revision"] == revision
    assert row["value"] == pytest.approx(curve["value"].iloc[-1], rel=1e-5)
    r = invoke("ablate", str(ckpt), "--limit", "4", "--out", str(tmp_path / "ab"))
    assert r.exit_code == 0, r.output
    assert (pd.read_csv(tmp_path / "ab" / "ablate.csv")["model_revision"] == revision).all()


def test_encoder_sentiment_beside_the_probe(invoke, shared_data, imdb_revision, tmp_path, minilm):
    out = tmp_path / "ft"
    r = invoke("finetune", "minilm", "--intervention", "intact,zero", "--seeds", "2",
               "--train-limit", "16", "--limit", "8", "--max-length", "32", "--batch", "8",
               "--out", str(out))
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "finetune.csv")
    assert set(df["intervention"]) == {"intact", "zero"} and (df["condition"] == df["intervention"]).all()
    for _, part in df.groupby("intervention"):
        seeds = part[part["metric"] == "finetune_accuracy"]
        assert seeds["seed_run"].tolist() == [0, 1]
        mean = part[part["metric"] == "finetune_accuracy_mean"].iloc[0]
        assert mean["value"] == pytest.approx(seeds["value"].mean())
        assert mean["interval"].startswith("95 % two-level percentile bootstrap") or np.isnan(mean["ci_low"])
        assert not mean["ci_low"] > mean["value"] and not (mean["ci_low"] < 0 or mean["ci_high"] > 1)
        assert len(part[part["metric"] == "probe_accuracy"]) == 1
    assert df[df.intervention == "intact"]["diff_vs_intact"].isna().all()
    zero, intact = (df[df.intervention == c].set_index(["metric", "seed_run"]) for c in ("zero", "intact"))
    np.testing.assert_allclose(zero["diff_vs_intact"], zero["value"] - intact["value"], atol=1e-12)
    assert (df["fine_tuning"] == "full fine-tuning").all() and (df["test_rows"] == 8).all()
    assert (df["data_revision"] == imdb_revision["test"]).all()
    assert (df["train_data_revision"] == imdb_revision["train"]).all()
    assert (out / "figures" / "finetune.png").exists()
    alone = invoke("finetune", "minilm", "--intervention", "zero", "--seeds", "1", "--train-limit", "16",
                   "--limit", "8", "--max-length", "32", "--batch", "8", "--out", str(tmp_path / "alone"))
    assert alone.exit_code == 0, alone.output
    probe = pd.read_csv(tmp_path / "alone" / "finetune.csv").query("metric == 'probe_accuracy'")
    # the frozen-feature probe reads the untrained encoder, whatever was fine-tuned before it
    assert probe["value"].item() == df.query("metric == 'probe_accuracy' and intervention == 'zero'")["value"].item()


def _recovery(zero: float, low: float, high: float) -> pd.DataFrame:
    return pd.DataFrame({"model": "m", "rows": 48, "condition": ["intact, untrained", "zero", "zero"],
                         "metric": ["intact_perplexity", "perplexity_mean", "perplexity_mean"],
                         "step": [0, 0, 10], "value": [219.5, zero, 1.0],
                         "ci_low": [low, np.nan, np.nan], "ci_high": [high, np.nan, np.nan]})


@pytest.mark.parametrize("zero, low, high, warned", [
    (220.6, 196.7, 246.7, "barely relies"),  # the tiny stand-in's committed numbers
    (560.0, 196.7, 246.7, None),  # outside intact's interval: a gap worth recovering
    (220.6, np.nan, np.nan, "no interval over 48 texts")])
def test_finetune_says_how_much_the_model_relies_on_its_positions(zero, low, high, warned):
    from pecli.cli.finetune import reliance

    lines = reliance(_recovery(zero, low, high))
    assert lines[0] == f"reliance on positions: held-out perplexity 219.5 intact, {zero:.4g} without " \
                       f"({zero / 219.5 - 1:+.1%})"
    assert (len(lines) == 1) if warned is None else (warned in lines[1] and len(lines) == 2)
