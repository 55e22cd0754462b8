"""REPORT's findings: the words an interval licenses, the numbers read from a section's table,
and the committed REPORT.md's findings against its committed tables."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pecli.experiments.reproduce import (
    finding_lines,
    finding_numbers,
    finding_sentence,
    load_preset,
)
from pecli.measures.intervals import verdict
from pecli.runs.config import MAX_FINDINGS, Finding, _findings
from pecli.runs.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
WORDS = {"up": "rises", "down": "falls", "none": "shows no detectable difference"}


@pytest.mark.parametrize(("low", "high", "null", "said"), [
    (0.1, 0.5, 0.0, "rises"),
    (-0.5, -0.1, 0.0, "falls"),
    (-0.1, 0.2, 0.0, "shows no detectable difference"),
    (0.0, 0.3, 0.0, "shows no detectable difference"),  # touching zero does not exclude it
    (-0.3, 0.0, 0.0, "shows no detectable difference"),
    (float("nan"), float("nan"), 0.0, "shows no detectable difference"),  # no interval
    (0.3, 0.3, 0.0, "shows no detectable difference"),  # zero width: not an interval
    (0.55, 0.7, 0.5, "rises"),  # against chance
    (0.45, 0.7, 0.5, "shows no detectable difference"),
    (0.2, 0.45, 0.5, "falls"),
])
def test_verdict_rule_on_constructed_intervals(low, high, null, said):
    assert verdict(low, high, null=null, **WORDS) == said


def _texts(tmp_path, shift: float) -> Path:
    """Per-text perplexities of intact and zero on the same 40 texts; zero = intact * exp(shift)
    plus noise."""
    rng = np.random.default_rng(0)
    base = rng.uniform(5, 50, 40)
    tokens = rng.integers(20, 120, 40)
    noise = rng.normal(0, 0.3, 40)
    rows = [{"intervention": c, "text_id": i, "text_tokens": int(tokens[i]),
             "value": float(base[i] * (np.exp(shift + noise[i]) if c == "zero" else 1.0))}
            for c in ("intact", "zero") for i in rng.permutation(40)]  # rows in any order
    path = tmp_path / "texts.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _finding(**kw) -> Finding:
    return Finding(**{"question": "E2", "section": "s", "table": "texts", "measure": "paired",
                      "where": {"intervention": "zero"}, "reference": {"intervention": "intact"},
                      "weight": "text_tokens", "text": "it {verdict}: {value} against {reference}, {tested}",
                      **kw})


@pytest.mark.parametrize(("shift", "said"), [(1.0, "rises"), (-1.0, "falls"), (0.0, "no detectable")])
def test_paired_finding_reads_corpus_perplexities_and_words_them_by_the_interval(tmp_path, shift, said):
    path = _texts(tmp_path, shift)
    f = _finding()
    numbers = finding_numbers(f, path)
    df = pd.read_csv(path)
    corpus = {c: np.exp((g.text_tokens * np.log(g.value)).sum() / g.text_tokens.sum())
              for c, g in df.groupby("intervention")}  # the corpus perplexity, written plainly
    assert numbers["value"] == pytest.approx(corpus["zero"], rel=1e-12)
    assert numbers["reference"] == pytest.approx(corpus["intact"], rel=1e-12)
    t, low, high = numbers["tested"]
    assert t == pytest.approx(corpus["zero"] - corpus["intact"], rel=1e-9)
    assert numbers["units"] == 40
    sentence = finding_sentence(f, numbers)
    assert said in sentence
    if said != "no detectable":
        assert low < t < high and (low > 0 or high < 0)
    else:
        assert low <= 0 <= high


def test_gap_finding_is_the_share_of_the_log_perplexity_gap(tmp_path):
    rng = np.random.default_rng(1)
    tokens = rng.integers(10, 60, 30)
    rows = []
    for i in range(30):
        for c, level in (("intact", 10.0), ("zero", 40.0), ("mask", 20.0)):
            rows.append({"intervention": "intact" if c == "intact" else "zero",
                         "mask": "linear" if c == "mask" else "default", "text_id": i,
                         "text_tokens": int(tokens[i]), "value": level * np.exp(rng.normal(0, 0.2))})
    path = tmp_path / "texts.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    f = _finding(measure="gap", where={"intervention": "zero", "mask": "linear"},
                 reference={"mask": "default"}, intact={"intervention": "intact", "mask": "default"},
                 words=("closes", "widens", "shows no detectable difference in"))
    numbers = finding_numbers(f, path)
    df = pd.read_csv(path)
    nll = {k: (g.text_tokens * np.log(g.value)).sum() / g.text_tokens.sum()
           for k, g in df.groupby(["intervention", "mask"])}
    z, i, x = nll[("zero", "default")], nll[("intact", "default")], nll[("zero", "linear")]
    t, low, high = numbers["tested"]
    assert t == pytest.approx((z - x) / (z - i), rel=1e-9)
    assert low < t < high
    assert finding_sentence(f, numbers).startswith("it closes")


def test_findings_are_checked_when_the_preset_loads():
    one = {"question": "E2", "section": "a", "text": "t", "table": "x", "where": {}}
    assert len(_findings([one], "p", {"a"})) == 1
    with pytest.raises(ConfigError, match="no section"):
        _findings([{**one, "section": "b"}], "p", {"a"})
    with pytest.raises(ConfigError, match="in that order"):
        _findings([one, {**one, "question": "E1"}], "p", {"a"})
    with pytest.raises(ConfigError, match="no detectable difference"):
        _findings([{**one, "words": ["up", "down", "same"]}], "p", {"a"})
    with pytest.raises(ConfigError, match=f"at most {MAX_FINDINGS}"):
        _findings([one] * (MAX_FINDINGS + 1), "p", {"a"})
    with pytest.raises(ConfigError, match="needs a reference row"):
        _findings([{**one, "measure": "independent"}], "p", {"a"})
    with pytest.raises(ConfigError, match="unknown key"):
        _findings([{**one, "claim": "x"}], "p", {"a"})
    with pytest.raises(ConfigError, match="interval must be one of"):
        _findings([{**one, "interval": "wilson"}], "p", {"a"})
    with pytest.raises(ConfigError, match="only with measure: paired"):
        _findings([{**one, "interval": "table"}], "p", {"a"})


def test_a_paired_finding_may_read_the_difference_its_section_computed(tmp_path):
    """interval: table -- the row's own DIFF_COLUMNS (e.g. seeds and texts crossed), worded
    by the same rule; a row without them is refused in one line."""
    rows = pd.DataFrame({"intervention": ["intact", "zero"], "metric": "m", "value": [0.73, 0.58],
                         "seeds": 5, "diff_vs_intact": [np.nan, -0.15],
                         "diff_ci_low": [np.nan, -0.25], "diff_ci_high": [np.nan, -0.07]})
    path = tmp_path / "t.csv"
    rows.to_csv(path, index=False)
    f = _finding(interval="table", weight="", where={"metric": "m", "intervention": "zero"},
                 words=("beats", "is worse than", "shows no detectable difference from"),
                 text="over {units} seeds it {verdict} intact: {value} against {reference}, {tested}")
    numbers = finding_numbers(f, path)
    assert numbers["tested"] == (-0.15, -0.25, -0.07) and numbers["units"] == 5
    assert finding_sentence(f, numbers) == ("over 5 seeds it is worse than intact: 0.58 against "
                                            "0.73, -0.15 [-0.25, -0.07]")
    rows.drop(columns=["diff_vs_intact"]).to_csv(path, index=False)
    with pytest.raises(ConfigError, match="no paired difference"):
        finding_numbers(f, path)


def test_an_independent_finding_compares_two_rows_own_trials(tmp_path):
    """measure: independent -- two lengths' own draws: right answers over trials from each
    row's counts, Newcombe's interval for independent proportions; a mean recall (a value that
    is not right / trials) or a table without counts is refused in one line."""
    from pecli.measures.intervals import independent_proportion_difference

    rows = pd.DataFrame({"task": "niah", "length": [1024, 4096], "value": [0.95, 0.6],
                         "all_right": [19, 12], "samples": 20})
    path = tmp_path / "ruler.csv"
    rows.to_csv(path, index=False)
    f = _finding(measure="independent", table="ruler", weight="", where={"task": "niah", "length": 4096},
                 reference={"length": 1024}, words=("rises", "falls", "shows no detectable difference"),
                 text="on {units} samples each it {verdict}: {value} against {reference}, {tested}")
    numbers = finding_numbers(f, path)
    assert numbers["tested"] == independent_proportion_difference(12, 20, 19, 20)
    assert finding_sentence(f, numbers) == ("on 20 samples each it falls: 0.60 against 0.95, "
                                            "-0.35 [-0.57, -0.09]")
    rows.assign(value=[0.97, 0.6]).to_csv(path, index=False)
    with pytest.raises(ConfigError, match="not 19 of 20"):
        finding_numbers(f, path)
    rows.drop(columns=["all_right"]).to_csv(path, index=False)
    with pytest.raises(ConfigError, match="no counts of right answers"):
        finding_numbers(f, path)


def _as_word(word: str, line: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", line) is not None


def test_committed_report_opens_with_findings_that_match_their_tables():
    """Every finding of results/offline/REPORT.md is the sentence its committed table gives,
    in the preset's order; a direction only where its interval excludes zero (or chance)."""
    out = ROOT / "results" / "offline"
    preset = load_preset("offline")
    text = (out / "REPORT.md").read_text(encoding="utf-8")
    block = text.split("## Findings\n", 1)[1].split("\n## ", 1)[0]
    committed = [line for line in block.splitlines() if re.match(r"\d+\. ", line)]
    assert committed == finding_lines(preset, out)
    assert 1 <= len(committed) <= MAX_FINDINGS
    assert text.index("## Findings") < text.index("## E1")  # the REPORT opens with them
    for f, line in zip(preset.findings, committed, strict=True):
        record = json.loads((out / f.section / "done.json").read_text())
        numbers = finding_numbers(f, out / f.section / record["tables"][f.table])
        _, low, high = numbers["tested"]
        null = numbers["null"] or 0.0
        if numbers["null"] is not None and (_as_word(f.words[0], line) or _as_word(f.words[1], line)):
            assert low > null or high < null, line
        if "no detectable difference" in line:
            assert not (low > null or high < null), line
        assert "{units}" not in f.text or " ? " not in line, line  # every count behind a sentence known



