"""Piped output is not silent: plain progress lines on stderr (a Rich bar only in a terminal)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pandas as pd
import pytest

from pecli.runs.progress import PlainProgress


def test_plain_progress_says_every_ten_percent_and_at_the_end():
    stream = io.StringIO()
    with PlainProgress(stream=stream, every=1e9) as p:
        task = p.add_task("scoring", total=40)
        for _ in range(40):
            p.update(task, advance=1)
    lines = stream.getvalue().splitlines()
    shares = [int(re.search(r": (\d+) %", line).group(1)) for line in lines]
    assert shares == [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert lines[-1].startswith("pecli: scoring: 100 % (40/40)")


def test_plain_progress_says_something_after_the_interval_without_a_total():
    stream = io.StringIO()
    p = PlainProgress(stream=stream, every=0.0)
    task = p.add_task("scoring", total=None)
    p.update(task, advance=7)
    assert stream.getvalue().strip().endswith(": 7, 0 s")


@pytest.fixture
def checkpoint_dir(tiny, tmp_path):
    loaded = tiny("gpt2")
    folder = tmp_path / "tiny-gpt2"
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return folder


def test_a_piped_run_prints_progress_lines_on_stderr(checkpoint_dir, tmp_path):
    texts = tmp_path / "q.csv"
    pd.DataFrame({"question": [f"Question number {i} is about {'x ' * (i % 7)}things?"
                               for i in range(40)]}).to_csv(texts, index=False)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for command in (["perplexity", str(checkpoint_dir)], ["ablate", str(checkpoint_dir), "--limit", "40"]):
        run = subprocess.run(
            [sys.executable, "-m", "pecli", *command, "--dataset", str(texts), "--text", "question",
             "--batch-size", "4", "--out", str(tmp_path / command[0])],
            capture_output=True, text=True, env=env, timeout=300)
        assert run.returncode == 0, run.stderr
        lines = [line for line in run.stderr.splitlines() if line.startswith("pecli: ")]
        assert len(lines) >= 3, run.stderr  # ~every 10 %, not one line at the end
        assert re.search(r"100 % \(", lines[-1]), lines
        assert "\x1b[" not in run.stderr  # no terminal escapes in a log
