"""Fault injection, inputs and resources: each class gives one line and a non-zero exit (or
the documented behaviour) before any forward pass.

Classes: file formats (suffix case, TSV, an existing file of another format), texts with no
real token, a stream read once (FIFO), probe labels, mc labels and items, preset size and
types, interventions past the model's table, one-text and degenerate intervals, huge
bootstrap counts, every form of device string, and messages that name current flags only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from pathlib import Path

import pandas as pd
import pytest

from pecli.data.datasets import load_data
from pecli.runs.errors import DataError

TEXTS = ["The cat sat on the mat.", "A boat drifted across the lake.", "She wrote three letters.",
         "Numbers appear in old stories."]


def _one_line(result, fragment: str, code: int = 1) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and fragment in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


# --- datasets ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["reviews.CSV", "reviews.Csv", "reviews.TSV", "reviews.tsv", "reviews.JSONL"])
def test_suffixes_match_in_any_case_and_tsv_is_read(tmp_path, name):
    path = tmp_path / name
    frame = pd.DataFrame({"text": TEXTS, "label": [0, 1, 0, 1]})
    if name.lower().endswith(".tsv"):
        frame.to_csv(path, sep="\t", index=False)
    elif name.lower().endswith(".jsonl"):
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_csv(path, index=False)
    data = load_data(str(path))
    assert data.texts() == TEXTS and data.labels() == [0, 1, 0, 1]


@pytest.mark.parametrize("name", ["notes.txt", "notes.xlsx", "notes"])
def test_an_existing_file_of_another_format_says_so(tmp_path, name):
    path = tmp_path / name
    path.write_text("text\nhello\n")
    with pytest.raises(DataError, match=r"exists but its format .* is not supported; give a CSV, TSV"):
        load_data(str(path))


def test_texts_of_whitespace_only_are_refused_before_any_model(tmp_path, invoke, monkeypatch):
    path = tmp_path / "t.jsonl"
    pd.DataFrame({"text": [TEXTS[0], "   ", "\t\n", TEXTS[1]]}).to_json(path, orient="records", lines=True)
    with pytest.raises(DataError, match=r"2 row\(s\) hold only whitespace in 'text' \(data rows 2, 3\)"):
        load_data(str(path))
    monkeypatch.setattr("pecli.models.loading.load_model", lambda *a, **k: pytest.fail("loaded"))
    _one_line(invoke("ablate", "random:bert", "--dataset", str(path), "--out", str(tmp_path / "o")),
              "hold only whitespace")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_read_once_and_hashed_from_what_was_read(tmp_path):
    fifo = tmp_path / "stream.csv"
    os.mkfifo(fifo)
    body = pd.DataFrame({"text": TEXTS}).to_csv(index=False).encode()

    def write():
        with open(fifo, "wb") as f:
            f.write(body)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    result = {}
    reader = threading.Thread(target=lambda: result.update(data=load_data(str(fifo))), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive(), "a second open of the FIFO would hang here"
    data = result["data"]
    assert data.texts() == TEXTS
    assert data.provenance()["data_revision" if "data_revision" in data.provenance() else "revision"] \
        == "sha256:" + hashlib.sha256(body).hexdigest()[:16]


# --- labels and items ------------------------------------------------------------------------


@pytest.mark.parametrize("labels, message", [
    ([0, 1, "yes", 1, 0, 1, 0, 1, 0, 0], "must all be numbers or all strings, not number and string"),
    ([0, 0, 0, 0, 0, 0, 0, 0, 0, 1], "at least 4 rows of each of 2 labels"),
    ([1] * 10, "at least 4 rows of each of 2 labels"),
    ([0, 1, None, 1, 0, 1, 0, 1, 0, 1], "have no label (first: row 3)"),
])
def test_probe_labels_are_checked_before_any_model_loads(tmp_path, invoke, monkeypatch, labels, message):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"text": f"text number {i}", "label": v}) + "\n"
                            for i, v in enumerate(labels)))
    monkeypatch.setattr("pecli.models.loading.load_model", lambda *a, **k: pytest.fail("loaded"))
    _one_line(invoke("ablate", "random:bert", "--probe", "--dataset", str(path), "--out",
                     str(tmp_path / "o")), message)


def test_string_probe_labels_work(tmp_path, use_tiny, invoke):
    path = tmp_path / "t.csv"
    pd.DataFrame({"text": [f"review {i} was {'good' if i % 2 else 'bad'}" for i in range(16)],
                  "label": ["pos" if i % 2 else "neg" for i in range(16)]}).to_csv(path, index=False)
    result = invoke("ablate", "bert", "--probe", "--dataset", str(path), "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "o" / "ablate_probe.csv").exists()


def _item(**changes) -> dict:
    item = {"question": "Is the sky blue?",
            "mc1_targets": {"Yes": 1, "No": 0}, "mc2_targets": {"Yes": 1, "Often": 1, "No": 0}}
    return {**item, **changes}


@pytest.mark.parametrize("change, message", [
    ({"mc1_targets": {"Yes": "yes", "No": "no"}}, "labels must be 0 or 1 (numbers), not 'yes'"),
    ({"mc2_targets": {"Yes": 1, "No": None}}, "labels must be 0 or 1 (numbers), not None"),
    ({"mc1_targets": {"Yes": 1, "Also yes": 1, "No": 0}}, "mc1_targets has 2 true choices"),
    ({"mc1_targets": {"Yes": True, "No": False}}, "labels must be 0 or 1 (numbers), not True"),
    ({"question": 42}, "the question is empty"),
    ({"mc1_targets": ["Yes", "No"]}, "must be a {choice: label} mapping"),
])
def test_mc_items_are_checked_before_any_model_loads(tmp_path, invoke, monkeypatch, change, message):
    path = tmp_path / "items.json"
    path.write_text(json.dumps([_item(), _item(**change)]))
    monkeypatch.setattr("pecli.models.loading.load_model", lambda *a, **k: pytest.fail("loaded"))
    _one_line(invoke("mc", "random:gpt2", "--dataset", str(path), "--out", str(tmp_path / "o")),
              message)


# --- presets -----------------------------------------------------------------------------------


def test_a_preset_of_a_few_hundred_bytes_cannot_expand_without_bound(tmp_path, invoke):
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for k in "bcdefgh":
        prev = chr(ord(k) - 1)
        lines.append(f"{k}: &{k} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, "
                     f"*{prev}, *{prev}, *{prev}]")
    bomb = "\n".join(f"# {line}" for line in lines)  # the anchors, then used as a title
    preset = tmp_path / "bomb.yaml"
    preset.write_text("name: bomb\nexperiments:\n  - experiment: pe-sinusoidal\n    id: one\n"
                      "    title: " + "\n".join(["&t0 t"]) + "\n")
    # the real bomb: anchors under `choices` (a list the preset may carry), 10^8 strings
    text = "name: bomb\nchoices:\n" + "\n".join(
        f"  - &{chr(97 + i)} [{', '.join(['*' + chr(96 + i)] * 10 if i else ['x'] * 10)}]"
        for i in range(8)) + "\nexperiments:\n  - experiment: pe-sinusoidal\n    id: one\n"
    preset.write_text(text)
    assert len(text) < 500 and bomb
    _one_line(invoke("reproduce", "--preset", str(preset), "--out", str(tmp_path / "o")),
              "expands past 1,000,000 characters")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("entry, message", [
    ("title: [1, 2]", "title must be a string, not list"),
    ("study_notes: {a: 1}", "study_notes must be a string, not dict"),
])
def test_preset_values_of_the_wrong_type_are_refused(tmp_path, invoke, entry, message):
    preset = tmp_path / "p.yaml"
    preset.write_text(f"name: p\nexperiments:\n  - experiment: pe-sinusoidal\n    id: one\n    {entry}\n")
    _one_line(invoke("reproduce", "--preset", str(preset), "--out", str(tmp_path / "o")), message)


# --- interventions, intervals, resources --------------------------------------------------------


def test_shift_past_a_learned_table_is_refused(tmp_path, use_tiny, invoke):
    from tests.conftest import make_tiny

    n = make_tiny("gpt2").max_positions
    path = tmp_path / "t.csv"
    pd.DataFrame({"text": TEXTS}).to_csv(path, index=False)
    _one_line(invoke("ablate", "gpt2", "--intervention", f"shift:{n}", "--dataset", str(path),
                     "--out", str(tmp_path / "o")), f"reaches past all {n} learned positions")
    ok = invoke("ablate", "gpt2", "--intervention", f"shift:{n - 1}", "--dataset", str(path),
                "--out", str(tmp_path / "o2"))
    assert ok.exit_code == 0, ok.output


def test_one_text_gives_no_interval_and_says_so(tmp_path, use_tiny, invoke):
    path = tmp_path / "one.csv"
    pd.DataFrame({"text": [TEXTS[0]]}).to_csv(path, index=False)
    with pytest.warns(UserWarning, match="no 95 % interval from fewer than 2 texts"):
        result = invoke("perplexity", "gpt2", "--dataset", str(path), "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    assert "(no interval)" in result.output
    table = pd.read_csv(tmp_path / "o" / "perplexity.csv")
    assert table["ci_low"].isna().all() and table["ci_high"].isna().all()


@pytest.mark.parametrize("value, message", [
    ("1", "1 resamples give no meaningful 95 % interval; use 0 (no intervals) or 100 to 100000"),
    ("99", "use 0 (no intervals) or 100 to 100000"),
    ("1000000000", "is out of range (at least 0, at most 100000)"),
])
def test_bootstrap_counts_are_bounded(invoke, value, message):
    _one_line(invoke("perplexity", "random:gpt2", "--bootstrap", value), message)


@pytest.mark.parametrize("device, message", [
    ("cuda", "CUDA is not available"),
    ("cuda:0", "CUDA is not available"),
    ("cuda:3", "CUDA is not available"),
    ("cuda:", "unknown device 'cuda:'"),
    ("cuda:99999", "unknown device 'cuda:99999'"),
    ("mps", "unknown device 'mps'"),
    ("CPU", "unknown device 'CPU'"),
    ("cpu:0", "unknown device 'cpu:0'"),
    ("", "device (--device): '' is empty; give a value or leave the option out"),
])
def test_every_form_of_device_string_is_one_line(tmp_path, invoke, device, message):
    import torch

    if torch.cuda.is_available() and "CUDA is not available" in message:
        pytest.skip("this machine has CUDA")
    path = tmp_path / "t.csv"
    pd.DataFrame({"text": TEXTS}).to_csv(path, index=False)
    for command in (["perplexity", "random:gpt2"], ["ablate", "random:bert"], ["mc", "random:gpt2"]):
        data = [] if command[0] == "mc" else ["--dataset", str(path)]
        _one_line(invoke(*command, *data, "--device", device, "--limit", "2",
                         "--out", str(tmp_path / "o")), message)


def test_device_and_device_map_together_are_refused(invoke):
    _one_line(invoke("perplexity", "random:gpt2", "--device", "cpu", "--device-map", "auto"),
              "both place the model; give one")


# --- messages ------------------------------------------------------------------------------------


def test_messages_name_current_flags_only():
    """Every `--flag` written in pecli's messages and help is a flag some command has today,
    and none is a deprecated spelling (those appear only where they are announced as such)."""
    import typer

    from pecli.cli.app import app

    current, deprecated = set(), set()

    def walk(cmd):
        for p in getattr(cmd, "params", []):
            for opt in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]:
                (deprecated if getattr(p, "hidden", False) else current).add(opt)
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    assert {"--intervention", "--text-field", "--bootstrap"} <= current and "--n-boot" in deprecated
    root = Path(__file__).resolve().parents[2] / "pecli"
    outside = {"--no-deps", "--cpu", "--untracked-files", "--short", "--porcelain", "--num",
               "--nproc", "--nproc_per_node", "--num_processes", "--num-processes", "--standalone",
               "--always"}  # other tools' flags
    current.add("--help")
    wrong = []
    for path in root.rglob("*.py"):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if any("deprecated" in x.lower() or "hidden=True" in x for x in lines[max(0, number - 2):number]):
                continue  # a deprecated spelling, announced as one
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*(?:_[a-z_]+)?", line):
                if flag in deprecated - current or (flag not in current and flag not in outside):
                    wrong.append(f"{path.relative_to(root)}:{number}: {flag}")
    assert not wrong, wrong


@pytest.mark.parametrize("value, kind", [("42", "int"), ("4.5", "float"), ('["a", "b"]', "list"),
                                         ('{"a": 1}', "dict"), ("true", "bool")])
def test_a_jsonl_text_that_is_not_a_string_is_refused_with_its_line(tmp_path, value, kind):
    """Issue 46 §1: not coerced to a string and scored; the line counts blank lines too."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "A boat drifted."}\n\n{"text": ' + value + "}\n")
    with pytest.raises(DataError, match=rf"t.jsonl: line 3: 'text' is {kind} .*not a string"):
        load_data(str(path))
