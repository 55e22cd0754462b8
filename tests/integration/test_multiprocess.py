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
VARYING = ["world_size", "git_commit", "process_tokens"]


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


def _compare(one: Path, two: Path, exact: bool = True, varying: tuple[str, ...] = ()) -> None:
    names = sorted(p.name for p in one.glob("*.csv*"))
    assert names and names == sorted(p.name for p in two.glob("*.csv*"))
    for name in names:
        a, b = pd.read_csv(one / name), pd.read_csv(two / name)
        assert (a["world_size"] == 1).all() and (b["world_size"] == 2).all(), name
        drop = [*VARYING, *varying]
        pd.testing.assert_frame_equal(a.drop(columns=drop, errors="ignore"),
                                      b.drop(columns=drop, errors="ignore"),
                                      check_exact=exact, rtol=1e-4, atol=1e-6, obj=name)


# pecli, counting the tokens its model embeds in each process: what each process computed
COUNTING = """
import atexit, os, runpy, sys
import pecli.models.loading as loading
real, seen = loading.load_model, [0]
def counted(*args, **kwargs):
    loaded = real(*args, **kwargs)
    loaded.model.get_input_embeddings().register_forward_hook(
        lambda mod, inputs, out: seen.__setitem__(0, seen[0] + inputs[0].numel()))
    return loaded
loading.load_model = counted
atexit.register(lambda: open(os.path.join(os.environ["COUNT_DIR"], "rank" + os.environ.get("RANK", "0")),
                             "w").write(str(seen[0])))
sys.argv[0] = "pecli"
runpy.run_module("pecli", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("command", [
    ["pe", "probe", "minilm", "--limit", "16", "--max-length", "32", "--folds", "3", "--pairs", "100"],
    ["ablate", "minilm", "--intervention", "zero", "--limit", "6", "--baseline-pairs", "200"],
    ["perplexity", "models/tiny-gpt2-imdb", "--intervention", "zero", "--limit", "4"],
    ["mc", "models/tiny-gpt2-imdb", "--intervention", "zero", "--limit", "4", "--bootstrap", "100"],
], ids=["pe-probe", "ablate", "perplexity", "mc"])
def test_every_process_computes_a_share(command, shared_data, minilm, tmp_path):
    """Small runs whose default plan has one batch: the plan is split so that each of the 2
    processes computes a share (tokens counted at each process's embedding layer), the
    header and every row say so, and the tables equal one process's to float noise."""
    env = _env(shared_data, tmp_path)
    script = tmp_path / "counting.py"
    script.write_text(COUNTING)
    for n in (1, 2):
        (tmp_path / f"count{n}").mkdir()
        done = _launch([*command, "--out", str(tmp_path / f"p{n}")], n,
                       {**env, "COUNT_DIR": str(tmp_path / f"count{n}")}, script)
        assert done.returncode == 0, done.stderr[-3000:]
    counts = {p.name: int(p.read_text()) for p in (tmp_path / "count2").iterdir()}
    assert sorted(counts) == ["rank0", "rank1"] and min(counts.values()) > 0, counts
    assert "computed by 2 processes (padded tokens per process: " in done.stderr
    table = next((tmp_path / "p2").glob("*.csv"))
    shares = pd.read_csv(table)["process_tokens"].iloc[0].split("/")
    assert len(shares) == 2 and min(map(int, shares)) > 0
    # the plan was split for 2 processes: its summary says so; the numbers do not move
    _compare(tmp_path / "p1", tmp_path / "p2", exact=False, varying=("batches", "max_batch_tokens"))


def test_accelerate_asked_for_more_processes_than_it_started_says_so(shared_data, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("with GPUs accelerate starts the processes it is asked for")
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    done = subprocess.run([accelerate, "launch", "--num_processes", "2", "-m", "pecli", "pe",
                           "sinusoidal", "--positions", "8", "--dim", "8", "--out", str(tmp_path / "o")],
                          env=_env(shared_data, tmp_path), cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "accelerate launch was asked for 2 processes but started 1" in done.stderr
    assert "torchrun --standalone --nproc_per_node 2 -m pecli" in done.stderr


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
        pd.testing.assert_frame_equal(a.drop(columns=VARYING, errors="ignore"),
                                      b.drop(columns=VARYING, errors="ignore"), check_exact=True, obj=name)
