"""`pecli lm-eval` as a user runs it: one lm-eval run per condition, intact first, lm-eval's
JSON per condition, a tidy table with provenance, a figure; bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("lm_eval", reason="lm-eval not installed (make setup)")

from pecli.cli.app import app  # noqa: E402

runner = CliRunner()
CONFIGS = str(Path(__file__).resolve().parents[2] / "configs" / "lm_eval")


def test_two_conditions_write_lm_evals_json_a_table_and_a_figure(tmp_path, shared_data):
    out = tmp_path / "run"
    result = runner.invoke(app, [
        "lm-eval", "--model_args", "pretrained=models/tiny-gpt2-imdb", "--intervention", "zero",
        "--tasks", "truthfulqa_mc1,truthfulqa_mc2", "--include_path", CONFIGS, "--limit", "4",
        "--device", "cpu", "--bootstrap", "200", "--out", str(out),
        "--data-dir", str(shared_data)])
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "lm_eval.csv")
    assert list(dict.fromkeys(df["intervention"])) == ["learned", "zero"]  # intact first
    assert set(df["task"]) == {"truthfulqa_mc1", "truthfulqa_mc2"} and (df["rows"] == 4).all()
    assert df[["model_revision", "lm_eval_version", "task_version", "tokens"]].notna().all().all()
    assert (df["ci_low"] <= df["value"]).all() and (df["value"] <= df["ci_high"]).all()
    for condition in ("learned-default-legacy", "zero-default-legacy"):
        (results,) = (out / "lm_eval" / condition).rglob("results_*.json")
        saved = json.loads(results.read_text())
        row = df[(df["intervention"] == condition.split("-")[0]) & (df["task"] == "truthfulqa_mc2")]
        assert saved["results"]["truthfulqa_mc2"]["acc,none"] == pytest.approx(row["value"].item())
        assert f"intervention={condition.split('-')[0]}" in saved["config"]["model_args"]
    # each condition minus intact on the same documents, from lm-eval's own logged samples
    accs = {}
    for condition in ("learned", "zero"):
        for task in ("truthfulqa_mc1", "truthfulqa_mc2"):
            (path,) = (out / "lm_eval" / f"{condition}-default-legacy").rglob(f"samples_{task}_*.jsonl")
            lines = [json.loads(line) for line in path.read_text().splitlines()]
            accs[condition, task] = {s["doc_id"]: s["acc"] for s in lines}
    for task in ("truthfulqa_mc1", "truthfulqa_mc2"):
        by_hand = sum(accs["zero", task][d] - accs["learned", task][d] for d in range(4)) / 4
        rows = df[df["task"] == task].set_index("intervention")
        assert rows.loc["zero", "diff_vs_intact"] == pytest.approx(by_hand, abs=1e-12)
        assert rows.loc["learned", ["diff_vs_intact", "diff_ci_low"]].isna().all()
        assert rows.loc["zero", "diff_ci_low"] <= rows.loc["zero", "diff_ci_high"]
    assert "minus intact" in result.output
    assert (out / "figures" / "lm_eval.png").stat().st_size > 0
    compared = runner.invoke(app, ["compare", str(out), "--out", str(tmp_path / "cmp")])
    assert compared.exit_code == 0, compared.output
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert set(table["metric"]) == {"truthfulqa_mc1_acc", "truthfulqa_mc2_acc"} and len(table) == 4
    # with a length and a passkey run (the committed ones): every folder used, every interval
    # labelled with the method its own rows record
    offline = Path(__file__).resolve().parents[2] / "results" / "offline"
    together = runner.invoke(app, ["compare", str(out), str(offline / "length-smollm2"),
                                   str(offline / "passkey-smollm2"), "--out", str(tmp_path / "cmp3")])
    assert together.exit_code == 0, together.output
    table = pd.read_csv(tmp_path / "cmp3" / "compare.csv")
    assert set(table["metric"]) == {"truthfulqa_mc1_acc", "truthfulqa_mc2_acc", "length_perplexity",
                                    "passkey_accuracy"}
    lm = table[table["metric"].str.startswith("truthfulqa")].set_index(["metric", "condition"])
    for _, row in df.iterrows():
        got = lm.loc[(f"{row['task']}_{row['metric']}", row["intervention"])]
        assert got["interval"] == row["interval_method"] and got["value"] == row["value"]
    assert (table.loc[table["metric"] == "passkey_accuracy", "interval"]
            == "95 % Wilson score interval over trials").all()


@pytest.mark.parametrize("args,words", [
    (["--tasks", "nosuch_task"], "unknown lm-eval task"),
    ([], "name at least one lm-eval task"),
    (["--tasks", "truthfulqa_mc1", "--model_args", "pretrained=random:gpt2,intervention=zero",
      "--intervention", "shuffle"], "both set the condition"),
    (["--tasks", "truthfulqa_mc1", "--protocol", "study"], "relative"),
    (["--tasks", "truthfulqa_mc1", "--model_args", "pretrained=random:bert"], "encoder"),
])
def test_bad_input_is_one_line(tmp_path, monkeypatch, args, words):
    def never(*a, **k):
        raise AssertionError("loaded before the options were checked")

    monkeypatch.setattr("pecli.models.loading.load_model", never)
    result = runner.invoke(app, ["lm-eval", "--include_path", CONFIGS, *args,
                                 "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and not isinstance(result.exception, AssertionError), result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], result.output
