"""Fault injection, outputs: a run's output folder is its own.

Classes: two live runs into one --out (real processes); a finished run of another command or
configuration in --out; --force; SIGTERM / SIGHUP / SIGKILL mid-run (staging folders and
locks); compare writing into what it reads, re-reading its own output, a folder named twice;
damaged or hand-edited tables given to compare. Each gives one line and a non-zero exit, or
the documented behaviour, and nothing partial or lost.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from pecli.cli.app import app
from pecli.runs.io import MANIFEST

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SINUSOID = ("pe", "sinusoidal", "--positions", "8", "--dim", "8")
SLOW_TOY = ("toy", "arithmetic", "--pe", "learned", "--max", "10")


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def _one_line(result, fragment: str, code: int = 1) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and fragment in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def _pecli(*args, **kwargs) -> subprocess.Popen:
    """pecli in its own process, with Ctrl-C's default action (a suite started in the
    background inherits SIGINT ignored, and so would the run)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "pecli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs)


def _leftovers(out: Path) -> list[str]:
    """Staging folders and locks of `out`, beside it and inside it."""
    found = [*out.parent.glob(f".{out.name}.partial-*"), *out.parent.glob(f".{out.name}.lock")]
    if out.is_dir():
        found += list(out.glob(".partial-*"))
    return sorted(p.name for p in found)


def _wait_for(condition, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


# --- two runs, one folder ------------------------------------------------------------------


def test_two_runs_of_different_configurations_at_once_never_both_succeed(tmp_path):
    out = tmp_path / "out"
    procs = [_pecli(*SLOW_TOY, "--steps", "60", "--out", out), _pecli(*SINUSOID, "--out", out)]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 1], results
    loser = next(err for code, _, err in results if code == 1)
    assert len(loser.strip().splitlines()) == 1 and "Traceback" not in loser, loser
    assert "being written by another run" in loser or "holds the outputs of another" in loser
    # the folder holds the winner's outputs only, all of them, as its manifest says
    manifest = json.loads((out / MANIFEST).read_text())
    winner = "toy" if results[0][0] == 0 else "pe-sinusoidal"
    assert manifest["key"]["experiment"] == winner
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert on_disk == sorted([*manifest["files"], MANIFEST])
    assert _leftovers(out) == []


def test_a_second_run_into_a_held_folder_is_refused_while_the_first_computes(tmp_path):
    out = tmp_path / "out"
    first = _pecli(*SLOW_TOY, "--steps", "2000", "--out", out)
    try:
        _wait_for(lambda: (tmp_path / ".out.lock").exists())
        _one_line(_invoke(*SINUSOID, "--out", out, "--force"), "is being written by another run (pid")
    finally:
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
    assert first.returncode == 130 and "interrupted: nothing was written" in err, err
    assert _leftovers(out) == [] and not out.exists()


# --- a finished run of another kind -----------------------------------------------------------


def test_a_finished_run_of_another_configuration_is_never_replaced_silently(tmp_path):
    out = tmp_path / "out"
    assert _invoke(*SINUSOID, "--out", out).exit_code == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    _one_line(_invoke("pe", "sinusoidal", "--positions", "6", "--dim", "8", "--out", out),
              "holds the outputs of another pe-sinusoidal run (positions: 8 -> 6)")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # the same configuration again is a rerun, not a mix
    assert _invoke(*SINUSOID, "--out", out).exit_code == 0


def test_force_replaces_the_earlier_run_and_leaves_none_of_its_files(tmp_path):
    out = tmp_path / "out"
    assert _invoke(*SINUSOID, "--out", out).exit_code == 0
    (out / "compare.csv").write_text("stale")  # not the new run's: must not survive a replace
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["files"].append("compare.csv")
    (out / MANIFEST).write_text(json.dumps(manifest))
    result = _invoke("toy", "arithmetic", "--pe", "learned", "--max", "10", "--steps", "2",
                     "--out", out, "--force")
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["key"]["experiment"] == "toy"
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert on_disk == sorted([*manifest["files"], MANIFEST])
    assert not (out / "compare.csv").exists() and not (out / "encoding.csv").exists()


def test_reproduce_refuses_a_folder_that_holds_another_command_s_run(tmp_path):
    out = tmp_path / "out"
    assert _invoke(*SINUSOID, "--out", out).exit_code == 0
    preset = tmp_path / "p.yaml"
    preset.write_text("name: p\nexperiments:\n  - experiment: pe-sinusoidal\n    id: one\n"
                      "    options: {positions: 4, dim: 4}\n")
    _one_line(_invoke("reproduce", "--preset", preset, "--out", out),
              "holds the outputs of another pe-sinusoidal run")
    assert not (out / "REPORT.md").exists()


def test_a_folder_written_before_manifests_is_recognised_by_its_sidecars(tmp_path):
    out = tmp_path / "out"
    assert _invoke(*SINUSOID, "--out", out).exit_code == 0
    (out / MANIFEST).unlink()
    assert _invoke(*SINUSOID, "--out", out).exit_code == 0  # same configuration: a rerun
    (out / MANIFEST).unlink()
    _one_line(_invoke("pe", "sinusoidal", "--positions", "6", "--dim", "8", "--out", out),
              "holds the outputs of another pe-sinusoidal run")


