"""`pecli passkey` end to end on tiny models (CliRunner)."""

from __future__ import annotations

import json

import pandas as pd
import pytest


def test_passkey_writes_tables_figure_and_sidecar(use_tiny, tmp_path, invoke):
    """The default --draws independent: every trial its own draw, Wilson intervals, and every row
    naming its design."""
    out = tmp_path / "run"
    result = invoke("passkey", "llama", "--lengths", "72,96", "--depths", "0,1", "--trials", "2",
                    "--intervention", "zero", "--rope-scaling", "linear:2", "--out", str(out))
    assert result.exit_code == 0, result.output
    acc = pd.read_csv(out / "passkey.csv")
    trials = pd.read_csv(out / "passkey_trials.csv")
    assert set(trials["draws"]) == {"independent"} and set(acc["draws"]) == {"independent"}
    conditions = list(dict.fromkeys(zip(acc["intervention"], acc["rope_scaling"], strict=True)))
    assert conditions == [("intact", "none"), ("intact", "linear:2"), ("zero", "none"), ("zero", "linear:2")]
    assert len(acc) == 4 * 2 * 3  # conditions x lengths x (2 depths + all)
    assert len(trials) == 4 * 2 * 2 * 2 and set(trials["tokens"]) == {72, 96}
    for col in ("value", "ci_low", "ci_high", "correct", "trials", "model_revision", "rope_parameters"):
        assert acc[col].notna().all(), col
    assert (out / "figures" / "passkey.png").stat().st_size > 10_000
    sidecar = json.loads((out / "passkey.json").read_text())
    assert sidecar["config"]["depths"] == [0.0, 1.0] and "Newcombe" in json.dumps(sidecar)
    assert "intact" in result.output and "zero + linear:2" in result.output  # positions.labels.label
    # the summary shows every depth: right/trials per (condition, length, depth), as the table
    assert "depth 0.0" in result.output and "depth 1.0" in result.output
    for (_, _, length), cells in acc.groupby(["intervention", "rope_scaling", "length"], sort=False):
        by = cells.set_index(cells["depth"].astype(str))
        cell = f"{by.loc['0.0', 'correct']}/2 " if "0.0" in by.index else None
        assert cell is not None and any(line.count(f"{length:,}") and cell.strip() in line
                                        for line in result.output.splitlines())


def test_trials_that_share_their_filler_are_written_without_intervals(use_tiny, tmp_path, invoke):
    """--draws fixed (the remedies grid's design): counts and accuracies, no interval, and the
    run says why."""
    out = tmp_path / "fixed"
    with pytest.warns(UserWarning, match="share their filler"):  # pecli prints it as one line
        result = invoke("passkey", "llama", "--lengths", "72", "--depths", "0,1", "--trials", "2",
                        "--draws", "fixed", "--intervention", "zero", "--out", str(out))
    assert result.exit_code == 0, result.output
    acc = pd.read_csv(out / "passkey.csv")
    assert acc["correct"].notna().all() and acc[["ci_low", "ci_high", "diff_ci_low"]].isna().all().all()
    assert set(pd.read_csv(out / "passkey_trials.csv")["draws"]) == {"fixed"}
    assert "share their filler" in json.loads((out / "passkey.json").read_text())["config"]["intervals"]


@pytest.mark.parametrize("args, words", [
    (["llama", "--depths", "0,2"], "from 0 to 1"),
    (["llama", "--lengths", "x"], "must be integers"),
    (["llama", "--rope-scaling", "llama3:8"], "low_freq_factor and high_freq_factor"),
    (["random:gpt2", "--rope-scaling", "linear:2"], "rope-scaling applies to rotary"),
    (["random:bert"], "causal"),
])
def test_bad_input_one_line(use_tiny, invoke, args, words):
    result = invoke("passkey", *args)
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("lengths, fix", [("10", "at least"), ("8,12", "at least")])
def test_a_run_that_can_only_give_not_applicable_rows_is_refused(use_tiny, tmp_path, invoke, lengths, fix):
    """Issue 46 §3: every length shorter than the template: one line naming the smallest length
    that works, before any trial is scored, and no folder written."""
    result = invoke("passkey", "llama", "--lengths", lengths, "--trials", "1", "--out", str(tmp_path / "o"))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "no passkey trial fits" in lines[0] and fix in lines[0]
    assert not (tmp_path / "o" / "passkey.csv").exists()
