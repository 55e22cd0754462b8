"""`pecli pe sinusoidal` and `pecli pe probe` end to end on tiny local checkpoints and a CSV."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import make_tiny
from typer.testing import CliRunner

from pecli.cli.app import app

runner = CliRunner()
TEXTS = ["a fine film", "terrible acting and a worse plot", "I loved every minute of it",
         "boring and long and slow", "the best thing I saw this year", "a waste of two hours",
         "charming and funny", "not worth it at all"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """Tiny GPT-2 (learned) and Llama (rotary) checkpoints as local directories, and a CSV."""
    root = tmp_path_factory.mktemp("pe_cli")
    for family in ("gpt2", "llama"):
        loaded = make_tiny(family)
        loaded.model.save_pretrained(root / family)
        loaded.tokenizer.save_pretrained(root / family)
    pd.DataFrame({"text": TEXTS}).to_csv(root / "reviews.csv", index=False)
    return root


def _invoke(*args):
    return runner.invoke(app, ["pe", *args], env={"COLUMNS": "200"})


def test_sinusoidal_writes_tables_figures_and_summary(tmp_path):
    result = _invoke("sinusoidal", "--positions", "8", "--dim", "8", "--base", "100",
                     "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    for name in ("encoding", "rotation", "dot", "summary"):
        assert (tmp_path / f"{name}.csv").exists() and (tmp_path / f"{name}.json").exists()
    for png in ("heatmap", "clock", "dot_rotation"):
        assert (tmp_path / "figures" / f"pe_sinusoidal_{png}.png").stat().st_size > 5000
    summary = pd.read_csv(tmp_path / "summary.csv").set_index("metric")["value"]
    assert summary["rotation_max_abs_error"] < 1e-12
    assert "rotation_max_abs_error" in result.output and "summary.csv" in result.output
    assert len(pd.read_csv(tmp_path / "encoding.csv")) == 64


@pytest.mark.parametrize("args,message", [
    (["--dim", "7"], "pecli pe sinusoidal: dim (--dim): 7 is odd"),
    (["--positions", "0"], "pecli pe sinusoidal: positions (--positions): 0 is out of range (at least 1)"),
    (["--base", "1"], "pecli pe sinusoidal: base (--base): 1 must be greater than 1"),
    (["--positions", "4096", "--dim", "512"],  # was some 15 GB and 20 minutes, then a killed process
     "pecli pe sinusoidal: positions (--positions): 4,096 x 512 would write 18,874,368 rows"),
])
def test_sinusoidal_bad_args(args, message, tmp_path):
    result = _invoke("sinusoidal", *args, "--out", str(tmp_path))
    assert result.exit_code == 1
    assert f"error: {message}" in result.output and "Traceback" not in result.output
    assert not list(tmp_path.iterdir())  # nothing written


def test_probe_learned_and_rotary(assets, tmp_path):
    result = _invoke("probe", str(assets / "gpt2"), str(assets / "llama"), "--dataset",
                     str(assets / "reviews.csv"), "--limit", "8", "--max-length", "16", "--folds", "4",
                     "--pairs", "100", "--device", "cpu", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    for name in ("matrix", "similarity", "hidden"):
        assert (tmp_path / f"{name}.csv").exists()
    for png in ("layers", "similarity", "matrix"):
        assert (tmp_path / "figures" / f"pe_probe_{png}.png").stat().st_size > 5000
    matrix = pd.read_csv(tmp_path / "matrix.csv")
    assert set(matrix["family"]) == {"gpt2"}  # the rotary model has no table
    hidden = pd.read_csv(tmp_path / "hidden.csv")
    assert set(hidden["family"]) == {"gpt2", "llama"} and set(hidden["intervention"]) == {"intact", "zero"}
    assert hidden.loc[hidden.family == "llama", "note"].str.contains("rotary").all()
    assert "hidden-state probe only" in result.output
    mae = matrix[(matrix.matrix == "learned") & (matrix.metric == "regression_mae")]["value"].iloc[0]
    assert f"{mae:.2f}" in result.output  # the summary prints the table's number


@pytest.mark.parametrize("args,message", [
    (["random:nosuch"], "unknown model family 'nosuch'"),
    (["MODEL", "nosuch-model"], "cannot load model 'nosuch-model' ("),
    (["MODEL", "--folds", "1"], "pecli pe probe: folds (--folds): 1 is out of range (at least 2)"),
    (["MODEL", "--intervention", "zeros"], "pecli pe probe: intervention (--intervention): unknown intervention 'zeros' (did you mean 'zero'"),
    (["MODEL", "--limit", "99"], "--limit 99 exceeds the 8 rows"),
    (["MODEL", "--max-length", "1"], "pecli pe probe: max_length (--max-length): 1 is out of range (at least 2)"),
])
def test_probe_bad_args(assets, tmp_path, args, message):
    args = [str(assets / "gpt2") if a == "MODEL" else a for a in args]
    limit = [] if "--limit" in args else ["--limit", "8"]  # a flag given twice is refused
    result = _invoke("probe", *limit, *args, "--dataset", str(assets / "reviews.csv"),
                     "--device", "cpu", "--out", str(tmp_path / "out"))
    assert result.exit_code == 1, result.output
    assert f"error: {message}" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_pe_without_a_subcommand_shows_help():
    result = _invoke()
    assert "sinusoidal" in result.output and "probe" in result.output
