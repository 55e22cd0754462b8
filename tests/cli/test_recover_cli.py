"""`pecli pe recover` end to end on tiny local checkpoints (learned and rotary) and a CSV."""

from __future__ import annotations

import pandas as pd
import pytest
import test_pe_cli
from typer.testing import CliRunner

from pecli.cli.app import app

runner = CliRunner()


assets = test_pe_cli.assets  # the fixture: tiny GPT-2 and Llama checkpoints, an 8-row CSV


def _invoke(assets, *args):
    return runner.invoke(app, ["pe", "recover", *args, "--dataset", str(assets / "reviews.csv"),
                               "--device", "cpu"], env={"COLUMNS": "200"})


def test_recover_learned_and_rotary(assets, tmp_path):
    result = _invoke(assets, str(assets / "gpt2"), str(assets / "llama"), "--tokens", "6",
                     "--limit", "8", "--top-k", "5", "--folds", "3", "--n-boot", "100",
                     "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    for name in ("summary", "by_position", "hidden"):
        assert (tmp_path / f"{name}.csv").exists() and (tmp_path / f"{name}.json").exists()
    for png in ("token_by_position", "hidden_probe"):
        assert (tmp_path / "figures" / f"pe_recover_{png}.png").stat().st_size > 5000
    summary = pd.read_csv(tmp_path / "summary.csv")
    rotary = summary[summary.family == "llama"]
    assert list(rotary["metric"]) == ["not_applicable"]
    assert "not applicable: rotary positions are rotations of queries and keys, not added" in result.output
    learned = summary[(summary.family == "gpt2") & (summary.condition == "learned")].set_index("metric")
    assert learned.loc["raw_sum_max_abs_error", "value"] == 0.0
    # GPT-2 has no normalisation after the sum: subtracting the token gives the row back.
    assert learned.loc["known_token_max_abs_error", "value"] < 1e-5
    assert learned.loc["known_token_position_accuracy", "value"] == 1.0
    assert f"{learned.loc['token_accuracy', 'value']:.4f}" in result.output
    by_position = pd.read_csv(tmp_path / "by_position.csv")
    assert set(by_position["condition"]) == {"learned", "none", "random", "sinusoidal"}
    assert len(by_position[by_position.condition == "learned"]) == 64  # every position
    shown = by_position.dropna(subset=["ci_low"])  # no interval where every text agreed (width 0)
    assert len(shown) and (shown["ci_low"] <= shown["value"] + 1e-12).all()
    assert by_position.loc[by_position["ci_low"].isna(), "ci_high"].isna().all()
    hidden = pd.read_csv(tmp_path / "hidden.csv")
    assert set(hidden["intervention"]) == {"intact", "zero"} and hidden["layer"].max() == 2


@pytest.mark.parametrize("args,message", [
    (["MODEL", "--tokens", "1"], "pecli pe recover: tokens (--tokens): 1 is fewer than the 5 folds"),
    (["MODEL", "--top-k", "1"], "pecli pe recover: top_k (--top-k): 1 is out of range (at least 2)"),
    (["random:nosuch"], "unknown model family 'nosuch'"),
])
def test_recover_bad_args(assets, tmp_path, args, message):
    args = [str(assets / "gpt2") if a == "MODEL" else a for a in args]
    result = _invoke(assets, *args, "--limit", "8", "--out", str(tmp_path / "out"))
    assert result.exit_code == 1, result.output
    assert f"error: {message}" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()