# --- signals ------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_a_run_like_ctrl_c(tmp_path, sig):
    out = tmp_path / "out"
    proc = _pecli(*SLOW_TOY, "--steps", "5000", "--out", out)
    _wait_for(lambda: any(tmp_path.glob(".out.partial-*")))
    time.sleep(1.0)  # into the training loop
    proc.send_signal(sig)
    code = proc.wait(timeout=120)
    err = proc.stderr.read()
    assert code == 128 + sig, err
    assert f"interrupted ({signal.Signals(sig).name})" in err and "Traceback" not in err, err
    assert _leftovers(out) == [] and not out.exists()


def test_what_a_killed_run_leaves_is_cleaned_by_the_next_run_there(tmp_path):
    out = tmp_path / "out"
    proc = _pecli(*SLOW_TOY, "--steps", "5000", "--out", out)
    _wait_for(lambda: any(tmp_path.glob(".out.partial-*")))
    proc.kill()  # SIGKILL: no handler runs
    proc.wait(timeout=60)
    assert _leftovers(out) != []  # a staging folder and the lock file stay behind ...
    assert _invoke(*SINUSOID, "--out", out).exit_code == 0
    assert _leftovers(out) == []  # ... until the next run into the same place


# --- compare ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name, pe in (("a", "learned"), ("b", "learned,none")):
        result = _invoke("toy", "arithmetic", "--pe", pe, "--max", "10", "--steps", "3",
                         "--out", root / name)
        assert result.exit_code == 0, result.output
    return root


def test_compare_never_writes_into_a_folder_it_reads(two_runs):
    for out in (two_runs / "a", two_runs / "a" / "cmp", two_runs / "x"):
        result = _invoke("compare", two_runs / "a", two_runs, "--out", out)
        _one_line(result, "a folder compare reads")
    assert not (two_runs / "a" / "compare.csv").exists()


def test_compare_ignores_its_own_outputs_and_folders_named_twice(two_runs, tmp_path):
    first = _invoke("compare", two_runs / "a", two_runs / "b", "--out", tmp_path / "c1")
    assert first.exit_code == 0, first.output
    # an earlier comparison inside the folder read is not a result: no metric twice
    inside = tmp_path / "all"
    (inside / "runs").mkdir(parents=True)
    for name in ("a", "b"):
        shutil.copytree(two_runs / name, inside / "runs" / name)
    shutil.copytree(tmp_path / "c1", inside / "c1")
    again = _invoke("compare", inside, inside / "runs" / "a", inside, "--out", tmp_path / "c2")
    assert again.exit_code == 0, again.output
    want = pd.read_csv(tmp_path / "c1" / "compare.csv")
    got = pd.read_csv(tmp_path / "c2" / "compare.csv")
    assert len(got) == len(want) and not got.duplicated(["run", "metric", "condition"]).any()


def test_compare_names_each_folder_once_in_an_error(tmp_path):
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    pd.DataFrame({"x": [1]}).to_csv(empty / "sub" / "t.csv", index=False)
    result = _invoke("compare", empty, empty, empty / "sub", "--out", tmp_path / "c")
    _one_line(result, "no headline numbers compare can use in")
    assert result.output.count(str(empty)) == 1, result.output


@pytest.mark.parametrize("damage", ["binary", "cut mid-row", "cut in a last field", "cut at a row's end",
                                    "edited"])
def test_compare_refuses_a_damaged_or_hand_edited_table_in_one_line(two_runs, tmp_path, damage):
    run = tmp_path / "run"
    run.mkdir()
    table = pd.read_csv(two_runs / "a" / "accuracy.csv")
    path = run / "accuracy.csv"
    if damage == "binary":
        path.write_bytes(b"\x89PNG\x00\x01" * 40)
    elif damage.startswith("cut"):
        table.to_csv(path, index=False)
        data = path.read_bytes()
        row_end = data.index(b"\n", len(data) // 3)
        cut = {"cut mid-row": (data.rindex(b"\n", 0, row_end) + row_end) // 2,
               "cut in a last field": row_end - 1, "cut at a row's end": row_end + 1}[damage]
        path.write_bytes(data[:cut])
    else:
        table["value"] = table["value"].astype(object)
        table.loc[0, "value"] = "n/a (I removed this)"
        table.to_csv(path, index=False)
    result = _invoke("compare", run, "--out", tmp_path / "c")
    if damage == "cut at a row's end":  # whole rows parse: only the checksum knows some are gone
        assert result.exit_code == 0, result.output
    else:  # no sidecar here: the table itself is checked (a cut mid-row was a traceback)
        _one_line(result, str(path))
        assert any(why in result.output for why in ("damaged or edited", "not a number", "cut short"))
    # beside its sidecar, any change at all is caught by the checksum pecli wrote
    shutil.copy(two_runs / "a" / "accuracy.json", run / "accuracy.json")
    result = _invoke("compare", run, "--out", tmp_path / "c")
    _one_line(result, "was changed after pecli wrote it")


def test_compare_reads_an_untouched_table_beside_its_checksum(two_runs, tmp_path):
    shutil.copytree(two_runs / "a", tmp_path / "run")
    assert _invoke("compare", tmp_path / "run", "--out", tmp_path / "c").exit_code == 0
