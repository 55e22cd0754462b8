"""Fault injection, sizes, output paths, intervals and messages (issue 36).

Classes: sizes bounded and applicability decided before any work (prompt and window lengths,
position buckets, data files and texts); sliding windows that report what they drop; output
folders resolved and checked before computing (empty, dangling or looping symlinks, a file),
a data directory that is a file; intervals for right-or-wrong metrics that cannot collapse
(mc's MC1 by Wilson) and none from fewer than 2 trials (passkey); a checkpoint without a
tokenizer named as such.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from pecli.runs.errors import ConfigError, DataError, ModelError, OutputError

TEXTS = ["The cat sat on the mat and looked around the room for a while.",
         "A boat drifted across the lake under a grey and quiet sky."] * 4


def _one_line(result, fragment: str, code: int = 1) -> None:
    assert result.exit_code == code and not isinstance(result.exception, AssertionError), result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], result.output


@pytest.fixture
def never_loads(monkeypatch):
    def loaded(*args, **kwargs):
        raise AssertionError("a model loaded before the input was refused")

    monkeypatch.setattr("pecli.models.loading.load_model", loaded)


def _nothing_left(folder) -> None:
    assert not [p for p in os.listdir(folder) if "partial" in p or p.endswith(".lock")], os.listdir(folder)


# --- sizes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("command, lengths", [("passkey", "100000000"), ("passkey", "64,131073"),
                                              ("length", "100000000"), ("length", "16,200000")])
def test_lengths_past_what_pecli_builds_are_refused_before_loading(invoke, never_loads, tmp_path,
                                                                   command, lengths):
    _one_line(invoke(command, "random:llama", "--lengths", lengths, "--out", str(tmp_path / "o")),
              "tokens")
    assert "131072 tokens" in invoke(command, "random:llama", "--lengths", lengths).output
    _nothing_left(tmp_path)


def test_past_a_learned_table_no_prompt_is_built(tiny, monkeypatch):
    """1,000,000 tokens on a 96-position model: not applicable, decided before fitting."""
    import pecli.measures.passkey as pk
    from pecli.experiments.options.passkey import PasskeyOptions
    from pecli.experiments.passkey import run

    asked = []
    fit = pk.fit
    monkeypatch.setattr(pk, "fit", lambda tok, k, n, *rest: asked.append(n) or fit(tok, k, n, *rest))
    o = PasskeyOptions.build({"model": "gpt2", "lengths": "80,100000", "depths": "0",
                              "trials": 2}, "t")
    acc = run(o, loaded=tiny("gpt2", n_positions=96))["passkey"]
    assert set(asked) == {80}
    assert acc.set_index("length").loc[100000, "note"].iloc[0].startswith("not applicable: 96 learned")


@pytest.mark.parametrize("buckets, lengths, ok", [(8, "16", True), (9, "16,32", False),
                                                  (16, "16", False), (2, "4", True), (3, "4", False)])
def test_buckets_must_fit_the_shortest_window(buckets, lengths, ok):
    from pecli.experiments.options.length import LengthOptions
    from pecli.measures.length_scoring import buckets as spans

    values = {"lengths": lengths, "buckets": buckets}
    if not ok:
        with pytest.raises(ConfigError, match=f"{buckets} position buckets do not fit a window of"):
            LengthOptions.build(values, "t")
        return
    LengthOptions.build(values, "t")
    for n in map(int, lengths.split(",")):  # every bucket holds a target (positions 1..n-1)
        assert len(spans(n, buckets)) == buckets and all(end > max(start, 1) for start, end in spans(n, buckets))


@pytest.mark.parametrize("n, length, stride, lead", [(1513, 16, 16, None), (1513, 16, 8, None),
                                                     (100, 10, 9, 0), (101, 10, 1, None),
                                                     (57, 8, 8, None), (2, 4, 3, None)])
def test_sliding_windows_report_every_token_they_do_not_score(n, length, stride, lead):
    """Counted literally: which stream tokens some window scores, and which none does."""
    from pecli.measures.length_scoring import cut

    c = cut(list(range(n)), length, "sliding", stride, lead)
    scored = []
    for offset, size, first in zip(c.offsets, c.sizes, c.firsts, strict=True):
        body = len(c.lead)
        scored += [offset + t - body for t in range(first, size)]
    assert len(scored) == len(set(scored))  # each at most once
    expected = set(range(0 if lead is not None else 1, n)) - set(scored)
    assert c.dropped_tokens == len(expected)
    if stride == length and lead is None and n > length:
        assert c.dropped_tokens > 0  # the window starts: 94 of 1513 in issue 36


@pytest.mark.parametrize("args", [["--stride", "17"], ["--stride", "16", "--start-token"]])
def test_a_stride_past_the_shortest_window_is_refused_before_loading(invoke, never_loads, tmp_path, args):
    _one_line(invoke("length", "random:llama", "--lengths", "16,64", "--windows", "sliding", *args,
                     "--out", str(tmp_path / "o")), "past the shortest window's")


def test_a_data_file_past_the_limit_is_refused_in_one_line(tmp_path, invoke, never_loads, monkeypatch):
    import pecli.data.datasets as ds

    path = tmp_path / "big.csv"
    pd.DataFrame({"text": TEXTS * 50}).to_csv(path, index=False)
    monkeypatch.setattr(ds, "MAX_DATA_BYTES", 1000)
    _one_line(invoke("length", "random:llama", "--dataset", str(path), "--out", str(tmp_path / "o")),
              "holds more than 0 MiB, the most pecli reads")
    _nothing_left(tmp_path)


def test_a_text_past_the_limit_is_refused_before_tokenising(tmp_path, monkeypatch):
    import pecli.data.datasets as ds

    monkeypatch.setattr(ds, "MAX_TEXT_CHARS", 100)
    path = tmp_path / "t.jsonl"
    pd.DataFrame({"text": [TEXTS[0], "word " * 40, TEXTS[1]]}).to_json(path, orient="records", lines=True)
    with pytest.raises(DataError, match=r"data row 2 of 'text' holds 200 characters, past the 100"):
        ds.load_data(str(path))


# --- output paths ------------------------------------------------------------------------------


def _make(tmp_path, kind):
    out = tmp_path / "out"
    if kind == "dangling":
        out.symlink_to(tmp_path / "nowhere" / "x")
    elif kind == "loop":
        out.symlink_to(tmp_path / "out2")
        (tmp_path / "out2").symlink_to(out)
    elif kind == "loop-parent":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        out = tmp_path / "a" / "sub"
    elif kind == "file":
        out.write_text("x")
    return out


@pytest.mark.parametrize("kind, words", [("dangling", "is a symlink to"), ("loop", "a symlink loop"),
                                         ("loop-parent", "a symlink loop"), ("file", "is a file, not a folder")])
@pytest.mark.parametrize("command", [["passkey", "random:llama", "--lengths", "32"],
                                     ["lm-eval", "--tasks", "truthfulqa_mc1"]])
def test_output_folders_are_checked_before_computing(invoke, never_loads, tmp_path, kind, words, command):
    out = _make(tmp_path, kind)
    _one_line(invoke(*command, "--out", str(out)), words)
    _nothing_left(tmp_path)


def test_a_symlink_to_a_folder_takes_the_results(tmp_path):
    from pecli.runs.io import RunOutput

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with RunOutput(tmp_path / "link", {"k": 1}) as output:
        output.write({"t": pd.DataFrame({"experiment": ["x"], "model": ["m"], "metric": ["m"],
                                         "value": [1.0]})}, {"k": 1})
    assert (tmp_path / "real" / "t.csv").exists() and (tmp_path / "link").is_symlink()


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_out_is_refused(invoke, never_loads, tmp_path, value, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("passkey", "random:llama", "--out", value)
    assert result.exit_code == 2 and "--out is empty; give a path" in result.output, result.output
    assert os.listdir(tmp_path) == []


def test_check_target_passes_a_new_folder(tmp_path):
    from pecli.runs.io import check_target

    assert check_target(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    with pytest.raises(OutputError):
        check_target(_make(tmp_path, "loop"))


def test_a_data_directory_that_is_a_file_says_so(tmp_path, invoke, never_loads):
    (tmp_path / "data").write_text("x")
    _one_line(invoke("length", "random:llama", "--data-dir", str(tmp_path / "data"),
                     "--out", str(tmp_path / "o")), "is a file, not a directory")


# --- intervals -----------------------------------------------------------------------------


@pytest.mark.parametrize("values", [[0, 0], [1, 1], [0, 1, 0], [1] * 7, [0] * 30])
def test_right_or_wrong_metrics_get_wilson_intervals_that_do_not_collapse(values):
    from pecli.experiments.mc import summarise
    from pecli.measures.intervals import wilson

    row = summarise(np.array(values, dtype=float), 1000, 0)
    assert (row["ci_low"], row["ci_high"]) == wilson(sum(values), len(values))
    assert row["ci_high"] > row["ci_low"] and row["interval_method"].startswith("Wilson")


def test_graded_metrics_keep_the_bootstrap_and_none_from_one_item():
    from pecli.experiments.mc import summarise

    graded = summarise(np.array([0.2, 0.9, 0.4]), 1000, 0)
    assert graded["interval_method"].startswith("percentile bootstrap")
    with pytest.warns(UserWarning, match="fewer than 2"):
        one = summarise(np.array([1.0]), 1000, 0)
    assert np.isnan(one["ci_low"]) and one["interval_method"] == ""
    off = summarise(np.array([1.0, 0.0]), 0, 0)  # --bootstrap 0: no intervals
    assert np.isnan(off["ci_low"])


def test_passkey_gives_no_interval_from_one_trial():
    from pecli.measures.intervals import wilson
    from pecli.measures.passkey import accuracy as _accuracy

    base = {"model": "m", "intervention": "learned", "rope_scaling": "none", "length": 64, "note": "",
            "trial": 0, "k": 1, "tokens": 64, "output": "", "answer": None, "metric": "correct"}
    acc = pd.DataFrame(_accuracy([{**base, "depth": 0.0, "value": 0.0},
                                  {**base, "depth": 1.0, "value": 1.0}]))
    per_depth, whole = acc[acc["depth"].astype(str) != "all"], acc[acc["depth"].astype(str) == "all"]
    assert per_depth["ci_low"].isna().all() and per_depth["ci_high"].isna().all()
    assert (whole["ci_low"].iloc[0], whole["ci_high"].iloc[0]) == wilson(1, 2)


# --- messages ------------------------------------------------------------------------------


def test_a_checkpoint_without_tokenizer_files_says_so(tiny, tmp_path):
    from pecli.models.loading import load_model

    tiny("gpt2").model.save_pretrained(tmp_path / "ckpt")
    with pytest.raises(ModelError, match=f"no tokenizer files in {tmp_path / 'ckpt'}"):
        load_model(str(tmp_path / "ckpt"), device="cpu")
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["model_type"] == "gpt2"


# --- the newer commands (attn, mask fit, finetune): every float finite, every input bounded ---


@pytest.mark.parametrize("args, words", [
    (["attn", "random:llama", "--epsilon", "nan"], "epsilon (--epsilon): nan is not a finite number"),
    (["attn", "random:llama", "--length", "100000000"], "100000000 tokens is past the longest input"),
    (["mask", "fit", "random:gpt2", "--lr", "nan"], "lr (--lr): nan is not a finite number"),
    (["mask", "fit", "random:gpt2", "--lr", "inf"], "lr (--lr): inf is not a finite number"),
    (["mask", "fit", "random:gpt2", "--max-length", "100000000"], "past the longest input"),
    (["finetune", "random:bert", "--lr", "nan"], "nan is not a finite number"),
    (["finetune", "random:bert", "--head-lr", "inf"], "head_lr (--head-lr): inf is not a finite"),
    (["finetune", "random:bert", "--max-length", "200000"], "past the longest input"),
])
def test_non_finite_floats_and_unbounded_lengths_are_refused_before_loading(invoke, never_loads,
                                                                            tmp_path, args, words):
    _one_line(invoke(*args, "--out", str(tmp_path / "o")), words)
