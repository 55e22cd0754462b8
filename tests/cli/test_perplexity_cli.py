"""`pecli perplexity` and `pecli masks` end to end on tiny models (CliRunner)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from pecli.cli import app

runner = CliRunner()
TEXTS = ["Why do veins appear blue?", "Where did fortune cookies originate?",
         "What happens if you crack your knuckles a lot?", "Is it legal to own an assault rifle?"]


@pytest.fixture
def toy_csv(tmp_path):
    path = tmp_path / "toy.csv"
    pd.DataFrame({"question": TEXTS}).to_csv(path, index=False)
    return path


@pytest.fixture
def use_tiny(tiny, monkeypatch):
    """`pecli perplexity <family>` loads tiny(<family>) instead of a real checkpoint."""
    monkeypatch.setattr("pecli.loading.load_model", lambda name, **kw: tiny(name))


def _invoke(*args):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def test_perplexity_writes_tables_with_provenance(use_tiny, toy_csv, tmp_path):
    out = tmp_path / "run"
    result = _invoke("perplexity", "gpt2", "--pe", "learned", "--pe", "zero", "--mask", "default,linear",
                     "--mask-semantics", "log-bias", "--protocol", "relative", "--protocol", "study",
                     "--dataset", str(toy_csv), "--text", "question", "--out", str(out))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "perplexity.csv")
    assert len(df) == 2 * 2 * 1 * 2 * 4  # pe x mask x semantics x protocol x aggregation
    assert set(df["aggregation"]) == {"corpus", "mean_per_text", "median_per_text", "mean_per_token"}
    for col in ("intervention", "mask", "mask_semantics", "protocol", "start_token", "truncated",
                "tokens", "git_commit", "model_id", "data_revision", "computation", "passes"):
        assert col in df.columns and df[col].notna().all(), col
    assert (df["start_token"] == "bos").all() and (df["truncated"] == 0).all()
    study = df[(df["mask"] == "linear") & (df["protocol"] == "study")]
    assert (study["passes"] == "prefix-by-prefix").all()
    texts = pd.read_csv(out / "texts.csv")
    assert len(texts) == 2 * 2 * 2 * len(TEXTS)
    assert json.loads((out / "perplexity.json").read_text())["config"]["masks"] == ["default", "linear"]
    assert (out / "figures" / "perplexity.png").stat().st_size > 0
    assert "zero + linear/log-bias (study)" in result.output and "wrote" in result.output


def test_no_start_token_and_window(use_tiny, tmp_path):
    path = tmp_path / "long.csv"
    pd.DataFrame({"text": [" ".join(["the cat sat on the mat"] * 30), "a short one"]}).to_csv(path, index=False)
    result = _invoke("perplexity", "llama", "--dataset", str(path), "--no-start-token",
                     "--long-text", "window", "--stride", "16", "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "o" / "perplexity.csv")
    assert (df["start_token"] == "none").all() and (df["truncated"] == 1).all()
    assert (df["long_text"] == "window").all() and (df["stride"] == 16).all()


@pytest.mark.parametrize("args, message", [
    (["--mask", "lineer"], "error: unknown mask 'lineer' (did you mean 'linear'?)"),
    (["--mask-semantics", "logbias"], "error: unknown mask semantics 'logbias'"),
    (["--protocol", "studdy"], "error: unknown protocol 'studdy'; use one of relative, study"),
    (["--pe", "zeroo"], "error: unknown intervention 'zeroo'"),
    (["--stride", "4"], "error: --stride only applies with --long-text window"),
    (["--batch-size", "0"], "error: --batch-size must be at least 1"),
])
def test_bad_options_are_one_line_errors(use_tiny, toy_csv, args, message):
    result = _invoke("perplexity", "gpt2", "--dataset", str(toy_csv), "--text", "question", *args)
    assert result.exit_code == 1
    assert result.output.strip().startswith(message), result.output
    assert "Traceback" not in result.output


def test_encoder_is_refused(use_tiny, toy_csv):
    result = _invoke("perplexity", "bert", "--protocol", "study", "--mask", "linear",
                     "--dataset", str(toy_csv), "--text", "question")
    assert result.exit_code == 1
    assert "needs a causal LM" in result.output and "Traceback" not in result.output


def test_masks_lists_shapes_and_semantics():
    result = _invoke("masks")
    assert result.exit_code == 0
    assert "0.10 0.33 0.55 0.77 1.00" in result.output  # linear, q = 5
    for name in ("default", "linear", "exponential", "alibi", "legacy", "boolean", "log-bias", "scale",
                 "relative, study"):
        assert name in result.output


def test_mask_without_pe_runs_the_studys_e3(shared_data, tmp_path):
    """`pecli perplexity random:gpt2 --mask linear --limit 8`: the three E2/E3 rows, baseline first."""
    out = tmp_path / "e3"
    result = _invoke("perplexity", "random:gpt2", "--mask", "linear", "--limit", "8",
                     "--data-dir", str(shared_data), "--bootstrap", "200", "--out", str(out))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "perplexity.csv")
    corpus = df[df["aggregation"] == "corpus"]
    assert list(zip(corpus["intervention"], corpus["mask"], strict=True)) == [
        ("learned", "default"), ("zero", "default"), ("zero", "linear")]
    assert (corpus["mask_semantics"] == "legacy").all() and (df["rows"] == 8).all()
    assert ((df["ci_low"] <= df["value"]) & (df["value"] <= df["ci_high"])).all()
    assert df["study_value"].isna().all()  # random weights: not the study's model
    assert "intervals" in json.loads((out / "perplexity.json").read_text())["config"]
    lines = [line for line in result.output.splitlines() if line.startswith("│ ")]
    assert lines[0].split()[1] == "learned" and "[" in lines[0]  # baseline first, with its interval
