"""`pecli compare --against RUN`: each row's difference from the reference run's row, its
interval paired by draw where the two rows read the same samples, Newcombe's interval for
independent proportions where they share none, and no interval (with the reason) otherwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from pecli.cli.app import app
from pecli.experiments.compare import gather
from pecli.measures.intervals import (
    independent_mean_difference,
    independent_proportion_difference,
    paired_mean_difference,
    paired_proportion_difference,
)
from pecli.runs.errors import DataError

runner = CliRunner()
OFFLINE = Path(__file__).resolve().parents[2] / "results" / "offline"
CONDITION = {"intervention": "intact", "mask": "default", "mask_semantics": "legacy",
             "protocol": "relative", "rope_scaling": "none"}


def ruler_run(folder: Path, model: str, answers: list[str], right: list[float],
              condition: str = "intact", task: str = "niah_single_1", length: int = 1024) -> Path:
    """A ruler run folder as `pecli ruler` lays it out: ruler.csv (one accuracy row) beside
    ruler_samples.csv (one row per sample: its drawn answer and its recall)."""
    folder.mkdir(parents=True, exist_ok=True)
    cond = {**CONDITION, "intervention": "zero"} if condition == "zero" else CONDITION
    common = {"experiment": "ruler", "model": model, "dataset": "ruler", "split": "synthetic",
              "data_revision": "sha256:h", **cond, "condition": condition, "task": task, "length": length}
    samples = pd.DataFrame({**common, "metric": "recall", "sample": range(len(right)), "answers": answers,
                            "value": right, "note": ""})
    accuracy = pd.DataFrame([{**common, "metric": "accuracy", "value": float(np.mean(right)),
                              "ci_low": 0.1, "ci_high": 0.9, "all_right": int(sum(right)),
                              "samples": len(right), "rows": len(right)}])
    for name, table in (("ruler", accuracy), ("ruler_samples", samples)):
        old = folder / f"{name}.csv"
        table = pd.concat([pd.read_csv(old), table]) if old.exists() else table
        table.to_csv(old, index=False)
    return folder


KEYS = [str(1_000_000 + 7 * i) for i in range(20)]
A = [1.0] * 15 + [0.0] * 5                       # 15 of 20
B = [1.0] * 10 + [0.0] * 10  # 10 of 20, each right where A is: the pairs correlated


def test_one_draw_read_by_two_models_is_paired_by_sample(tmp_path):
    ref = ruler_run(tmp_path / "a", "m1", KEYS, A)
    other = ruler_run(tmp_path / "b", "m2", KEYS, B)
    row = gather([ref, other], against=ref).set_index("run").loc["b"]
    want = paired_proportion_difference(B, A)
    assert row["against"] == "a: m1, intact" and row["diff_vs_against"] == pytest.approx(-0.25)
    assert (row["diff_vs_against"], row["diff_against_ci_low"], row["diff_against_ci_high"]) == pytest.approx(want)
    assert "paired proportions, 20 units paired by draw" in row["diff_against_interval"]
    # pairing matters here: the independent interval of the same counts is another one
    assert want[1:] != pytest.approx(independent_proportion_difference(10, 20, 15, 20)[1:], abs=1e-3)


def test_draws_apart_get_newcombes_interval_for_independent_proportions(tmp_path):
    ref = ruler_run(tmp_path / "a", "m1", KEYS, A)
    other = ruler_run(tmp_path / "b", "m1", [str(int(k) + 1) for k in KEYS], B)  # another seed's keys
    row = gather([ref, other], against=ref).set_index("run").loc["b"]
    want = independent_proportion_difference(10, 20, 15, 20)
    assert (row["diff_vs_against"], row["diff_against_ci_low"], row["diff_against_ci_high"]) == pytest.approx(want)
    assert row["diff_against_interval"].startswith("95 % Newcombe (1998, method 10) interval for independent")


def test_partial_recalls_drawn_apart_get_a_bootstrap_of_each_sides_samples(tmp_path):
    ref = ruler_run(tmp_path / "a", "m1", KEYS, A)
    recalls = [0.1 * (i % 7) for i in range(20)]
    partial = ruler_run(tmp_path / "c", "m1", [k + "9" for k in KEYS], recalls)
    row = gather([ref, partial], against=ref).set_index("run").loc["c"]
    want = independent_mean_difference(recalls, A, n_boot=1000, seed=0)
    assert (row["diff_vs_against"], row["diff_against_ci_low"], row["diff_against_ci_high"]) == pytest.approx(want)
    assert row["diff_against_interval"].startswith("95 % percentile bootstrap of independent means")


def test_draws_partly_shared_get_no_interval_and_say_why(tmp_path):
    ref = ruler_run(tmp_path / "a", "m1", KEYS, A)
    other = ruler_run(tmp_path / "b", "m1", KEYS[:5] + [k + "9" for k in KEYS[5:]], B)
    row = gather([ref, other], against=ref).set_index("run").loc["b"]
    assert row["diff_vs_against"] == pytest.approx(-0.25) and np.isnan(row["diff_against_ci_low"])
    assert "share 5 of 20 draws" in row["diff_against_interval"]


def test_the_reference_row_is_the_same_condition_else_intact(tmp_path):
    ref = ruler_run(tmp_path / "a", "m1", KEYS, A)
    ruler_run(tmp_path / "a", "m1", KEYS, B, condition="zero")
    other = ruler_run(tmp_path / "b", "m1", KEYS, B, condition="zero")
    ruler_run(tmp_path / "b", "m1", KEYS, B, task="vt")  # a slot the reference lacks
    got = gather([ref, other], against=ref).set_index(["run", "condition", "slot"])["diff_vs_against"]
    assert got["b", "zero", "niah_single_1, 1,024 tokens"] == 0.0  # against a's zero row, not its intact one
    got = gather([ref, other], against=ref).set_index(["run", "slot"])["diff_against_interval"]
    assert got["b", "vt, 1,024 tokens"].startswith("no reference: the reference run has no row")
    # two models in the reference and neither the row's: no guess
    two = ruler_run(tmp_path / "c", "m1", KEYS, A)
    ruler_run(tmp_path / "c", "m2", KEYS, A)
    third = ruler_run(tmp_path / "d", "m3", KEYS, B)
    row = gather([two, third], against=two).set_index("run").loc["d"]
    assert row["diff_against_interval"] == "no reference: 2 rows of the reference run fit (m1, intact; m2, intact)"


def test_units_that_do_not_give_their_rows_value_are_not_used(tmp_path):
    ref = ruler_run(tmp_path / "a", "m1", KEYS, A)
    other = ruler_run(tmp_path / "b", "m2", KEYS, B)
    samples = pd.read_csv(other / "ruler_samples.csv")
    samples.loc[0, "value"] = 0.0  # edited after the accuracy was written
    samples.to_csv(other / "ruler_samples.csv", index=False)
    row = gather([ref, other], against=ref).set_index("run").loc["b"]
    assert np.isnan(row["diff_against_ci_low"]) and "stale" in row["diff_against_interval"]
    (other / "ruler_samples.csv").unlink()
    row = gather([ref, other], against=ref).set_index("run").loc["b"]
    assert row["diff_against_interval"] == "no interval: b has no ruler_samples.csv beside ruler.csv"


def test_the_reference_may_be_a_section_of_a_reproduce_folder_given(tmp_path):
    ruler_run(tmp_path / "all" / "a", "m1", KEYS, A)
    ruler_run(tmp_path / "all" / "b", "m2", KEYS, B)
    got = gather([tmp_path / "all"], against=tmp_path / "all" / "a").set_index("run")
    assert got.loc["all/a", "against"] == "(reference)" and got.loc["all/b", "against"] == "all/a: m1, intact"
    assert got.loc["all/b", "diff_against_ci_low"] == pytest.approx(paired_proportion_difference(B, A)[1])


def test_against_must_be_one_of_the_runs_given_one_line(tmp_path):
    ref = ruler_run(tmp_path / "a", "m1", KEYS, A)
    other = ruler_run(tmp_path / "b", "m2", KEYS, B)
    with pytest.raises(DataError, match="--against .* is not one of the run folders given"):
        gather([other], against=ref)
    result = runner.invoke(app, ["compare", str(other), "--against", str(ref), "--out", str(tmp_path / "c")])
    assert result.exit_code == 1 and result.output.count("\n") == 1


def test_the_command_prints_and_writes_each_difference_with_its_method(tmp_path):
    ref = ruler_run(tmp_path / "a", "m1", KEYS, A)
    other = ruler_run(tmp_path / "b", "m2", KEYS, B)
    result = runner.invoke(app, ["compare", str(ref), str(other), "--against", str(ref),
                                 "--out", str(tmp_path / "c")], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    low, high = paired_proportion_difference(B, A)[1:]
    assert f"-0.2500 [{low:+.4f}," in result.output and f"{high:+.4f}]" in result.output  # the cell wraps
    assert "│          reference │" in result.output
    assert ("minus reference: 95 % Newcombe (1998, method 10) score interval for a difference of paired "
            "proportions\n") in result.output
    written = pd.read_csv(tmp_path / "c" / "compare.csv")
    assert written["diff_vs_against"].notna().sum() == 1 and written["against"].iloc[0] == "(reference)"


def test_a_metric_without_right_or_wrong_units_gets_its_difference_without_an_interval():
    table = gather([OFFLINE / "length-smollm2", OFFLINE / "passkey-smollm2"], against=OFFLINE / "passkey-smollm2")
    length = table[table["metric"] == "length_perplexity"]
    assert (length["diff_against_interval"].str.startswith("no reference")).all()  # no length row there


def test_committed_runs_pair_two_models_on_one_seeds_samples():
    """SmolLM2 and Gemma 3 read the same draws (one seed: the same keys; sentence-level depths
    differ with the tokenizer): Gemma 3's multi-key cells are paired with SmolLM2's sample by
    sample, as computed here from the two samples tables directly."""
    smol, gemma = OFFLINE / "ruler-smollm2-inside", OFFLINE / "ruler-gemma3-inside"
    table = gather([smol, gemma], against=smol)
    got = table[table["run"] == gemma.name].set_index("slot")
    a, b = (pd.read_csv(f / "ruler_samples.csv", dtype={"answers": str}) for f in (smol, gemma))
    for length in (1024, 2048, 4096):
        x, r = (t[(t.task == "niah_multikey_1") & (t.length == length)].set_index("sample") for t in (b, a))
        assert (x["answers"] == r["answers"]).all()
        want = paired_proportion_difference(x["value"], r["value"].loc[x.index])
        row = got.loc[f"niah_multikey_1, {length:,} tokens"]
        assert (row["diff_vs_against"], row["diff_against_ci_low"], row["diff_against_ci_high"]) == pytest.approx(want)
    # one model's two runs on one seed (the intact rows read the same 20 keys): paired, across runs
    draws = gather([OFFLINE / "remedies-passkey-draws-smollm2", OFFLINE / "remedies-passkey-draws-selfextend-smollm2"],
                   against=OFFLINE / "remedies-passkey-draws-smollm2")
    selfextend = draws[draws["condition"] == "selfextend:4:2048"].iloc[0]
    assert selfextend["against"] == "remedies-passkey-draws-smollm2: smollm2, intact"
    assert selfextend["diff_against_interval"].endswith("20 units paired by draw")


def test_the_figure_gets_a_panel_of_the_differences_with_their_bars(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from pecli.experiments import compare

    ref = ruler_run(tmp_path / "a", "m1", KEYS, A)
    other = ruler_run(tmp_path / "b", "m2", KEYS, B)
    csv = tmp_path / "compare.csv"
    gather([ref, other], against=ref).to_csv(csv, index=False)
    drawn = []
    monkeypatch.setattr("pecli.plots.style.save", lambda fig, path: drawn.append(fig) or path)
    compare.figures({"compare": csv}, tmp_path)
    values, below = drawn[0].axes
    point, low, high = paired_proportion_difference(B, A)
    (line,) = [c for c in below.containers]  # one errorbar: m2's row (the reference has none)
    assert line.lines[0].get_ydata()[0] == pytest.approx(point)
    segment = line.lines[2][0].get_segments()[0]
    assert (segment[0][1], segment[1][1]) == pytest.approx((low, high))
    assert below.get_title(loc="left").startswith("bars: Newcombe (1998, method 10), paired proportions")
    # the one task goes to the axis label, the ticks keep the lengths, under the lower panel
    assert [t.get_text() for t in below.get_xticklabels()] == ["1,024 tokens"]
    assert (below.get_xlabel(), values.get_xlabel()) == ("niah_single_1", "")
    plt.close("all")
    # without --against: one panel, as before
    gather([ref, other]).to_csv(csv, index=False)
    compare.figures({"compare": csv}, tmp_path)
    assert len(drawn[1].axes) == 1


# --- mc: the units are items, read from the items table's rows (one per choice) ---------------


def split_by_condition(run: Path, tmp_path: Path) -> dict[str, Path]:
    """One folder per condition of a committed mc run, each with its rows of mc.csv and
    mc_items.csv: the conditions become two runs over the same items."""
    folders = {}
    for condition in ("intact", "zero"):
        folder = folders[condition] = tmp_path / condition
        folder.mkdir()
        for name in ("mc", "mc_items"):
            table = pd.read_csv(run / f"{name}.csv", low_memory=False)
            table[table["condition"] == condition].to_csv(folder / f"{name}.csv", index=False)
    return folders


def mc2_by_definition(items: pd.DataFrame) -> pd.Series:
    """MC2 per item from its choices' log-likelihoods, as the harness defines it (v2.0): the
    normalised probability of the true choices, those before the first false label."""
    def mass(choices):
        p = np.exp(choices["value"] - choices["value"].max())
        labels = list(choices["label"])
        true = labels.index(0) if 0 in labels else len(labels)
        return p.iloc[:true].sum() / p.sum()
    mc2 = items[items["task"] == "mc2"].sort_values("choice_index")
    return mc2.groupby("text_id").apply(mass, include_groups=False)


def test_mc_runs_over_the_same_items_are_paired_by_item(tmp_path):
    """mc-smollm2's zero rows, as a run of their own against its intact rows as another: the
    differences and their paired intervals are the ones the mc run wrote beside its rows
    (Newcombe's for MC1 and MC1-norm, exact; a paired bootstrap for MC2, to its resampling), and
    MC2's per-item values are the definition's, recomputed from the choices' log-likelihoods."""
    run = OFFLINE / "mc-smollm2"
    folders = split_by_condition(run, tmp_path)
    table = gather([folders["intact"], folders["zero"]], against=folders["intact"])
    got = table[table["run"] == "zero"].set_index("metric")
    written = pd.read_csv(run / "mc.csv").query("condition == 'zero'").set_index("metric")
    for metric in ("mc1", "mc1_norm", "mc2"):
        row, want = got.loc[metric], written.loc[metric]
        assert row["against"] == "intact: smollm2, intact"
        assert row["diff_vs_against"] == pytest.approx(want["diff_vs_intact"], abs=1e-12)
        close = 1e-9 if metric != "mc2" else 0.02
        assert row["diff_against_ci_low"] == pytest.approx(want["diff_ci_low"], abs=close)
        assert row["diff_against_ci_high"] == pytest.approx(want["diff_ci_high"], abs=close)
        assert row["diff_against_interval"].endswith("100 units paired by draw")
    assert got.loc["mc2", "diff_against_interval"].startswith("95 % paired percentile bootstrap")
    items = pd.read_csv(run / "mc_items.csv", low_memory=False)
    x, r = (mc2_by_definition(items[items["condition"] == c]) for c in ("zero", "intact"))
    assert got.loc["mc2", "diff_vs_against"] == pytest.approx((x - r).mean(), abs=1e-9)
    want = paired_mean_difference(x.sort_index(), r.sort_index(), n_boot=1000, seed=0)
    assert (got.loc["mc2", "diff_against_ci_low"], got.loc["mc2", "diff_against_ci_high"]) == pytest.approx(want[1:], abs=1e-9)


def test_mc_runs_over_other_items_get_intervals_for_independent_samples(tmp_path):
    """Two runs over disjoint items (the second's text ids moved): Newcombe's interval for
    independent proportions, from the two runs' item counts; a part shared: none, and why."""
    folders = split_by_condition(OFFLINE / "mc-smollm2", tmp_path)
    items = pd.read_csv(folders["zero"] / "mc_items.csv", low_memory=False)
    moved = items.assign(text_id=items["text_id"] + 10_000)
    moved.to_csv(folders["zero"] / "mc_items.csv", index=False)
    table = gather([folders["intact"], folders["zero"]], against=folders["intact"])
    row = table[table["run"] == "zero"].set_index("metric").loc["mc1"]
    right = {c: int(round(100 * pd.read_csv(folders[c] / "mc.csv").set_index("metric").loc["mc1", "value"]))
             for c in folders}
    want = independent_proportion_difference(right["zero"], 100, right["intact"], 100)
    assert (row["diff_vs_against"], row["diff_against_ci_low"], row["diff_against_ci_high"]) == pytest.approx(want)
    assert row["diff_against_interval"].endswith("100 and 100 units drawn apart")
    # the same text ids of other data are other items: drawn apart, not paired
    items.assign(data_revision="sha256:other").to_csv(folders["zero"] / "mc_items.csv", index=False)
    table = gather([folders["intact"], folders["zero"]], against=folders["intact"])
    again = table[table["run"] == "zero"].set_index("metric").loc["mc1"]
    assert (again["diff_against_ci_low"], again["diff_against_ci_high"]) == pytest.approx(want[1:])
    half = moved["text_id"].isin(sorted(moved["text_id"].unique())[:50])
    moved.assign(text_id=moved["text_id"].where(~half, moved["text_id"] - 10_000)).to_csv(
        folders["zero"] / "mc_items.csv", index=False)
    table = gather([folders["intact"], folders["zero"]], against=folders["intact"])
    row = table[table["run"] == "zero"].set_index("metric").loc["mc2"]
    assert np.isnan(row["diff_against_ci_low"]) and "share 50 of 150 draws" in row["diff_against_interval"]
