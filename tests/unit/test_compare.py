"""pecli compare / pecli.experiments.compare: gathers real run folders, refuses rows of different data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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
    assert headline_rows(rows)["condition"].tolist() == ["intact", "zero", "zero + linear/legacy (study)"]  # learned: before 0.2


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


OFFLINE = ROOT / "results" / "offline"


def test_length_passkey_and_mc_runs_give_their_numbers_per_length_bucket_and_depth():
    """The committed SmolLM2 runs: every length x bucket and length x depth row is a
    headline of its own, with the very value and interval of its table, labelled with its
    interval's method."""
    table = gather([OFFLINE / "length-smollm2", OFFLINE / "passkey-smollm2", OFFLINE / "mc-smollm2"])
    assert set(table["metric"]) == {"length_perplexity", "passkey_accuracy", "mc1", "mc2", "mc1_norm"}
    length = pd.read_csv(OFFLINE / "length-smollm2" / "length.csv")
    got = table[table["metric"] == "length_perplexity"]
    assert len(got) == len(length.dropna(subset=["value"])) == 36  # 4 conditions x (8 buckets + all)
    row = got[(got["condition"] == "yarn:2")
              & (got["slot"] == "16,384 tokens, positions 14,336-16,384")].iloc[0]
    want = length[(length["rope_scaling"] == "yarn:2") & (length["window_start"] == 14336)
                  & ~length["all_positions"]].iloc[0]
    # the same cells, NaN where the table has no interval (3 windows: none from fewer than 10)
    np.testing.assert_array_equal(row[["value", "ci_low", "ci_high"]].astype(float),
                                  want[["value", "ci_low", "ci_high"]].astype(float))
    passkey = table[table["metric"] == "passkey_accuracy"]
    assert sorted(set(passkey["slot"])) == ["10,240 tokens, depth 0.5", "10,240 tokens, depth all",
                                            "4,096 tokens, depth 0.5", "4,096 tokens, depth all"]
    cell = passkey.set_index(["condition", "slot"]).loc[("intact", "10,240 tokens, depth 0.5")]
    keys = pd.read_csv(OFFLINE / "passkey-smollm2" / "passkey.csv", dtype={"depth": str})
    want = keys[(keys["rope_scaling"] == "none") & (keys["length"] == 10240) & (keys["depth"] == "0.5")].iloc[0]
    assert (cell["value"], cell["ci_low"], cell["ci_high"]) == (want["value"], want["ci_low"], want["ci_high"])
    assert want["value"] == want["correct"] / want["trials"] and want["trials"] >= 20
    methods = table.groupby("metric")["interval"].unique()
    assert list(methods["passkey_accuracy"]) == ["95 % Wilson score interval over trials"]
    assert list(methods["length_perplexity"]) == [""] and got["ci_low"].isna().all()  # 3 windows: none
    assert list(methods["mc1"]) == ["Wilson score interval over items"]  # the table's own method


def test_a_folder_without_headline_numbers_is_refused_never_dropped(tmp_path):
    with pytest.raises(DataError, match="pe-sinusoidal: no headline numbers compare can use"):
        gather([OFFLINE / "length-smollm2", OFFLINE / "pe-sinusoidal"])
    result = runner.invoke(app, ["compare", str(OFFLINE / "passkey-smollm2"), str(OFFLINE / "pe-sinusoidal"),
                                 "--out", str(tmp_path / "c")])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "pe-sinusoidal" in result.output
    # inside a reproduce folder, a section without headline numbers is named, not silently left out
    whole = gather([OFFLINE], allow_mixed=True)
    assert any(s.startswith("offline/pe-sinusoidal ") for s in whole.attrs["skipped"])
    assert {"length_perplexity", "passkey_accuracy", "mc1", "exact_match", "test_perplexity"} <= set(whole["metric"])


def test_the_interval_method_comes_from_the_rows_then_the_sidecar(tmp_path):
    rows = pd.DataFrame({"experiment": "lm-eval", "task": "t", "metric": ["acc", "acc"], "value": [0.5, 0.6],
                         "ci_low": [0.1, 0.2], "ci_high": [0.9, 0.9], "model": "m",
                         "intervention": ["learned", "zero"], "mask": "default", "mask_semantics": "legacy",
                         "rope_scaling": "none",
                         "interval_method": ["Wilson score interval over documents", "bootstrap over documents"]})
    got = headline_rows(rows)
    assert got["interval"].tolist() == ["Wilson score interval over documents", "bootstrap over documents"]
    assert got["metric"].tolist() == ["t_acc", "t_acc"] and got["condition"].tolist() == ["intact", "zero"]
    plain = rows.drop(columns=["interval_method", "task"]).assign(experiment="mc", metric="mc1")
    assert headline_rows(plain, "95 % sidecar method")["interval"].tolist() == ["95 % sidecar method"] * 2
    assert headline_rows(plain)["interval"].tolist() == ["95 % percentile bootstrap over items"] * 2


