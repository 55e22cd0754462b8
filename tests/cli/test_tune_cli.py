"""`pecli tune` end to end on a tiny model: the choice is the curve's argmin, the splits share
no text, the report row equals `pecli length` on the report texts, resume, bad grids."""

from __future__ import annotations

import json

import pandas as pd
import pytest

WORDS = "grass sky sun river stone cloud field road light tree bird wind".split()


@pytest.fixture
def docs(tmp_path):
    path = tmp_path / "docs.csv"
    texts = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(18 + i % 5)) + f" ({i})."
             for i in range(40)]
    pd.DataFrame({"text": texts}).to_csv(path, index=False)
    return path


def _tune(invoke, docs, out, *extra):
    return invoke("tune", "llama", "--condition", "selfextend", "--grid", "G=2,4", "W=8,16",
                  "--length", "32", "--choice", "3", "--report", "10", "--dataset", str(docs),
                  "--bootstrap", "100", "--out", str(out), *extra)


def test_tune_chooses_the_argmin_on_one_split_and_reports_on_another(use_tiny, docs, tmp_path, invoke):
    out = tmp_path / "run"
    result = _tune(invoke, docs, out)
    assert result.exit_code == 0, result.output
    curve, report = pd.read_csv(out / "tune_curve.csv"), pd.read_csv(out / "tune_report.csv")
    assert list(curve["condition"]) == ["selfextend:2:8", "selfextend:2:16", "selfextend:4:8",
                                        "selfextend:4:16"]
    assert list(curve["group"]) == [2, 2, 4, 4] and list(curve["window"]) == [8, 16, 8, 16]
    argmin = curve.loc[curve["value"].idxmin(), "condition"]  # independently, from the rows
    assert curve.loc[curve["chosen"], "condition"].tolist() == [argmin]
    roles = report.set_index("role")
    assert list(report["role"]) == ["intact", "default", "best"]
    assert roles.loc["best", "condition"] == argmin and (report["subset"] == "report").all()
    assert (curve["subset"] == "choice").all() and (report["split"] == "file").all()  # the data's own split kept
    # the papers' default for 64 trained positions at 32 tokens: W = 32, G = 2 (changes nothing)
    assert roles.loc["default", "condition"] == "selfextend:2:32"
    assert roles.loc["default", "value"] == roles.loc["intact", "value"]
    # the splits: disjoint documents, hashed, in every row and in the sidecars
    choice, rep = (json.loads(curve[f"{s}_split"].iloc[0]) for s in ("choice", "report"))
    first, last = (int(x) for x in choice["text_ids"].split("-"))
    after = int(rep["text_ids"].split("-")[0])
    assert first <= last < after and choice["texts_sha256"] != rep["texts_sha256"]
    assert choice["windows"] == 3 and rep["windows"] >= 10 == len(set(report["units"])) * 10
    resolved = json.loads((out / "tune_report.json").read_text())["resolved"]
    assert json.loads(resolved["report_split"]) == rep
    # intervals over the report's >= 10 windows, paired against intact and the default
    best = roles.loc["best"]
    assert best["ci_low"] < best["value"] < best["ci_high"]
    assert best["diff_vs_intact"] == pytest.approx(best["value"] - roles.loc["intact", "value"])
    assert best["diff_vs_default"] == pytest.approx(best["value"] - roles.loc["default", "value"])
    assert pd.notna(best["diff_ci_low"]) and pd.notna(best["diff_default_ci_low"])
    assert curve["ci_low"].isna().all()  # 3 windows give no interval
    for p in ("group", "window"):
        assert (out / "figures" / f"tune_{p}.png").stat().st_size > 10_000
    assert "best" in result.output and "report split" in result.output


