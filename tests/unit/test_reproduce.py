"""Presets and the resumable runner, driven by a fake experiment registered like a real one."""

import dataclasses
import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest

from pecli.data.datasets import load_data
from pecli.experiments import EXPERIMENTS, Experiment
from pecli.experiments.reproduce import load_preset, run_preset
from pecli.runs.errors import ConfigError
from pecli.runs.fields import Options, option
from pecli.runs.provenance import row_provenance

CALLS: list[dict] = []


@dataclasses.dataclass(frozen=True)
class FakeOptions(Options):
    model: str = "random:gpt2"
    limit: int = option(3, low=1)
    seed: int = option(0, low=0)
    device: str = "cpu"
    data_dir: str | None = None  # read IMDB's test split from it (the data's provenance in the rows)


def _run(o: FakeOptions):
    from pecli.models.loading import weights_sha256

    CALLS.append({"model": o.model, "limit": o.limit})
    revision = weights_sha256(Path(o.model)) if Path(o.model).is_dir() else "seed:0"  # as a loaded model's
    data = load_data("imdb", "test", data_dir_=o.data_dir).provenance() if o.data_dir else {}
    rows = [{"experiment": "fake", "metric": "m", "value": o.limit * 0.5 + i, "seed": o.seed, "i": i,
             "model_revision": revision, **data, **row_provenance()} for i in range(2)]
    return {"summary": pd.DataFrame(rows)}


def _figures(tables, fig_dir):
    fig_dir.mkdir(parents=True, exist_ok=True)
    path = fig_dir / "f.png"
    path.write_bytes(b"png")
    return [path]


@pytest.fixture
def fake_experiment():
    EXPERIMENTS.add("fake", Experiment("fake", 1, _run, _figures, "test double", FakeOptions))
    CALLS.clear()
    yield
    EXPERIMENTS._entries.pop("fake")


def _write(tmp_path, text):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return str(path)


PRESET = """
name: t
description: a test preset
defaults: {device: cpu, seed: 0}
choices: [aggregation is corpus perplexity]
experiments:
  - id: one
    experiment: fake
    title: "E0: fake"
    options: {limit: 4}
    report:
      - {label: "value at i=1", study: 2.5, table: summary, where: {metric: m, i: 1}}
      - {label: "max |x| at i=0", table: summary, where: {metric: m, i: 0}}
      - {label: "ambiguous", table: summary, where: {metric: m}}
"""


def test_runs_then_skips_then_forces(fake_experiment, tmp_path):
    preset = load_preset(_write(tmp_path, PRESET))
    out = tmp_path / "out"
    first = run_preset(preset, out, announce=lambda s: None)
    assert len(CALLS) == 1 and not first[0].skipped
    assert (out / "one" / "summary.csv").exists() and (out / "one" / "summary.json").exists()
    done = json.loads((out / "one" / "done.json").read_text())
    assert done["key"] == preset.entries[0].key(1)
    report = (out / "REPORT.md").read_text()
    assert "| value at i=1 | 2.5 | 3.0000 |" in report
    assert "— (2 rows match)" in report  # never a silently chosen row
    assert "| max \\|x\\| at i=0 | — | 2.0000 |" in report  # a pipe in a label stays in its cell
    assert "aggregation is corpus perplexity" in report and "figures/one/f.png" in report

    again = run_preset(preset, out, announce=lambda s: None)
    assert len(CALLS) == 1 and again[0].skipped
    assert again[0].seconds == done["seconds"]  # the report keeps the computing time
    run_preset(preset, out, force=True, announce=lambda s: None)
    assert len(CALLS) == 2


def test_changed_options_rerun(fake_experiment, tmp_path):
    out = tmp_path / "out"
    run_preset(load_preset(_write(tmp_path, PRESET)), out, announce=lambda s: None)
    run_preset(load_preset(_write(tmp_path, PRESET.replace("limit: 4", "limit: 5"))), out,
               announce=lambda s: None)
    assert [c["limit"] for c in CALLS] == [4, 5]


def test_interrupted_entry_is_redone(fake_experiment, tmp_path):
    out = tmp_path / "out"
    preset = load_preset(_write(tmp_path, PRESET))
    run_preset(preset, out, announce=lambda s: None)
    (out / "one" / "done.json").unlink()  # as if killed after the tables, before done.json
    run_preset(preset, out, announce=lambda s: None)
    assert len(CALLS) == 2


