"""`pecli mask fit` end to end on the tiny GPT-2: the file it writes is taken back by
`pecli perplexity --mask FILE` with the same numbers, and its rows' gap closed is the formula."""

from __future__ import annotations

import math

import pandas as pd
import pytest

TINY = "models/tiny-gpt2-imdb"


def test_fit_save_reuse(invoke, shared_data, imdb_revision, tmp_path):
    out = tmp_path / "fit"
    r = invoke("mask", "fit", TINY, "--form", "slope", "--steps", "3", "--batch", "4",
               "--train-limit", "8", "--limit", "6", "--max-length", "64", "--bootstrap", "100",
               "--out", str(out))
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "mask_fit.csv")
    gaps = df[df["metric"] == "gap_closed"]
    df = df[df["metric"] == "perplexity"]
    assert gaps["value"].tolist() == df["gap_closed"].tolist()  # the same number, by metric
    mask_file = out / "mask" / "mask.json"
    assert mask_file.exists()
    name = df["mask_file"].iloc[0]
    assert name.startswith(f"file:{mask_file}#sha256:")  # the final path, not the staging one
    assert list(df["condition"].unique()) == [
        "intact", "no positions", "linear (legacy)", "linear (boolean)", "linear (log-bias)",
        "linear (scale)", "alibi (log-bias)", "fitted (log-bias)"]
    assert set(df["dataset"]) == {"imdb", "truthfulqa"} and set(df["split"]) == {"test", "validation"}
    assert (df["train_data_revision"] == imdb_revision["train"]).all()  # fitted on the train split
    fitted = df[df["condition"] == "fitted (log-bias)"]
    assert (fitted["parameters"] == 4).all() and (fitted["mask"] == name).all()  # 4 heads, a slope each
    for _, part in df.groupby("dataset"):  # gap closed, literally, from the rows' perplexities
        by = part.set_index("condition")["value"]
        for cond, row in part.set_index("condition").iterrows():
            expect = ((math.log(by["no positions"]) - math.log(row["value"]))
                      / (math.log(by["no positions"]) - math.log(by["intact"])))
            assert row["gap_closed"] == pytest.approx(expect, rel=1e-9, abs=1e-9), cond
    assert (out / "figures" / "mask_fit_curve.png").exists()

    # the file, given back to perplexity as --mask: the same held-out number
    r = invoke("perplexity", TINY, "--intervention", "zero", "--mask", str(mask_file),
               "--mask-semantics", "log-bias", "--dataset", "truthfulqa", "--limit", "6",
               "--out", str(tmp_path / "ppl"))
    assert r.exit_code == 0, r.output
    ppl = pd.read_csv(tmp_path / "ppl" / "perplexity.csv")
    again = ppl[(ppl["mask"] == name) & (ppl["aggregation"] == "corpus")]["value"].item()
    ours = fitted[fitted["dataset"] == "truthfulqa"]["value"].item()
    # perplexity scores 128-token texts, mask fit 64: equal only where no text is longer
    short = df[df["dataset"] == "truthfulqa"]["truncated"].iloc[0] == 0
    assert short and again == pytest.approx(ours, rel=1e-6)


def test_mask_fit_prints_the_reliance_on_positions_and_warns_where_there_is_none():
    import pandas as pd

    from pecli.cli.mask import reliance

    df = pd.DataFrame({"model": "m", "dataset": ["imdb", "imdb", "truthfulqa", "truthfulqa"],
                       "condition": ["intact", "no positions"] * 2,
                       "value": [10.0, 28.0, 219.5, 220.6], "ci_low": [9.5, 27.0, 196.7, 197.5],
                       "ci_high": [10.5, 29.0, 246.7, 248.0]})
    lines = reliance(df)
    assert lines[0] == "reliance on positions, imdb: perplexity 10 intact, 28 without (+180.0%)"
    assert lines[1].startswith("reliance on positions, truthfulqa: perplexity 219.5 intact, 220.6 without (+0.5%)")
    assert len(lines) == 3 and lines[2].startswith("warning: m barely relies on its positions on truthfulqa")
