"""pecli compare / pecli.experiments.compare: gathers real run folders, refuses rows of different data."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from conftest import make_tiny
from typer.testing import CliRunner

from pecli.cli.app import app
from pecli.experiments.compare import gather, headline_rows
from pecli.runs.errors import DataError

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
REVIEWS = ["a fine film", "terrible acting and a worse plot", "I loved every minute of it",
           "boring", "the best thing I saw this year", "a waste of two hours",
           "charming and funny", "not worth it", "a small gem", "dull dull dull"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Real `pecli ablate` folders: two tiny BERTs on the same 8 reviews, one on all 10."""
    root = tmp_path_factory.mktemp("compare")
    for name, overrides in (("bertA", {}), ("bertB", {"hidden_size": 64})):
        loaded = make_tiny("bert", **overrides)
        loaded.model.save_pretrained(root / name)
        loaded.tokenizer.save_pretrained(root / name)
    pd.DataFrame({"text": REVIEWS, "label": [1, 0] * 5}).to_csv(root / "reviews.csv", index=False)
    for out, model, limit in (("runA", "bertA", 8), ("runB", "bertB", 8), ("runC", "bertB", 10)):
        result = runner.invoke(app, ["ablate", str(root / model), "--dataset", str(root / "reviews.csv"),
                                     "--limit", str(limit), "--pe", "zero,shuffle", "--probe",
                                     "--baseline-pairs", "100", "--bootstrap", "200",
                                     "--device", "cpu", "--out", str(root / out)])
        assert result.exit_code == 0, result.output
    return root


def test_gathers_the_headline_rows_of_two_runs(runs):
    table = gather([runs / "runA", runs / "runB"])
    cos = table[table.metric == "cosine_mean"]
    assert sorted(cos["run"]) == ["runA", "runA", "runB", "runB"]
    assert set(cos["condition"]) == {"zero", "shuffle"} and not table["mixed"].any()
    # the very numbers of each run's final layer, interval included
    own = pd.read_csv(runs / "runA" / "ablate.csv")
    want = own[(own.metric == "cosine_mean") & own.final_layer & (own.special_tokens == "included")]
    got = cos[cos.run == "runA"].set_index("condition")
    for _, row in want.iterrows():
        assert got.loc[row.intervention, "value"] == row.value
        assert got.loc[row.intervention, "ci_low"] == row.ci_low
    assert {"token_pair_cosine_mean", "self_similarity_mean", "between_baselines",
            "probe_accuracy"} <= set(table.metric)
    assert (table.groupby(["run", "metric", "condition"]).size() == 1).all()  # one number each


def test_refuses_runs_on_different_texts_with_the_reason(runs):
    with pytest.raises(DataError, match=r"cosine_mean rows are not comparable: runA has rows 8, runC has 10"):
        gather([runs / "runA", runs / "runC"])
    mixed = gather([runs / "runA", runs / "runC"], allow_mixed=True)
    assert mixed["mixed"].all()


def test_cli_writes_table_and_one_figure_per_metric(runs, tmp_path):
    result = runner.invoke(app, ["compare", str(runs / "runA"), str(runs / "runB"),
                                 "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    for metric in table.metric.unique():
        assert (tmp_path / "cmp" / "figures" / f"compare_{metric}.png").stat().st_size > 5000
    refused = runner.invoke(app, ["compare", str(runs / "runA"), str(runs / "runC")])
    assert refused.exit_code == 1 and refused.output.count("\n") == 1
    assert "--allow-mixed" in refused.output and "Traceback" not in refused.output


def test_committed_offline_runs_of_different_sizes_are_refused():
    e1 = ROOT / "results" / "offline"
    with pytest.raises(DataError, match="rows 500, e1-random-bert has 32"):
        gather([e1 / "e1-minilm", e1 / "e1-random-bert"])


def test_perplexity_rows_name_the_default_mask_once():
    rows = pd.DataFrame({
        "metric": "perplexity", "value": [1.0, 1.0, 2.0, 3.0], "model": "m",
        "intervention": ["learned", "learned", "zero", "zero"], "aggregation": "corpus",
        "mask": ["default", "default", "default", "linear"],
        "mask_semantics": ["legacy", "log-bias", "legacy", "legacy"], "protocol": "study"})
    assert headline_rows(rows)["condition"].tolist() == ["learned", "zero", "zero + linear/legacy (study)"]


def test_not_a_run_folder(tmp_path):
    with pytest.raises(DataError, match="holds no results tables"):
        gather([tmp_path])


def test_missing_cells_neither_match_nor_break_the_check(tmp_path):
    rows = pd.DataFrame({"metric": "cosine_mean", "value": [0.5, 0.6], "model": "m",
                         "intervention": "zero", "final_layer": [True, None],
                         "special_tokens": "included", "dataset": "d", "split": None,
                         "rows": [4, 4], "data_revision": "x"})
    assert headline_rows(rows)["value"].tolist() == [0.5]
    (tmp_path / "a").mkdir()
    rows.to_csv(tmp_path / "a" / "ablate.csv", index=False)
    assert not gather([tmp_path / "a"])["mixed"].any()
