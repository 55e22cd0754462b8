"""The shipped presets: each validates; `study` fails fast offline; `smoke` runs end to end."""

import time

import pandas as pd
import pytest
from typer.testing import CliRunner

from pecli.cli.app import app
from pecli.experiments.reproduce import load_preset
from pecli.runs.config import preset_names
from pecli.runs.tables import validate

runner = CliRunner()


@pytest.mark.parametrize("name", preset_names())
def test_presets_validate(name):
    preset = load_preset(name)
    assert preset.entries and all(e.title for e in preset.entries)


def test_study_preset_fails_fast_without_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("PECLI_DATA_DIR", "")  # empty: the hub, not ../shared/data
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


def test_reproduce_twice_on_the_committed_results_changes_nothing(tmp_path, shared_data, monkeypatch):
    """`make demo` on a fresh clone: every experiment is done, so the committed files, REPORT.md
    included, stay byte for byte (and untouched) however often it runs."""
    import json
    import shutil

    from conftest import _need

    from pecli.experiments import EXPERIMENTS
    from pecli.runs.config import CONFIG_DIR

    committed = CONFIG_DIR.parent / "results" / "offline"
    preset = load_preset("offline")
    stale = [e.id for e in preset.entries
             if not (committed / e.id / "done.json").exists()
             or json.loads((committed / e.id / "done.json").read_text())["key"]
             != e.key(EXPERIMENTS.get(e.experiment).version)]
    _need(not stale, f"committed results/offline predate the code for {stale}: "
                     "re-run `pecli reproduce --preset offline` and commit")
    out = tmp_path / "offline"
    shutil.copytree(committed, out)
    monkeypatch.setenv("PECLI_DATA_DIR", str(shared_data))

    def snapshot():
        return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns)
                for p in sorted(out.rglob("*")) if p.is_file()}

    before = snapshot()
    for _ in range(2):
        result = runner.invoke(app, ["reproduce", "--preset", "offline", "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert f"0 run, {len(preset.entries)} skipped" in result.output
        assert snapshot() == before


def test_version():
    import pecli

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith(f"pecli {pecli.__version__} (git ")