def test_an_entry_whose_local_input_changed_is_run_again(fake_experiment, tmp_path):
    """A finished entry is trusted only while the local files it read are the ones its results
    record: done.json's digests, or (finished before done.json kept them) its tables'."""
    weights = tmp_path / "model" / "model.safetensors"
    weights.parent.mkdir()
    weights.write_bytes(b"first weights")
    preset = load_preset(_write(tmp_path, PRESET.replace("limit: 4", f"limit: 4, model: {weights.parent}")))
    out, said = tmp_path / "out", []
    run_preset(preset, out, announce=said.append)
    done = out / "one" / "done.json"
    first = json.loads(done.read_text())["inputs"]
    assert list(first) == [str(weights.parent)] and first[str(weights.parent)].startswith("sha256:")
    run_preset(preset, out, announce=said.append)
    assert len(CALLS) == 1 and "skipped" in said[-1]

    weights.write_bytes(b"retrained weights")
    run_preset(preset, out, announce=said.append)
    assert len(CALLS) == 2
    assert f"its input {weights.parent} changed since it ran ({first[str(weights.parent)]} then" in said[-2]

    def finished_before_inputs_were_kept():
        record = json.loads(done.read_text())
        del record["inputs"]
        done.write_text(json.dumps(record))

    finished_before_inputs_were_kept()
    run_preset(preset, out, announce=said.append)  # its tables record today's weights: trusted
    assert len(CALLS) == 2 and "inputs" in json.loads(done.read_text())
    finished_before_inputs_were_kept()
    weights.write_bytes(b"weights of a third training")
    run_preset(preset, out, announce=said.append)
    assert len(CALLS) == 3 and "(not in its tables then" in said[-2]
    finished_before_inputs_were_kept()
    (out / "one" / "summary.csv").unlink()  # nothing to check the weights against: run again
    run_preset(preset, out, announce=said.append)
    assert len(CALLS) == 4 and "its table summary.csv is missing" in said[-2]
    (out / "one" / "summary.csv").unlink()  # a done.json that keeps its inputs: the same
    run_preset(preset, out, announce=said.append)
    assert len(CALLS) == 5 and "its table summary.csv is missing" in said[-2]
    table = out / "one" / "summary.csv"
    table.write_text(table.read_text().replace("\n", "\r\n"))  # edited: the REPORT would quote it
    run_preset(preset, out, announce=said.append)
    assert len(CALLS) == 6 and "its table summary.csv changed after it was written" in said[-2]
    run_preset(preset, out, announce=said.append)
    assert len(CALLS) == 6 and "skipped" in said[-1]
    (out / "one" / "summary.json").write_text('{"table_sha256": "cut short')
    run_preset(preset, out, announce=said.append)
    assert len(CALLS) == 7 and "its table's sidecar summary.json is not readable" in said[-2]


def test_an_entry_whose_data_file_changed_is_run_again(fake_experiment, tmp_path):
    """A finished entry is trusted only while the data files its rows name (by digest) are
    the data directory's files now: done.json's `data`, or its tables' for one finished before."""
    test = tmp_path / "data" / "imdb" / "test.parquet"
    test.parent.mkdir(parents=True)
    (test.parent / "train.parquet").write_bytes(b"not read by the entry")

    def write(texts):
        pd.DataFrame({"text": texts, "label": [0] * len(texts)}).to_parquet(test)
        return "sha256:" + hashlib.sha256(test.read_bytes()).hexdigest()[:16]

    first = write(["a review", "another review"])
    preset = load_preset(_write(tmp_path, PRESET.replace("limit: 4", f"limit: 4, data_dir: {test.parents[1]}")))
    out, said = tmp_path / "out", []
    run_preset(preset, out, announce=said.append)
    done = out / "one" / "done.json"
    assert json.loads(done.read_text())["data"] == {"imdb/test.parquet": first}  # not train: not read
    run_preset(preset, out, announce=said.append)
    assert len(CALLS) == 1 and "skipped" in said[-1]

    second = write(["a review", "a corrected review"])
    run_preset(preset, out, announce=said.append)
    assert len(CALLS) == 2
    assert f"its data imdb/test.parquet changed since it ran ({first} then, {second} now)" in said[-2]
    assert json.loads(done.read_text())["data"] == {"imdb/test.parquet": second}

    record = json.loads(done.read_text())
    del record["data"]  # finished before done.json kept its data: its tables name the file
    done.write_text(json.dumps(record))
    run_preset(preset, out, announce=said.append)
    assert len(CALLS) == 2 and json.loads(done.read_text())["data"] == {"imdb/test.parquet": second}
    write(["a third version"])
    run_preset(preset, out, announce=said.append)
    assert len(CALLS) == 3 and f"({second} then" in said[-2]


