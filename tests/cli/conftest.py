"""Fixtures of the command tests: a command that loads a tiny model, and the CLI runner."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pecli.cli import app


@pytest.fixture
def use_tiny(tiny, monkeypatch):
    """`pecli <command> <family>` loads tiny(<family>) instead of a real checkpoint."""
    monkeypatch.setattr("pecli.loading.load_model", lambda name, **kw: tiny(name))


@pytest.fixture
def invoke():
    """invoke("perplexity", "gpt2", ...) -> the CliRunner result, 200 columns wide."""
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args), env={"COLUMNS": "200"})
