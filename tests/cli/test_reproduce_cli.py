"""The shipped presets: each validates; `study` fails fast offline; `smoke` runs end to end."""

import time

import pandas as pd
import pytest
from typer.testing import CliRunner

from pecli.cli import app
from pecli.config import load_preset, preset_names
from pecli.tables import validate

runner = CliRunner()


@pytest.mark.parametrize("name", preset_names())
def test_presets_validate(name):
    preset = load_preset(name)
    assert preset.entries and all(e.title for e in preset.entries)


def test_study_preset_fails_fast_without_hub(tmp_path, monkeypatch):
    monkeypatch.delenv("PECLI_DATA_DIR", raising=False)
    start = time.perf_counter()
    result = runner.invoke(app, ["reproduce", "--preset", "study", "--out", str(tmp_path)])
    assert result.exit_code == 1 and time.perf_counter() - start < 20
    line = result.output.strip()
    assert line.startswith("error: preset 'study' cannot run here")
    for name in ("'bert-base-uncased'", "'gpt2'", "dataset 'imdb'", "dataset 'truthfulqa'"):
        assert name in line
    assert not any(tmp_path.iterdir())  # nothing computed, nothing written


@pytest.mark.slow
def test_smoke_preset_end_to_end_and_resume(tmp_path, shared_data):
    out = tmp_path / "smoke"
    result = runner.invoke(app, ["reproduce", "--preset", "smoke", "--out", str(out),
                                 "--data-dir", str(shared_data)])
    assert result.exit_code == 0, result.output
    report = (out / "REPORT.md").read_text()
    preset = load_preset("smoke")
    for entry in preset.entries:
        csvs = list((out / entry.id).glob("*.csv*"))
        assert csvs, entry.id
        for csv in csvs:
            table = pd.read_csv(csv)
            # rows measured on a model and data carry both provenances; the sinusoid and
            # embedding-matrix tables have no data
            validate(table, model_rows="dataset" in table.columns)
        assert entry.title in report
    assert list((out / "figures").rglob("*.png"))
    start = time.perf_counter()
    again = runner.invoke(app, ["reproduce", "--preset", "smoke", "--out", str(out),
                                "--data-dir", str(shared_data)])
    assert again.exit_code == 0 and f"0 run, {len(preset.entries)} skipped" in again.output
    assert time.perf_counter() - start < 10
