"""Issue 46's sweep: every numeric option of every command that computes, given a hostile
value (NaN, infinite, empty, a count of zero where zero means nothing), is refused in one
`error:` line before any model or data loads; none is silently accepted.

Values that mean something documented are not hostile: --seed 0, --bootstrap 0 (no
interval), a --limit or --batch-size past the data (every row, the largest batch). Found and
fixed by this sweep: finetune --lr/--head-lr 0 (trained nothing) and 1e30.
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
        "mask fit": ["random:gpt2"], "train lm": [], "toy arithmetic": ["--max", "9"]}
HOSTILE = ["nan", "inf", "-inf", ""]
MEANINGLESS = {("finetune", "--lr"): ["0", "1e30"], ("finetune", "--head-lr"): ["0", "1e30"]}


def _numeric_options():
    group = typer.main.get_command(app)
    for key, base in BASE.items():
        command = group
        for part in key.split():
            command = command.commands[part]
        for p in command.params:
            ann = str(p.type_descriptor.annotation)
            if getattr(p, "param_type_name", "") == "option" and not getattr(p, "is_flag", False) \
                    and ("int" in ann or "float" in ann) and "list" not in ann:
                for value in [*HOSTILE, *MEANINGLESS.get((key, p.opts[0]), [])]:
                    yield [*key.split(), *base, p.opts[0], value]


def _never(*args, **kwargs):
    raise AssertionError("loaded before the options were checked")


@pytest.mark.parametrize("args", list(_numeric_options()), ids=" ".join)
def test_no_hostile_number_is_accepted(monkeypatch, tmp_path, args):
    monkeypatch.setattr("pecli.models.loading.load_model", _never)
    monkeypatch.setattr("pecli.data.datasets.load_data", _never)
    monkeypatch.setattr("pecli.measures.training.build_model", _never)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code != 0 and not isinstance(result.exception, AssertionError), \
        "accepted: " + " ".join(args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