def test_a_report_row_equals_pecli_length_on_the_report_texts(use_tiny, docs, tmp_path, invoke):
    out = tmp_path / "tune"
    assert _tune(invoke, docs, out).exit_code == 0
    report = pd.read_csv(out / "tune_report.csv").set_index("role")
    ids = json.loads(report["report_split"].iloc[0])["text_ids"]
    a, b = (int(x) for x in ids.split("-"))
    texts = tmp_path / "report.csv"
    pd.read_csv(docs).iloc[a:b + 1].to_csv(texts, index=False)
    best = report.loc["best", "condition"]
    result = invoke("length", "llama", "--lengths", "32", "--intervention", best, "--dataset",
                    str(texts), "--bootstrap", "100", "--out", str(tmp_path / "length"))
    assert result.exit_code == 0, result.output
    length = pd.read_csv(tmp_path / "length" / "length.csv")
    whole = length[length["all_positions"]].set_index("intervention")
    for role, condition in (("intact", "intact"), ("best", best)):
        assert report.loc[role, "value"] == whole.loc[condition, "perplexity"]
        assert report.loc[role, "units"] == whole.loc[condition, "windows"]
    assert report.loc["best", "diff_vs_intact"] == whole.loc[best, "diff_vs_intact"]


def test_an_interrupted_tune_resumes(tiny, docs, interrupt):
    from pecli.experiments.tune import TuneOptions, run
    from pecli.measures import lm_scoring

    loaded = tiny("llama")
    o = TuneOptions.build({"model": "llama", "condition": "rerope", "grid": "W=8,16", "length": 32,
                           "choice": 3, "report": 10, "dataset": str(docs), "bootstrap": 100}, "t")
    full = run(o, loaded=loaded)
    # intact and rerope:8 on the choice split done, rerope:16 interrupted
    calls = interrupt(lm_scoring, "score_windows", 3)
    with pytest.raises(KeyboardInterrupt):
        run(o, loaded=loaded)
    calls.clear()
    resumed = run(o, loaded=loaded)
    # rerope:16 on the choice split; intact, default (rerope:16: 64 / 4) and best on the report
    assert len(calls) == 1 + 1 + (full["tune_report"]["condition"].nunique() - 1)
    for name in ("tune_curve", "tune_report"):
        cols = ["condition", "value", "ci_low", "diff_vs_intact"]
        assert resumed[name][cols].equals(full[name][cols])


def test_a_finished_tuning_keeps_another_tunings_unfinished_progress(tiny, docs, interrupt):
    """Tunings of one model, length and text share a checkpoint (intact's scores are reused):
    one that finishes keeps the other's unfinished progress and intact's, and the last to
    finish leaves nothing behind."""
    from pecli.experiments.tune import TuneOptions, run
    from pecli.measures import lm_scoring
    from pecli.runs.io import cache_dir

    loaded = tiny("llama")
    common = {"model": "llama", "length": 32, "choice": 3, "report": 10, "dataset": str(docs),
              "bootstrap": 100}
    rerope = TuneOptions.build({**common, "condition": "rerope", "grid": "W=8,16"}, "t")
    selfextend = TuneOptions.build({**common, "condition": "selfextend", "grid": "G=2 W=8"}, "t")
    full = run(rerope, loaded=loaded)
    calls = interrupt(lm_scoring, "score_windows", 3)  # intact and rerope:8 done, then Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        run(rerope, loaded=loaded)
    calls.clear()
    other = run(selfextend, loaded=loaded)
    # selfextend:2,8 on the choice split (intact's resumed), every report condition
    assert len(calls) == 1 + other["tune_report"]["condition"].nunique()
    calls.clear()
    resumed = run(rerope, loaded=loaded)
    # as if nothing ran between: rerope:16 on the choice split, then the report's conditions
    # but intact's (selfextend computed it)
    assert len(calls) == 1 + (full["tune_report"]["condition"].nunique() - 1)
    for name in ("tune_curve", "tune_report"):
        cols = ["condition", "value", "ci_low", "diff_vs_intact"]
        assert resumed[name][cols].equals(full[name][cols])
    assert not list((cache_dir() / "partial").glob("tune-*.npz"))


