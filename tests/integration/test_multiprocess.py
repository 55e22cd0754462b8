"""Data parallel on CPU: 2 processes (torchrun, gloo) write the tables one process writes.

The batch plan is made before sharding, so every text sits in the same padded batch either
way: the tables must be equal exactly, apart from the `world_size` provenance column (and
the commit, which may move while other work lands).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
VARYING = ["world_size", "git_commit"]


def _launch(args: list[str], processes: int, env: dict, script: Path | None = None):
    """Run pecli (or `script`, which runs pecli) in 1 process or under torchrun."""
    start = [str(script)] if script else ["-m", "pecli"]
    if processes == 1:
        cmd = [sys.executable, *start, *args]
    else:
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
        cmd = [torchrun, "--standalone", "--nproc_per_node", str(processes), *start, *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)


def _pecli(args: list[str], processes: int, env: dict) -> str:
    """Run pecli in 1 process or under torchrun with `processes`; its stdout."""
    done = _launch(args, processes, env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _env(shared_data: Path, tmp_path: Path) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PECLI_DATA_DIR": str(shared_data),
            "PECLI_CACHE_DIR": os.environ.get("PECLI_CACHE_DIR", str(tmp_path / "cache"))}


def _compare(one: Path, two: Path) -> None:
    names = sorted(p.name for p in one.glob("*.csv*"))
    assert names and names == sorted(p.name for p in two.glob("*.csv*"))
    for name in names:
        a, b = pd.read_csv(one / name), pd.read_csv(two / name)
        assert (a["world_size"] == 1).all() and (b["world_size"] == 2).all(), name
        pd.testing.assert_frame_equal(a.drop(columns=VARYING), b.drop(columns=VARYING),
                                      check_exact=True, obj=name)


@pytest.mark.parametrize("command", [
    # 12 reviews in 4 batches of 3 (2 per process), both token sets, the probe's pooled rows
    ["ablate", "minilm", "--pe", "zero,shuffle", "--limit", "12", "--batch-size", "3",
     "--probe", "--baseline-pairs", "200"],
    # one-pass and prefix-by-prefix protocols (both sharded and gathered), a real trained GPT-2
    ["perplexity", "models/tiny-gpt2-imdb", "--mask", "default,linear",
     "--protocol", "relative,study", "--mask-semantics", "log-bias", "--limit", "8",
     "--batch-size", "3"],
    # shared-context groups of items (the primer's cache copied into each), a trained GPT-2
    ["mc", "models/tiny-gpt2-imdb", "--pe", "zero", "--limit", "6", "--batch-size", "8",
     "--bootstrap", "100"],
    # hidden states of 6 texts in 3 batches gathered, probes fitted by the main process
    ["pe", "probe", "minilm", "--limit", "6", "--max-length", "32", "--batch-size", "2",
     "--folds", "3", "--pairs", "100"],
], ids=["ablate", "perplexity", "mc", "pe-probe"])
def test_two_processes_equal_one(command, shared_data, minilm, tmp_path):
    env = _env(shared_data, tmp_path)
    one = _pecli([*command, "--out", str(tmp_path / "one")], 1, env)
    two = _pecli([*command, "--out", str(tmp_path / "two")], 2, env)
    # only the main process prints (each written file's path once)
    assert two.count(str(tmp_path / "two")) == one.count(str(tmp_path / "one")) > 0
    _compare(tmp_path / "one", tmp_path / "two")


# pecli, saving after every batch, with the main process interrupted in its batch DIE_AT
INTERRUPTED = """
import os, runpy, sys
import pecli.experiments.ablate, pecli.measures.metrics
pecli.experiments.ablate.measure.__kwdefaults__["checkpoint_every"] = 0
real, calls = pecli.measures.metrics.cosine_by_layer, []
def dying(*args):
    calls.append(1)  # two interventions: two calls per batch
    if len(calls) > 2 * (int(os.environ["DIE_AT"]) - 1) and os.environ.get("RANK", "0") == "0":
        raise KeyboardInterrupt
    return real(*args)
pecli.measures.metrics.cosine_by_layer = dying
sys.argv[0] = "pecli"
runpy.run_module("pecli", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("first, then", [(2, 1), (1, 2)], ids=["2-then-1", "1-then-2"])
def test_ablate_resumes_at_another_process_count(first, then, shared_data, minilm, tmp_path):
    """Interrupted with `first` processes, resumed with `then`: the saved batches are those of
    the whole run's plan, so the resumed tables equal an uninterrupted run's exactly."""
    command = ["ablate", "minilm", "--pe", "zero,shuffle", "--limit", "12", "--batch-size", "3",
               "--probe", "--baseline-pairs", "200"]  # 4 batches
    env = {**_env(shared_data, tmp_path), "PECLI_CACHE_DIR": str(tmp_path / "cache")}
    _pecli([*command, "--out", str(tmp_path / "whole")], 1, env)
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED)
    # 1 process dies in its batch 3, 2 processes in their batch 2: 2 batches saved either way
    died = _launch([*command, "--out", str(tmp_path / "died")], first,
                   {**env, "DIE_AT": str(4 - first)}, script)
    assert died.returncode != 0 and not (tmp_path / "died").exists()
    [saved] = (tmp_path / "cache" / "partial").glob("ablate-*.npz")
    resumed = _launch([*command, "--out", str(tmp_path / "resumed")], then, env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming: 2 of 4 batches were done before" in resumed.stderr
    assert not saved.exists()
    for name in sorted(p.name for p in (tmp_path / "whole").glob("*.csv*")):
        a, b = (pd.read_csv(tmp_path / d / name) for d in ("whole", "resumed"))
        assert (b["world_size"] == then).all(), name
        pd.testing.assert_frame_equal(a.drop(columns=VARYING), b.drop(columns=VARYING),
                                      check_exact=True, obj=name)
