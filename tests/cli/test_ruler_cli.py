"""`pecli ruler` end to end on a tiny model (CliRunner): every kind of condition crossed with a
task, the tables, the samples JSONL, the figure; refusals before loading."""

from __future__ import annotations

import json

import pandas as pd
import pytest


def test_ruler_writes_tables_samples_and_figure_under_every_kind_of_condition(
        use_tiny, tmp_path, invoke, monkeypatch):
    from pecli.experiments.ruler import samples_jsonl
    from tests.unit.test_ruler import made_up

    monkeypatch.setattr("pecli.experiments.ruler.essay", lambda *a: made_up())
    out = tmp_path / "run"
    result = invoke("ruler", "llama", "--tasks", "vt", "--lengths", "320", "--samples", "2",
                    "--intervention", "zero", "--mask", "linear", "--rope-scaling", "linear:2",
                    "--rope-scaling-on", "intact", "--out", str(out))
    assert result.exit_code == 0, result.output
    acc = pd.read_csv(out / "ruler.csv")
    # conditions.grid: the intact model, the scaling on it alone, each (intervention, mask) pair
    assert list(acc["condition"]) == ["intact", "linear:2", "zero + linear/legacy"]
    assert acc["value"].notna().all() and (acc["ci_high"] > acc["ci_low"]).all()
    # each other condition's paired difference from intact, in the table and under its printed cell
    assert acc["diff_vs_intact"].isna().tolist() == [True, False, False]
    assert result.output.count("vs intact") == 2
    jsonl = (out / "ruler_samples.jsonl").read_text()
    lines = [json.loads(x) for x in jsonl.splitlines()]
    assert len(lines) == 2 and all(len(x["outputs"]) == 3 and x["prompt"].startswith("Memorize")
                                   for x in lines)
    samples = pd.read_csv(out / "ruler_samples.csv", dtype=str, keep_default_na=False)
    assert ({(x["sample"], c): y["output"] for x in lines for c, y in x["outputs"].items()}
            == {(int(r.sample), r.condition): r.output for r in samples.itertuples()})
    # a preset's finished section makes it from the CSV read back as text: the same file
    assert samples_jsonl({"ruler_samples": samples}) == jsonl
    assert (out / "figures" / "ruler.png").stat().st_size > 10_000


def test_a_cell_of_one_sample_says_it_has_no_interval(use_tiny, tmp_path, invoke, monkeypatch):
    """One sample gives no interval: the printed cells say so, the accuracy's and the
    difference's, rather than dropping the bounds."""
    from tests.unit.test_ruler import made_up

    monkeypatch.setattr("pecli.experiments.ruler.essay", lambda *a: made_up())
    result = invoke("ruler", "llama", "--tasks", "vt", "--lengths", "320", "--samples", "1",
                    "--intervention", "zero", "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert result.output.count("(no interval)") == 3 and "nan" not in result.output


@pytest.mark.parametrize("args, words", [
    (["llama", "--tasks", "qb"], "not a RULER task"),
    (["llama", "--tasks", "cwe", "--lengths", "512"], "give at least 1024"),
    (["random:gpt2", "--rope-scaling", "linear:2", "--lengths", "512", "--tasks", "vt"],
     "rope-scaling applies to rotary"),
    (["random:bert", "--lengths", "512", "--tasks", "vt"],  # named no other command (it said perplexity)
     "encoder without a language-model head: this command scores next tokens and needs a causal LM"),
])
def test_ruler_refuses_in_one_line_before_loading(invoke, monkeypatch, args, words):
    monkeypatch.setattr("pecli.models.loading.load_model", lambda *a, **k: pytest.fail("loaded"))
    result = invoke("ruler", *args)
    assert result.exit_code != 0 and words in result.output
    assert "Traceback" not in result.output
