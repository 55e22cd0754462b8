"""`pecli mc` end to end on tiny models (CliRunner): files, provenance, messages."""

from __future__ import annotations

import json

import pandas as pd
import pytest

ITEMS = [
    {"question": "Is the sky blue?", "mc1_targets": {"Yes.": 1, "No.": 0, "It is green.": 0},
     "mc2_targets": {"Yes.": 1, "On a clear day, yes.": 1, "No.": 0}},
    {"question": "What is 2+2?", "mc1_targets": {"choices": ["4", "5"], "labels": [1, 0]},
     "mc2_targets": {"choices": ["4", "Four", "5"], "labels": [1, 1, 0]}},
]


@pytest.fixture
def items_file(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(json.dumps(it) for it in ITEMS) + "\n")
    return path


def test_mc_writes_tables_figure_and_provenance(use_tiny, items_file, tmp_path, invoke):
    out = tmp_path / "run"
    result = invoke("mc", "llama", "--intervention", "zero", "--mask", "linear", "--mask-semantics", "log-bias",
                     "--dataset", str(items_file), "--bootstrap", "100", "--out", str(out))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "mc.csv")
    conditions = df[["intervention", "mask"]].drop_duplicates().values.tolist()
    assert conditions == [["intact", "default"], ["zero", "linear"]]  # the intact row first
    assert set(df["metric"]) == {"mc1", "mc2", "mc1_norm"}
    assert df[["value", "stderr", "ci_low", "ci_high"]].notna().all().all()
    assert (df["rows"] == 2).all() and (df["dataset"] == "items.jsonl").all()
    items = pd.read_csv(out / "mc_items.csv")
    assert set(items["text_id"]) == {0, 1} and items["picked"].dtype == bool
    assert len(items) == 2 * (3 + 3 + 2 + 3)  # conditions x choices of both tasks
    meta = json.loads((out / "mc.json").read_text())
    assert "bootstrap" in meta["config"]["interval_method"]
    assert (out / "figures" / "mc.png").stat().st_size > 10_000
    assert "TruthfulQA MC" in result.output and "intact" in result.output


def test_mc_bad_item_is_one_line_error(use_tiny, tmp_path, invoke):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([ITEMS[0], {"question": "Why?", "mc1_targets": {"a": 1}}]))
    result = invoke("mc", "gpt2", "--dataset", str(path), "--out", str(tmp_path / "o"))
    assert result.exit_code == 1
    assert result.output.strip() == ("error: bad.json item 1: missing field 'mc2_targets'; each item "
                                     "needs question, mc1_targets and mc2_targets")
    assert not (tmp_path / "o").exists()


def test_mc_encoder_is_one_line_error(use_tiny, items_file, tmp_path, invoke):
    result = invoke("mc", "bert", "--dataset", str(items_file), "--out", str(tmp_path / "o"))
    assert result.exit_code == 1
    assert "encoder without a language-model head" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_mc_help_says_which_protocols_are_meaningful(invoke):
    result = invoke("mc", "--help")
    assert result.exit_code == 0
    assert "mc: the question's context scored once for every choice" in " ".join(
        line.strip(" │") for line in result.output.splitlines())
