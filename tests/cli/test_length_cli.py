"""`pecli length` end to end on tiny models (CliRunner)."""

from __future__ import annotations

import json

import pandas as pd
import pytest


@pytest.fixture
def docs(tmp_path):
    path = tmp_path / "docs.csv"
    pd.DataFrame({"text": ["The grass is green. The sky is blue. " * 12,
                           "There and back again. " * 15]}).to_csv(path, index=False)
    return path


def test_length_writes_table_figure_and_sidecar(use_tiny, docs, tmp_path, invoke):
    out = tmp_path / "run"
    result = invoke("length", "llama", "--lengths", "16,32", "--rope-scaling", "yarn:2,linear:2",
                    "--dataset", str(docs), "--bootstrap", "100", "--buckets", "4", "--out", str(out))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "length.csv")
    assert list(dict.fromkeys(df["rope_scaling"])) == ["none", "yarn:2", "linear:2"]
    assert len(df) == 3 * 2 * (4 + 1)  # conditions x lengths x (buckets + all positions)
    for col in ("window_start", "window_end", "nll_mean", "perplexity", "tokens", "windows",
                "dropped_tokens", "rope_parameters", "model_id", "git_commit"):
        assert col in df.columns and df[col].notna().all(), col
    # an interval only over 10 windows or more (the table says how many)
    assert (df["ci_low"].notna() == (df["windows"] >= 10)).all() and (df["ci_high"].notna() == df["ci_low"].notna()).all()
    assert df["ci_low"].notna().any() and df["ci_low"].isna().any()
    # each condition's paired difference from intact on the same windows (none for intact itself)
    assert df[df.rope_scaling == "none"]["diff_vs_intact"].isna().all()
    scaled = df[df.rope_scaling != "none"]
    assert scaled["diff_vs_intact"].notna().all()
    assert (scaled["diff_ci_low"].notna() == (scaled["windows"] >= 10)).all()
    assert (out / "figures" / "length.png").stat().st_size > 10_000
    config = json.loads((out / "length.json").read_text())["config"]
    assert config["rope_scaling"] == ["yarn:2", "linear:2"] and config["lengths"] == [16, 32]


def test_learned_past_rows_and_sliding(use_tiny, docs, tmp_path, invoke):
    out = tmp_path / "run"
    result = invoke("length", "gpt2", "--lengths", "32,128", "--windows", "sliding", "--stride", "8",
                    "--dataset", str(docs), "--bootstrap", "0", "--out", str(out))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "length.csv")
    assert (df[df["length"] == 128]["note"] == "not applicable: 64 learned positions").all()
    assert "not applicable: 64 learned positions" in result.output
    assert (df[df["length"] == 32]["passes"] == "one pass per window").all()


@pytest.mark.parametrize("args, words", [
    (["--rope-scaling", "llama3:8"], "low_freq_factor and high_freq_factor"),
    (["--rope-scaling", "longrope:4"], "short_factor and long_factor"),
    (["--stride", "4"], "--windows sliding"),
    (["--windows", "diagonal"], "nonoverlapping, sliding, band"),
])
def test_bad_input_one_line(use_tiny, docs, invoke, args, words):
    result = invoke("length", "llama", "--dataset", str(docs), *args)
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.output, result.output
