"""Results written before 0.2, rewritten as 0.2 writes them, every number untouched.

0.2 calls the unmodified model `intact` (it was `learned`, also for rotary, ALiBi and
relative-bias models) and gives every table a `condition` column
(pecli.positions.conditions.label). `migrate(folder)` rewrites each results table under a
folder that way (pecli.positions.conditions.upgraded), reading and writing every cell as
text so that no other byte of a row changes, then records it in the table's sidecar: the new
`table_sha256`, and `migrated` (what changed, from which sha256, by what). A preset's cache
keys stay valid: an entry's key also matches its options with `intact` spelled `learned`
(pecli.runs.config.Entry.keys), so `pecli reproduce` skips the migrated sections.

Passkey's summary (issue 44) is a function of its trials table: `resummarize_passkey` rewrites
a section's passkey.csv from its passkey_trials.csv as the current code summarises it (the
difference from intact bounded by Newcombe's paired interval, not a bootstrap; no interval
where the trials share their filler, --draws fixed) and records `resummarized` in the sidecar.
The trials, and every cell the summary shares with before, are unchanged (the keys stay valid).
`resummarize_ruler` does the same for ruler.csv from ruler_samples.csv, adding each
condition's paired difference from intact.
`resummarize_length` gives a length.csv written before its paired differences what the code
now writes where its buckets have fewer than 10 windows: no interval, and each condition's
difference from intact (perplexity minus intact's on the same windows) without one.
`rename_tune_windows` renames tune's `windows` column (its windowing) window_protocol.

    python -m pecli.experiments.migrate results/offline
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pandas as pd

from pecli.positions.conditions import upgraded
from pecli.runs.io import write_csv, write_json
from pecli.runs.provenance import read_sha256

NOTE = ("0.2 (issue 33): the unmodified model renamed learned -> intact (intervention, "
        "probe_trained_on) and a `condition` column added; every other cell unchanged")


def migrate_table(path: Path) -> bool:
    """Rewrite one table (and its sidecar) if it was written before 0.2; whether it changed."""
    path = Path(path)
    old = pd.read_csv(path, dtype=str, keep_default_na=False, low_memory=False)
    new = upgraded(old)
    if new.equals(old):
        return False
    _rewrite(path, new, "migrated", NOTE)
    return True


def _rewrite(path: Path, table: pd.DataFrame, record: str, note: str) -> None:
    """Write `table` over `path` and say so in its sidecar (`record`: what, from which sha256,
    by what), with the new table_sha256."""
    side = path.parent / (path.name.split(".")[0] + ".json")
    before = read_sha256(path)
    write_csv(table, path)
    if side.exists():
        meta = json.loads(side.read_text(encoding="utf-8"))
        before = meta.get(record, {}).get("table_sha256_before", before)  # the table as first written
        meta[record] = {"note": note, "table_sha256_before": before, "by": "pecli.experiments.migrate"}
        meta["table_sha256"] = read_sha256(path)
        write_json(meta, side)


PASSKEY_NOTE = ("issue 44: passkey.csv summarised again from passkey_trials.csv: the difference "
                "from intact bounded by Newcombe's paired score interval (was a bootstrap over the "
                "pairs, none where every pair differed alike); no intervals where the trials share "
                "their filler (--draws fixed); every other cell unchanged")


def resummarize_passkey(path: Path) -> bool:
    """Rewrite a preset section's passkey.csv from its trials as `pecli.measures.passkey.accuracy` now
    summarises them (the trials' `draws`, or the section's option in its done.json); whether it changed.
    Refuses, rather than rewrites, a table whose other cells the summary would change."""
    from pecli.measures.intervals import DIFF_COLUMNS
    from pecli.measures.passkey import accuracy

    path = Path(path)
    trials_csv, done = path.with_name("passkey_trials.csv"), path.with_name("done.json")
    if path.name != "passkey.csv" or not (trials_csv.exists() and done.exists()):
        return False
    trials = pd.read_csv(trials_csv, low_memory=False)
    # rows name their design; tables from before they did were fixed unless the options said so
    draws = (trials["draws"].iloc[0] if "draws" in trials else
             json.loads(done.read_text(encoding="utf-8"))["config"]["options"].get("draws", "fixed"))
    trials["note"] = trials["note"].astype("object").fillna("")
    new = pd.DataFrame(accuracy(trials.to_dict("records"), independent=draws == "independent"))
    return _resummarized(path, new, (*DIFF_COLUMNS, "ci_low", "ci_high"), PASSKEY_NOTE)


def _resummarized(path: Path, new: pd.DataFrame, changing: tuple[str, ...], note: str) -> bool:
    """Write a summary computed again over the table at `path` (DIFF_COLUMNS added where it
    lacks them) if it differs; whether it did. Only the `changing` columns may differ: any other
    cell that would change refuses the rewrite."""
    from pecli.measures.intervals import DIFF_COLUMNS

    old = pd.read_csv(path, dtype=str, keep_default_na=False, low_memory=False)
    columns = list(old.columns) + [c for c in DIFF_COLUMNS if c not in old.columns]
    text = pd.read_csv(io.StringIO(new[columns].to_csv(index=False)), dtype=str, keep_default_na=False)
    if set(columns) <= set(old.columns) and text.equals(old[columns]):
        return False
    kept = [c for c in old.columns if c not in changing]
    if not text[kept].equals(old[kept]):
        changed = [c for c in kept if not text[c].equals(old[c])]
        raise RuntimeError(f"{path}: summarising its units again changes {changed}; rerun the section")
    _rewrite(path, text, "resummarized", note)
    return True


RULER_NOTE = ("issue 44: ruler.csv summarised again from ruler_samples.csv, with each condition's "
              "difference from intact on the same samples (diff_vs_intact, diff_ci_low, diff_ci_high: "
              "Newcombe's paired score interval, or a paired bootstrap over samples where recall is "
              "fractional); every other cell unchanged")


def resummarize_ruler(path: Path) -> bool:
    """Rewrite a preset section's ruler.csv from its samples as `pecli.measures.ruler.accuracy` now
    summarises them (the section's seed and bootstrap from its done.json), adding the paired
    differences from intact; whether it changed. Refuses, rather than rewrites, a table whose
    other cells the summary would change."""
    from pecli.experiments import EXPERIMENTS, load_all
    from pecli.measures.intervals import DIFF_COLUMNS
    from pecli.measures.ruler import accuracy

    path = Path(path)
    samples_csv, done = path.with_name("ruler_samples.csv"), path.with_name("done.json")
    if path.name != "ruler.csv" or not (samples_csv.exists() and done.exists()):
        return False
    load_all()
    default = EXPERIMENTS.get("ruler").options  # what the section left out
    options = json.loads(done.read_text(encoding="utf-8"))["config"]["options"]
    samples = pd.read_csv(samples_csv, low_memory=False)
    samples["note"] = samples["note"].astype("object").fillna("")
    new = pd.DataFrame(accuracy(samples.to_dict("records"), options.get("bootstrap", default.bootstrap),
                                options.get("seed", default.seed)))
    return _resummarized(path, new, DIFF_COLUMNS, RULER_NOTE)


LENGTH_NOTE = ("issue 44: length.csv as the code now writes it from fewer than 10 windows per "
               "bucket: no interval (ci_low, ci_high emptied: a bootstrap over so few windows cannot "
               "say how the next would score), and each condition's difference from intact on the "
               "same windows (diff_vs_intact: its perplexity minus intact's; no interval); every "
               "other cell unchanged")


def resummarize_length(path: Path) -> bool:
    """Rewrite a preset section's length.csv written before its paired differences, where every
    bucket has fewer than MIN_WINDOWS windows, as the code now summarises such windows
    (pecli.measures.length_scoring.summarise): ci_low/ci_high NaN, diff_vs_intact the condition's
    perplexity minus the intact model's in the same bucket at the same length (exactly the
    paired point estimate: both are exp of an NLL sum over the same tokens), diff_ci NaN.
    Whether it changed. A table with a bucket of MIN_WINDOWS windows or more needs its
    per-window NLLs for the paired interval: refused (rerun the section)."""
    import numpy as np

    from pecli.measures.intervals import DIFF_COLUMNS, MIN_WINDOWS

    path = Path(path)
    if path.name != "length.csv" or not path.with_name("done.json").exists():
        return False
    old = pd.read_csv(path, low_memory=False)
    if set(DIFF_COLUMNS) <= set(old.columns):
        return False
    if (old["windows"] >= MIN_WINDOWS).any():
        raise RuntimeError(f"{path}: buckets of {MIN_WINDOWS} windows or more need their per-window "
                           "losses for a paired interval; rerun the section")
    where = ["model", "length", "window_start", "window_end", "all_positions"]
    intact = old[old["condition"] == "intact"].set_index(where)["perplexity"]
    reference = old.join(intact.rename("_intact"), on=where)["_intact"]
    new = old.assign(ci_low=np.nan, ci_high=np.nan, diff_ci_low=np.nan, diff_ci_high=np.nan,
                     diff_vs_intact=(old["perplexity"] - reference).where(old["condition"] != "intact"))
    return _resummarized(path, new, (*DIFF_COLUMNS, "ci_low", "ci_high"), LENGTH_NOTE)


TUNE_NOTE = ("issue 47: tune's `windows` column (how windows were cut: nonoverlapping) renamed "
             "window_protocol, as pecli length names it (`windows` counts windows in every other "
             "table); every cell unchanged")


def rename_tune_windows(path: Path) -> bool:
    """Rewrite a tune table whose `windows` column names the windowing, not a count (written
    before it was called window_protocol); whether it changed."""
    path = Path(path)
    if not path.name.startswith("tune_"):
        return False
    old = pd.read_csv(path, dtype=str, keep_default_na=False, low_memory=False)
    if "windows" not in old.columns or old["windows"].str.isdigit().all():
        return False
    _rewrite(path, old.rename(columns={"windows": "window_protocol"}), "renamed", TUNE_NOTE)
    return True


def migrate(folder: Path) -> list[Path]:
    """Every results table under `folder` migrated; the ones that changed. In a preset's
    folder (`pecli reproduce --out`), an entry with a changed table has its figures drawn
    again from the migrated tables, as `pecli reproduce` names them (the same files)."""
    folder = Path(folder)
    tables = sorted(p for pattern in ("*.csv", "*.csv.gz") for p in folder.rglob(pattern))
    changed = [p for p in tables
               if migrate_table(p) | resummarize_passkey(p) | resummarize_ruler(p) | resummarize_length(p)
               | rename_tune_windows(p)]
    for done in sorted(folder.glob("*/done.json")):
        if any(p.parent == done.parent for p in changed):
            _redraw(folder, done)
    return changed


def _redraw(out: Path, done: Path) -> list[Path]:
    from pecli.experiments import EXPERIMENTS, load_all

    load_all()
    record = json.loads(done.read_text(encoding="utf-8"))
    experiment = EXPERIMENTS.get(record["config"]["experiment"])
    tables = {name: done.parent / file for name, file in record["tables"].items()}
    drawn = experiment.figures(tables, out / "figures" / done.parent.name)
    recorded = {(out / p).resolve() for p in record["figures"]}
    if {Path(p).resolve() for p in drawn} != recorded:
        raise RuntimeError(f"{done.parent.name}: the figures drawn differ from the ones recorded")
    return drawn


if __name__ == "__main__":
    for path in migrate(Path(sys.argv[1])):
        print(f"migrated {path}")