def test_mask_fit_and_finetune_tables_have_headlines():
    fit = pd.DataFrame({"experiment": "mask-fit", "metric": ["perplexity", "perplexity", "train_loss"],
                        "value": [40.0, 55.0, 1.0], "ci_low": [38.0, 52.0, None], "ci_high": [42.0, 58.0, None],
                        "model": "m", "condition": ["intact", "fitted mask", "x"], "dataset": "imdb",
                        "split": "test"})
    got = headline_rows(fit)
    assert got["metric"].tolist() == ["mask_fit_perplexity"] * 2
    assert got["condition"].tolist() == ["intact", "fitted mask"] and set(got["slot"]) == {"imdb/test"}
    tuned = pd.DataFrame({"experiment": "finetune", "task": "sentiment",
                          "metric": ["finetune_accuracy_mean", "finetune_accuracy"], "value": [0.8, 0.79],
                          "ci_low": [0.7, 0.75], "ci_high": [0.9, 0.83], "model": "m", "intervention": "zero",
                          "interval": ["Student t over 3 seeds", "Wilson over test texts"]})
    got = headline_rows(tuned)
    assert got["metric"].tolist() == ["finetune_accuracy_mean"] and got["interval"].tolist() == ["Student t over 3 seeds"]


def test_headlines_follow_the_registered_order_whatever_the_import_order(monkeypatch):
    """A table without an experiment column takes the first headline of its metric: that must
    not depend on which experiment module a process happened to import first."""
    from pecli.experiments import EXPERIMENTS, load_all
    from pecli.experiments.compare import headlines

    load_all()
    before = headlines()
    monkeypatch.setattr(EXPERIMENTS, "_entries", dict(reversed(list(EXPERIMENTS._entries.items()))))
    assert headlines() == before
    assert [n for n, h in before if h.metric == "perplexity"][0] == "perplexity"


# Experiments whose tables hold no number compare reads (refused in one line, test above)
NO_HEADLINES = {"pe-recover", "pe-sinusoidal", "pe-sinusoidal-512"}


@pytest.mark.parametrize("folder", sorted(p.name for p in OFFLINE.iterdir()
                                          if p.is_dir() and p.name != "figures"))
def test_every_committed_run_folder_compares_alone(folder):
    """One run's rows of different slots (a passkey depth and all depths, a mask fit's two
    held-out sets) are one run's, not two runs on different texts."""
    if folder in NO_HEADLINES:
        with pytest.raises(DataError, match="no headline numbers compare can use"):
            gather([OFFLINE / folder])
        return
    table = gather([OFFLINE / folder])
    assert len(table) and not table["mixed"].any()


def test_committed_run_folders_compare_with_others():
    """Runs of one experiment on the same texts gather without --allow-mixed, slot by slot;
    every folder together gathers with it (their data differ: e1-minilm 500 texts, e1-random-bert 32)."""
    table = gather([OFFLINE / "passkey-smollm2", OFFLINE / "remedies-passkey-smollm2",
                    OFFLINE / "bands-passkey-smollm2"])
    assert not table["mixed"].any() and table["run"].nunique() == 3
    everything = gather([OFFLINE], allow_mixed=True)
    assert {r.split("/")[-1] for r in everything["run"]} == {
        p.name for p in OFFLINE.iterdir() if p.is_dir() and p.name not in NO_HEADLINES | {"figures"}}


def test_compare_carries_no_zero_width_interval_from_a_table_written_before_the_rule():
    rows = pd.DataFrame({"experiment": "mc", "metric": ["mc1", "mc1"], "value": [0.0, 0.3],
                         "ci_low": [0.0, 0.2], "ci_high": [0.0, 0.4], "model": "m",
                         "intervention": ["learned", "zero"], "mask": "default",
                         "mask_semantics": "legacy", "rope_scaling": "none"})
    got = headline_rows(rows)
    assert got["ci_low"].isna().tolist() == [True, False] and got["ci_high"].isna().tolist() == [True, False]
    assert got["interval"].tolist() == ["", "95 % percentile bootstrap over items"]
