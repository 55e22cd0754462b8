"""Issue 46's sweep: every numeric option of every command that computes, given a hostile
value (NaN, infinite, negative, empty, zero where zero means nothing, a size that
overflows), or any one-value option given twice, is refused in one `error:` line before any
model or data loads; none is silently accepted.

Values that mean something documented are not hostile: --seed 0, --bootstrap 0 (no
interval), --probe-positions 0 (no probe), lm-eval's --num_fewshot 0, a --limit or
--batch-size past the data (every row, the largest batch). Found and fixed by this sweep:
finetune --lr/--head-lr 0 (trained nothing) and 1e30; --threads past torch's range and toy
length --train-length 1e12 (tracebacks); a repeated flag (the last won); a count of 1e12
(--seeds, --pairs, --layers, ...: ran until memory or patience gave out); attn --epsilon 0
(every head a sink).
"""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from pecli.cli.app import app

runner = CliRunner()

BASE = {"ablate": ["random:bert"], "perplexity": ["random:gpt2"], "mc": ["random:gpt2"],
        "length": ["random:llama"], "passkey": ["random:llama"], "attn": ["random:gpt2"],
        "finetune": ["random:bert"], "pe probe": ["random:bert"], "pe recover": ["random:bert"],
        "mask fit": ["random:gpt2"], "train lm": [], "toy arithmetic": ["--max", "9"],
        "toy length": [], "ruler": ["random:llama"], "lm-eval": ["random:gpt2", "--tasks", "truthfulqa_mc1"],
        "reproduce": ["--out", "o"], "compare": ["."],
        "tune": ["random:llama", "--condition", "rerope", "--grid", "W=16,32", "--length", "64"]}
HOSTILE = ["nan", "inf", "-inf", "", "-1", "abc"]  # no count, size, rate or seed is negative; not a number
HUGE = "1000000000000"
ZERO_MEANS = {"--seed", "--bootstrap", "--probe-positions", "--num_fewshot"}  # documented: 0 is a choice
MEANINGLESS = {("finetune", "--lr"): ["0", "1e30"], ("finetune", "--head-lr"): ["0", "1e30"]}


def _options(key: str):
    """The command's visible options that take a value (deprecated spellings are hidden)."""
    command = typer.main.get_command(app)
    for part in key.split():
        command = command.commands[part]
    return [p for p in command.params if p.param_type_name == "option" and not p.is_flag and not p.hidden]


def _numeric_options():
    for key, base in BASE.items():
        for p in _options(key):
            ann = str(p.type_descriptor.annotation)
            if ("int" in ann or "float" in ann) and "list" not in ann:
                huge = [HUGE] if "int" in ann else []  # every count has a ceiling
                zero = [] if p.opts[0] in ZERO_MEANS else ["0"]  # found: attn --epsilon 0
                for value in [*HOSTILE, *zero, *huge, *MEANINGLESS.get((key, p.opts[0]), [])]:
                    yield [*key.split(), *base, p.opts[0], value]


def _repeated_options():
    """Every one-value option given twice: click would keep the second silently."""
    for key, base in BASE.items():
        for p in _options(key):
            if not p.multiple and p.opts[0] not in base:
                yield [*key.split(), *base, p.opts[0], "1", p.opts[0], "2"]


def _never(*args, **kwargs):
    raise AssertionError("loaded before the options were checked")


@pytest.fixture
def refused(monkeypatch, tmp_path):
    """refused(args): the command fails in one `error:` line, nothing loaded."""
    monkeypatch.setattr("pecli.models.loading.load_model", _never)
    monkeypatch.setattr("pecli.data.datasets.load_data", _never)
    monkeypatch.setattr("pecli.measures.training.build_model", _never)
    monkeypatch.chdir(tmp_path)

    def check(args):
        result = runner.invoke(app, args)
        assert result.exit_code != 0 and not isinstance(result.exception, AssertionError), \
            "accepted: " + " ".join(args)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), result.output

    return check


@pytest.mark.parametrize("args", list(_numeric_options()), ids=" ".join)
def test_no_hostile_number_is_accepted(refused, args):
    refused(args)


@pytest.mark.parametrize("args", list(_repeated_options()), ids=" ".join)
def test_a_one_value_option_given_twice_is_refused(monkeypatch, tmp_path, args):
    monkeypatch.setattr("pecli.models.loading.load_model", _never)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert f"{args[-2]} given twice; give it once" in lines[0], lines[0]


def _text_options():
    """Every option that takes text, given an empty or blank value (not its default)."""
    for key, base in BASE.items():
        for p in _options(key):
            ann = str(p.type_descriptor.annotation)
            if not (("int" in ann or "float" in ann) and "list" not in ann) and p.opts[0] not in base \
                    and p.default != "":
                yield [*key.split(), *base, p.opts[0], "  "]  # "" and "  " meet the same check
                if "Path" in ann:
                    yield [*key.split(), *base, f"{p.opts[0]}="]  # the inline spelling too


@pytest.mark.parametrize("args", list(_text_options()), ids=lambda a: " ".join(a[:-1]) + f" {a[-1]!r}")
def test_an_empty_text_option_is_refused(refused, args):
    """Found by this sweep: --split "", --text-field " ", --rope-scaling "" and the like were
    read as their defaults (or dropped) and the run went on; --out "" or --data-dir "" as the
    current folder."""
    refused(args)