def test_a_default_a_grid_setting_computes_is_scored_as_that_setting():
    """STRING's default S = n/3 with W = S + 128 is the grid's string:2731 (W left at S + 128),
    DCA's C = 3n/4, L = n/16 the grid's dca:6144 (L left at C / 12): one setting, scored once."""
    from pecli.experiments.tune import TuneOptions, _default, settings

    def default(condition, grid, given=None):
        o = TuneOptions.build({"model": "llama", "condition": condition, "grid": grid,
                               "length": 16384, "choice": 1, "default": given}, "t")
        return _default(o, 8192, settings(condition, (grid,)))[0].text

    assert default("string", "S=2731,4096") == "string:2731"
    assert default("dca", "C=2048,6144") == "dca:6144"
    assert default("string", "S=2731,4096", "S=2731 W=3000") == "string:2731:3000"  # another W
    assert default("yarn", "S=3,4") == "yarn:2"


@pytest.mark.parametrize("args, words", [
    (["--condition", "selfextend", "--grid", "Q=2,4"], "its parameters: G (group), W (window)"),
    (["--condition", "selfextend", "--grid", "G=0,2", "W=8"], "group=0 window=8: selfextend:0:8: 0 is below 1"),
    (["--condition", "selfextend", "--grid", "W=8,16"], "selfextend needs group (G) too; e.g. G=4 W=1024"),
    (["--condition", "selfextend", "--grid", "G=2,4"], "selfextend needs window (W) too"),  # was 'takes N:N'
    (["--condition", "selfextend"], "give at least one parameter of selfextend, e.g. G=4 W=1024"),
    (["--condition", "zero", "--grid", "G=2"], "zero takes no parameters to tune"),
    (["--condition", "yarn", "--grid", "factor=0.5,2"], "factor 0.5 must be"),
    (["--condition", "string", "--grid", "S=64", "W=16"], "W must be at least S"),
    (["--condition", "rerope", "--grid", "W=8", "--default", "k=2"], "rerope needs window (W) too"),
])
def test_bad_grids_are_refused_in_one_line_before_loading(docs, invoke, monkeypatch, args, words):
    def never(*a, **k):
        raise AssertionError("loaded a model")

    monkeypatch.setattr("pecli.models.loading.load_model", never)
    result = invoke("tune", "llama", *args, "--length", "32", "--dataset", str(docs))
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], result.output


def test_passkey_objective_splits_trials_and_chooses_the_best_accuracy(tiny):
    from pecli.experiments.tune import TuneOptions, run

    loaded = tiny("llama", max_position_embeddings=256)
    o = TuneOptions.build({"model": "llama", "condition": "yarn", "grid": "factor=2,4",
                           "objective": "passkey", "length": 128, "choice": 4, "report": 10,
                           "bootstrap": 100}, "t")
    tables = run(o, loaded=loaded)
    curve, report = tables["tune_curve"], tables["tune_report"]
    assert list(curve["rope_scaling"]) == ["yarn:2", "yarn:4"] and list(curve["factor"]) == [2.0, 4.0]
    best = curve.loc[curve["chosen"]].iloc[0]
    assert best["value"] == curve["value"].max()  # the first of the highest on a tie
    assert best["condition"] == curve[curve["value"] == curve["value"].max()].iloc[0]["condition"]
    assert (curve["units"] == 4).all() and (report["units"] == 10).all()
    # yarn's rule, factor 128 / 256, is no scaling: no default to report
    assert list(report["role"]) == ["intact", "best"] and report["default_rule"].eq("").all()
    choice, rep = (json.loads(curve[f"{s}_split"].iloc[0]) for s in ("choice", "report"))
    assert choice["trials"] == 4 and rep["trials"] == 10 and choice["trials_sha256"] != rep["trials_sha256"]
    assert report["ci_low"].notna().all()  # Wilson over 10 trials
