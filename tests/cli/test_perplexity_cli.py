"""`pecli perplexity` and `pecli masks` end to end on tiny models (CliRunner)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

TEXTS = ["Why do veins appear blue?", "Where did fortune cookies originate?",
         "What happens if you crack your knuckles a lot?", "Is it legal to own an assault rifle?"]


@pytest.fixture
def toy_csv(tmp_path):
    path = tmp_path / "toy.csv"
    pd.DataFrame({"question": TEXTS}).to_csv(path, index=False)
    return path


def test_perplexity_writes_tables_with_provenance(use_tiny, toy_csv, tmp_path, invoke):
    out = tmp_path / "run"
    result = invoke("perplexity", "gpt2", "--intervention", "intact", "--intervention", "zero",
                    "--mask", "default,linear", "--mask-semantics", "log-bias", "--protocol",
                    "relative", "--protocol", "study", "--dataset", str(toy_csv), "--text-field",
                    "question", "--out", str(out))
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
    config = json.loads((out / "perplexity.json").read_text())["config"]
    assert config["mask"] == ["default", "linear"] and config["intervention"] == ["intact", "zero"]
    assert (out / "figures" / "perplexity.png").stat().st_size > 0
    assert "zero + linear/log-bias (study)" in result.output and "wrote" in result.output


def test_deprecated_pe_and_text_still_work_with_a_warning(use_tiny, toy_csv, tmp_path, invoke):
    with pytest.warns(FutureWarning, match="'pe' is deprecated; use 'intervention'"):
        result = invoke("perplexity", "gpt2", "--pe", "zero", "--text", "question", "--dataset",
                        str(toy_csv), "--bootstrap", "0", "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "o" / "perplexity.csv")
    assert list(dict.fromkeys(df["intervention"])) == ["intact", "zero"]
    assert (df["text_field"] == "question").all()


def test_no_start_token_and_window(use_tiny, tmp_path, invoke):
    path = tmp_path / "long.csv"
    pd.DataFrame({"text": [" ".join(["the cat sat on the mat"] * 30), "a short one"]}).to_csv(path, index=False)
    result = invoke("perplexity", "llama", "--dataset", str(path), "--no-start-token",
                     "--long-text", "window", "--stride", "16", "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "o" / "perplexity.csv")
    assert (df["start_token"] == "none").all() and (df["truncated"] == 1).all()
    assert (df["long_text"] == "window").all() and (df["stride"] == 16).all()


@pytest.mark.parametrize("args, message", [
    (["--mask", "lineer"], "unknown mask 'lineer' (did you mean 'linear'?)"),
    (["--mask-semantics", "logbias"], "unknown mask semantics 'logbias'"),
    (["--protocol", "studdy"], "unknown protocol 'studdy' (did you mean 'study'?)"),
    (["--intervention", "zeroo"], "unknown intervention 'zeroo'"),
    (["--pe", "zeroo"], "unknown intervention 'zeroo'"),
    (["--stride", "4"], "stride (--stride) steps the windows of long_text: window"),
    (["--batch-size", "0"], "batch_size (--batch-size): 0 is out of range (at least 1)"),
])
def test_bad_options_are_one_line_errors(use_tiny, toy_csv, args, message, invoke):
    result = invoke("perplexity", "gpt2", "--dataset", str(toy_csv), "--text-field", "question", *args)
    assert result.exit_code == 1
    line = result.output.strip()
    assert line.startswith("error: pecli perplexity: ") and message in line, result.output
    assert "\n" not in line
    assert "Traceback" not in result.output


def test_encoder_is_refused(use_tiny, toy_csv, invoke):
    result = invoke("perplexity", "bert", "--protocol", "study", "--mask", "linear",
                    "--dataset", str(toy_csv), "--text-field", "question")
    assert result.exit_code == 1
    assert "needs a causal LM" in result.output and "Traceback" not in result.output


def test_masks_lists_shapes_and_semantics(invoke):
    result = invoke("masks")
    assert result.exit_code == 0
    assert "0.10 0.33 0.55 0.77 1.00" in result.output  # linear, q = 5
    for name in ("default", "linear", "exponential", "alibi", "legacy", "boolean", "log-bias", "scale",
                 "relative, study"):
        assert name in result.output


def test_mask_without_pe_runs_the_studys_e3(shared_data, tmp_path, invoke):
    """`pecli perplexity random:gpt2 --mask linear --limit 8`: the three E2/E3 rows, baseline first."""
    out = tmp_path / "e3"
    result = invoke("perplexity", "random:gpt2", "--mask", "linear", "--limit", "8",
                     "--data-dir", str(shared_data), "--bootstrap", "200", "--out", str(out))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "perplexity.csv")
    corpus = df[df["aggregation"] == "corpus"]
    assert list(zip(corpus["intervention"], corpus["mask"], strict=True)) == [
        ("intact", "default"), ("zero", "default"), ("zero", "linear")]
    assert (corpus["mask_semantics"] == "legacy").all() and (df["rows"] == 8).all()
    assert ((df["ci_low"] <= df["value"]) & (df["value"] <= df["ci_high"])).all()
    assert df["study_value"].isna().all()  # random weights: not the study's model
    assert "intervals" in json.loads((out / "perplexity.json").read_text())["config"]
    lines = [line for line in result.output.splitlines() if line.startswith("│ ")]
    assert lines[0].split()[1] == "intact" and "[" in lines[0]  # baseline first, with its interval


@pytest.mark.parametrize("args,message", [
    (["perplexity", "smollm2", "--intervention", "nosuch"], "unknown intervention 'nosuch'"),
    (["perplexity", "smollm2", "--mask-semantics", "log-bais"], "unknown mask semantics 'log-bais'"),
    (["perplexity", "smollm2", "--stride", "8"], "stride (--stride) steps the windows"),
    (["mc", "smollm2", "--pe", "zero,shift"], "needs an argument: write shift:K"),
    (["mc", "smollm2", "--mask", "linaer"], "unknown mask 'linaer'"),
])
def test_a_bad_name_fails_without_importing_torch(args, message):
    """perplexity and mc build their options before importing any experiment: torch and
    transformers never load for a bad name (so it fails in well under a second)."""
    import subprocess
    import sys

    code = (f"import sys\nfrom pecli.cli.app import app\ntry:\n    app({args!r})\nexcept SystemExit as e:\n"
            "    print(e.code, 'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "False", "False"], out.stdout + out.stderr
    assert message in out.stderr
