"""Issue 46 §4's small ones: each message names its own flag, the help lists what is accepted,
one condition has one label, a warning is said once, learning rates and steps mean something."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pecli.cli.app import app
from pecli.experiments.options.perplexity import PerplexityOptions
from pecli.runs.names import MASKS, PE_SCHEMES, parse

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "models" / "tiny-gpt2-imdb")
MASK = ROOT / "results" / "offline" / "mask-fit-tiny-gpt2" / "mask" / "mask.json"


def _never(*a, **k):
    raise AssertionError("weights loaded")


@pytest.mark.parametrize("args, words", [
    (["train", "lm", "--test-lengths", "16,64,0"], "test_lengths (--test-lengths)"),
    (["toy", "arithmetic", "--pe", "randomized"], "randomized is trained by pecli toy length"),
    (["mask", "fit", TINY, "--lr", "1e12"], "at most 10.0"),
    (["mask", "fit", TINY, "--lr", "0"], "at least 1e-08"),
    (["mask", "fit", TINY, "--steps", "100000000"], "at most 1000000"),
    (["finetune", "minilm", "--head-lr", "5"], "at most 1.0"),
    (["toy", "length", "--lr", "2"], "at most 1.0"),
    (["toy", "length", "--steps", "10000000"], "at most 1000000"),
])
def test_one_line_naming_the_flag_given(monkeypatch, tmp_path, args, words):
    monkeypatch.setattr("pecli.models.loading.load_model", _never)
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "o")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert words in lines[0], result.output
    assert "(--lengths)" not in lines[0]


@pytest.mark.parametrize("command", [["train", "lm"], ["toy", "length"]])
def test_pe_help_lists_every_scheme_the_command_takes(command):
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0
    for scheme in PE_SCHEMES.names():
        assert scheme in result.output, scheme


def test_one_condition_one_label_and_repeats_dropped_with_a_note():
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        o = PerplexityOptions.build({"model": "random:llama", "intervention":
                                     "sinks:04:16,sinks:4:+16,sinks:4:16,droplow:0.250,"
                                     "lminfinite:4:16:16.0,shift:+3,zero@even"}, "test")
    assert [str(c) for c in o.intervention] == ["sinks:4:16", "droplow:0.25", "lminfinite:4:16:16",
                                                "shift:3", "zero@even"]
    assert [str(w.message) for w in said] == [
        "intervention (--intervention): sinks:4:16 given more than once; each runs once"]
    assert str(parse(MASKS, "linear")) == "linear"


def test_a_mask_file_with_its_digest_needs_no_file_prefix():
    digest = hashlib.sha256(MASK.read_bytes()).hexdigest()[:16]
    assert parse(MASKS, f"{MASK}#sha256:{digest}") == parse(MASKS, f"file:{MASK}#sha256:{digest}")


def test_fewer_than_two_texts_is_said_once(tmp_path, shared_data):
    data = tmp_path / "one.csv"
    data.write_text("text\nthe one review in this file is short but fine\n")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("default")  # Python's own, as on the command line
        result = runner.invoke(app, ["perplexity", TINY, "--dataset", str(data), "--intervention",
                                     "zero", "--device", "cpu", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert sum("fewer than 2 texts" in str(w.message) for w in said) == 1  # was 4: once per caller


def test_the_commit_is_read_when_the_process_starts(monkeypatch, tmp_path):
    """Rows name the commit the running code came from: git is asked before the command runs
    (and cached), so a commit made during an hours-long run does not stamp its rows."""
    asked = []
    monkeypatch.setattr("pecli.runs.provenance.git_state", lambda: asked.append(1) or {})
    monkeypatch.setattr("pecli.models.loading.load_model", _never)
    result = runner.invoke(app, ["ablate", "no-such-model", "--out", str(tmp_path / "o")])
    assert result.exit_code != 0 and asked == [1]