def test_every_committed_report_cell_finds_its_row():
    """Each quantity of results/offline/REPORT.md names exactly one row of its table: a cell
    that finds none (a preset still saying `intervention: learned` of tables that now say
    `intact`) or several would print '— (N rows match)'."""
    text = (ROOT / "results" / "offline" / "REPORT.md").read_text(encoding="utf-8")
    broken = [line for line in text.splitlines() if re.search(r"— \((\d+ rows match|no column )", line)]
    assert broken == []


def test_a_finding_unit_may_span_columns_as_passkey_trials_do(tmp_path):
    """Passkey trials repeat their index at every depth: the unit is depth x trial. The paired
    difference of two conditions' 0/1 answers is the mean difference with the paired bootstrap
    over those units; one column alone is refused as ambiguous, in one line."""
    from pecli.measures.intervals import paired_difference

    rng = np.random.default_rng(4)
    cells = [(d, t) for d in (0.0, 0.5, 1.0) for t in range(7)]
    right = {"rerope:2048": rng.random(21) < 0.9, "intact": rng.random(21) < 0.2}
    rows = [{"intervention": c, "length": 12288, "depth": d, "trial": t, "value": float(right[c][i])}
            for c in right for i, (d, t) in enumerate(cells)]
    path = tmp_path / "passkey_trials.csv"
    pd.DataFrame(rows).sample(frac=1, random_state=1).to_csv(path, index=False)
    f = _finding(table="passkey_trials", unit=("depth", "trial"), weight="",
                 where={"intervention": "rerope:2048", "length": 12288}, reference={"intervention": "intact"})
    numbers = finding_numbers(f, path)
    order = sorted(range(21), key=lambda i: f"{cells[i][0]} | {cells[i][1]}")
    assert numbers["tested"] == paired_difference(right["rerope:2048"][order] * 1.0,
                                                  right["intact"][order] * 1.0, n_boot=1000, seed=0)
    assert numbers["units"] == 21 and numbers["tested"][1] > 0
    with pytest.raises(ConfigError, match="several rows per trial"):
        finding_numbers(_finding(table="passkey_trials", unit="trial", weight="",
                                 where=f.where, reference=f.reference), path)
    with pytest.raises(ConfigError, match="unit is a column or a list"):
        _findings([{"question": "Remedies", "section": "s", "text": "t", "table": "x", "where": {},
                    "unit": []}], "t", {"s"})