def _listing(tables):
    return "".join(f"{v}\n" for v in tables["summary"]["value"].astype(float))


def test_companion_files_come_with_the_tables_and_a_missing_or_damaged_one_is_made_again(
        fake_experiment, tmp_path):
    EXPERIMENTS._entries["fake"] = dataclasses.replace(EXPERIMENTS.get("fake"), companions={"listing.txt": _listing})
    preset = load_preset(_write(tmp_path, PRESET))
    out, said = tmp_path / "out", []
    run_preset(preset, out, announce=said.append)
    listing = out / "one" / "listing.txt"
    assert listing.read_text() == "2.0\n3.0\n" and not any("writing" in s for s in said)
    listing.unlink()  # a section finished before its experiment had companions
    run_preset(preset, out, announce=said.append)
    assert listing.read_text() == "2.0\n3.0\n" and "  writing listing.txt from its tables" in said
    listing.write_text("2.0\n")
    run_preset(preset, out, announce=said.append)
    assert listing.read_text() == "2.0\n3.0\n" and said[-1].endswith("(it differed from them)")
    assert len(CALLS) == 1  # made from the tables, not computed again
    assert "one/listing.txt" in (out / ".pecli-run.json").read_text()  # the folder's manifest


@pytest.mark.parametrize("bad, message", [
    ("limt: 3", "unknown option 'limt' (did you mean 'limit'?)"),
])
def test_unknown_option(fake_experiment, tmp_path, bad, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        load_preset(_write(tmp_path, PRESET.replace("limit: 4", bad)))


def test_bad_presets(fake_experiment, tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'experiment'.*did you mean 'experiments'"):
        load_preset(_write(tmp_path, "experiment: []"))
    with pytest.raises(ConfigError, match="unknown experiment 'fak'"):
        load_preset(_write(tmp_path, PRESET.replace("experiment: fake", "experiment: fak")))
    with pytest.raises(ConfigError, match="no preset 'ofline'.*did you mean 'offline'"):
        load_preset("ofline")


def test_preflight_names_every_missing_thing(fake_experiment, tmp_path, monkeypatch):
    monkeypatch.setenv("PECLI_DATA_DIR", "")  # empty: the hub, not ../shared/data
    text = PRESET.replace("options: {limit: 4}", "options: {limit: 4, model: gpt2}")
    preset = load_preset(_write(tmp_path, text))
    with pytest.raises(ConfigError, match=r"missing: model 'gpt2' \(hf download gpt2"):
        run_preset(preset, tmp_path / "out", announce=lambda s: None)
    assert CALLS == []  # nothing computed


def test_project_model_paths_are_found_from_any_directory(tmp_path, monkeypatch):
    from pecli.experiments.reproduce import located

    monkeypatch.chdir(tmp_path)  # models/tiny-gpt2-imdb is not here
    options = {"model": "models/tiny-gpt2-imdb", "models": ["minilm", "models/tiny-gpt2-imdb"],
               "interventions": ["zero", "swap:models/tiny-gpt2-imdb"], "limit": 3}
    found = located(options)
    assert Path(found["model"]).is_absolute() and (Path(found["model"]) / "config.json").exists()
    assert found["models"] == ["minilm", found["model"]]
    assert found["interventions"] == ["zero", f"swap:{found['model']}"] and found["limit"] == 3
    assert options["model"] == "models/tiny-gpt2-imdb"  # the preset's spelling (and key) stays


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_rerun_over_done_results_changes_no_file(fake_experiment, tmp_path, monkeypatch):
    import itertools
    import types

    from pecli.experiments import reproduce

    ticks = itertools.count(100.0, 21.46)  # the entry takes 21.46 s: kept in done.json as 21.5 s
    monkeypatch.setattr(reproduce, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    preset = load_preset(_write(tmp_path, PRESET))
    out = tmp_path / "out"
    run_preset(preset, out, announce=lambda s: None)
    before = _snapshot(out)
    # Another day, another checkout: nothing the report shows may come from the clock or HEAD.
    monkeypatch.setattr("pecli.runs.provenance.utc_now", lambda: "2099-01-01T00:00:00Z")
    monkeypatch.setattr("pecli.runs.provenance.git_state", lambda: {"git_commit": "0" * 12, "git_dirty": True})
    run_preset(preset, out, announce=lambda s: None)
    assert _snapshot(out) == before  # same bytes and untouched (mtime) files, REPORT.md included


def test_report_names_the_commit_of_each_section_and_the_study(fake_experiment, tmp_path):
    preset = load_preset(_write(tmp_path, PRESET))
    out = tmp_path / "out"
    run_preset(preset, out, announce=lambda s: None)
    commit = pd.read_csv(out / "one" / "summary.csv")["git_commit"].iloc[0]
    report = (out / "REPORT.md").read_text()
    assert f"computed at commit {commit}" in report  # the rows' commit, not HEAD's
    assert "short empirical study of position information in pretrained Transformers" in report
    assert "| quantity | study (its model) | pecli (this section's model) [95 % interval, where computed] |" in report


def test_a_section_may_stand_a_papers_numbers_beside_pecli_s(fake_experiment, tmp_path):
    """`reference` names whose numbers a report line's `study` gives: that column's header."""
    text = PRESET.replace('    title: "E0: fake"\n', '    title: "E0: fake"\n    reference: "the paper (Llama-2-7B)"\n')
    out = tmp_path / "out"
    run_preset(load_preset(_write(tmp_path, text)), out, announce=lambda s: None)
    report = (out / "REPORT.md").read_text()
    assert "| quantity | the paper (Llama-2-7B) | pecli (this section's model)" in report
    assert "| value at i=1 | 2.5 |" in report
    with pytest.raises(ConfigError, match="reference must be a string"):
        load_preset(_write(tmp_path, text.replace('"the paper (Llama-2-7B)"', "[1]")))


def test_a_copied_results_folder_reports_its_own_figures(fake_experiment, tmp_path):
    import shutil

    preset = load_preset(_write(tmp_path, PRESET))
    run_preset(preset, tmp_path / "a", announce=lambda s: None)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    (tmp_path / "b" / "REPORT.md").unlink()
    run_preset(preset, tmp_path / "b", announce=lambda s: None)
    assert (tmp_path / "b" / "REPORT.md").read_text() == (tmp_path / "a" / "REPORT.md").read_text()
    assert "![f](figures/one/f.png)" in (tmp_path / "b" / "REPORT.md").read_text()


def test_sidecar_records_the_resolved_configuration(tmp_path):
    from pecli.runs.io import write_table

    df = pd.DataFrame({"experiment": "x", "metric": "m", "value": [1.0, 2.0], "split": "validation",
                       "device": "cpu", "dtype": "float32", "rows": 7, "model": ["a", "b"]})
    write_table(df, tmp_path, "t", {"command": "x", "split": None, "device": "auto", "limit": 7})
    sidecar = json.loads((tmp_path / "t.json").read_text())
    assert sidecar["config"]["device"] == "auto"  # as given ...
    assert sidecar["resolved"] == {"split": "validation", "device": "cpu", "dtype": "float32",
                                   "rows": 7, "limit_used": 7, "model": ["a", "b"]}  # ... as used


def test_local_model_ids_are_the_same_on_every_machine(tiny, tmp_path, monkeypatch):
    from pecli.models.loading import load_model
    from pecli.runs.provenance import PROJECT_ROOT, portable_model_id

    assert portable_model_id(PROJECT_ROOT / "models" / "tiny-gpt2-imdb") == "models/tiny-gpt2-imdb"
    monkeypatch.chdir(PROJECT_ROOT / "models")
    assert portable_model_id("tiny-gpt2-imdb") == "models/tiny-gpt2-imdb"  # however it was typed
    folder = tmp_path / "my-checkpoint"
    loaded = tiny("gpt2")
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    again = load_model(str(folder), device="cpu")
    assert again.model_id == "my-checkpoint" and str(tmp_path) not in again.model_id
    assert again.revision.startswith("sha256:")  # the content hash says which weights


def _drawn(tables, fig_dir):
    import matplotlib.pyplot as plt

    from pecli.plots.style import save

    fig, ax = plt.subplots()
    ax.set_title("what\nof what")
    return [save(fig, fig_dir / "g.png")]


def test_a_presets_format_draws_done_entries_again_and_the_flag_wins(tmp_path, monkeypatch):
    """`format:` in a preset (and --format over it): a finished entry is not recomputed, its
    figures are drawn again from its tables in the formats asked for; the report shows the PNG."""
    from pecli.plots.style import figure_output

    EXPERIMENTS.add("fakefig", Experiment("fakefig", 1, _run, _drawn, "test double", FakeOptions))
    try:
        CALLS.clear()
        text = PRESET.replace("experiment: fake", "experiment: fakefig")
        out = tmp_path / "out"
        run_preset(load_preset(_write(tmp_path, text)), out, announce=lambda s: None)
        assert sorted(p.name for p in (out / "figures" / "one").iterdir()) == ["g.png"]
        report = (out / "REPORT.md").read_text()
        preset = load_preset(_write(tmp_path, "format: [png, pdf]\nshort_titles: true\n" + text))
        assert preset.format == ("png", "pdf") and preset.short_titles is True
        run_preset(preset, out, announce=lambda s: None)
        assert len(CALLS) == 1  # drawn again, not computed again
        assert sorted(p.name for p in (out / "figures" / "one").iterdir()) == ["g.json", "g.pdf", "g.png"]
        assert (out / "REPORT.md").read_text() == report
        with figure_output("svg"):
            run_preset(preset, out, announce=lambda s: None)
        assert (out / "figures" / "one" / "g.svg").exists() and len(CALLS) == 1
        with pytest.raises(ConfigError, match="p.yaml: format .*'gif' is not a figure format"):
            load_preset(_write(tmp_path, "format: gif\n" + text))
    finally:
        EXPERIMENTS._entries.pop("fakefig")


def test_report_puts_findings_first_and_code_path_checks_in_an_appendix(fake_experiment, tmp_path):
    text = PRESET + """  - id: check
    experiment: fake
    title: "Code path: fake on random weights"
    appendix: "that the fake experiment runs; its numbers say nothing"
    options: {limit: 3}
  - id: two
    experiment: fake
    title: "E9: a second finding"
    options: {limit: 5}
"""
    preset = load_preset(_write(tmp_path, text))
    assert [e.appendix for e in preset.entries] == ["", "that the fake experiment runs; its numbers say nothing", ""]
    assert preset.entries[1].key(1) == dataclasses.replace(preset.entries[1], appendix="").key(1)  # not in the key
    out = tmp_path / "out"
    run_preset(preset, out, announce=lambda s: None)
    report = (out / "REPORT.md").read_text()
    order = [report.index(s) for s in ("## E0: fake", "## E9: a second finding",
                                       "## Appendix: code-path checks on random weights",
                                       "### Code path: fake on random weights",
                                       "What it checks: that the fake experiment runs")]
    assert order == sorted(order) and "Findings first; the 1 code-path checks" in report


def test_report_cells_give_chance_and_never_a_zero_width_interval(tmp_path):
    from pecli.experiments.reproduce import _lookup

    csv = tmp_path / "mc.csv"
    pd.DataFrame({"metric": ["mc1", "mc2", "sink_rate"], "value": [0.25, 0.52, 0.0],
                  "ci_low": [0.20, 0.49, 0.0], "ci_high": [0.31, 0.55, 0.0],
                  "chance": [0.237, 0.464, None]}).to_csv(csv, index=False)
    assert _lookup(csv, {"metric": "mc1"}, "{:.3f}") == \
        "0.250 [0.200, 0.310] (chance 0.237: the interval contains it)"
    assert _lookup(csv, {"metric": "mc2"}, "{:.3f}") == "0.520 [0.490, 0.550] (chance 0.464)"
    assert _lookup(csv, {"metric": "sink_rate"}, "{:.3f}") == "0.000"


def test_report_cells_give_the_paired_difference_from_intact_where_the_table_has_one(tmp_path):
    from pecli.experiments.reproduce import _lookup

    csv = tmp_path / "t.csv"
    pd.DataFrame({"condition": ["intact", "zero", "shuffle"], "value": [0.75, 0.70, 0.75],
                  "ci_low": [0.72, 0.66, 0.71], "ci_high": [0.78, 0.74, 0.79],
                  "diff_vs_intact": [None, -0.05, 0.0], "diff_ci_low": [None, -0.07, 0.0],
                  "diff_ci_high": [None, -0.03, 0.0]}).to_csv(csv, index=False)
    assert _lookup(csv, {"condition": "intact"}, "{:.2f}") == "0.75 [0.72, 0.78]"
    assert _lookup(csv, {"condition": "zero"}, "{:.2f}") == \
        "0.70 [0.66, 0.74]; paired difference from intact -0.05 [-0.07, -0.03]"
    assert _lookup(csv, {"condition": "shuffle"}, "{:.2f}") == \
        "0.75 [0.71, 0.79]; paired difference from intact +0.00 (no interval)"  # never [0, 0]
