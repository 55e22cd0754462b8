"""Gather the headline numbers of several runs into one tidy table, and draw one figure per metric.

A run is any folder pecli wrote tables into: an `ablate`, `perplexity`, `pe probe` or `toy`
output, or a `reproduce` folder (its experiments' subfolders are searched too). Only the
headline rows are kept (one number per model x condition: the final layer's mean cosine,
corpus perplexity, probe accuracy, ...), each with its interval where the table has one.

Numbers are only comparable on the same texts: within a metric, every row must share the
dataset, split, data revision (hash) and row count, or `gather` refuses with the reason
(`allow_mixed=True` gathers them anyway and says so in the `mixed` column).

    from pecli.experiments.compare import gather, figures
    table = gather(["results/offline/e1-minilm", "runs/ablate/x"])   # DataError if incomparable
    pngs = figures({"compare": csv_path}, fig_dir)                    # one PNG per metric
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pecli.experiments import CONDITION, REGISTERED, Headline, load_all
from pecli.measures.intervals import proper
from pecli.positions import labels
from pecli.runs.errors import DataError
from pecli.runs.io import read_sidecar, sidecar_of

# What must agree for two rows of one metric to be compared.
SAME_DATA = ("dataset", "split", "data_revision", "rows")


# Every metric of `pecli lm-eval`'s table is a headline, named "<task>_<metric>"
# (pecli.integrations.lm_eval: a command, not a registered experiment)
LM_EVAL_NAME = "lm-eval"
LM_EVAL = Headline("", "", {}, CONDITION,
                   interval="as lm-eval's rows record it")


def headlines() -> list[tuple[str, Headline]]:
    """(experiment, headline) of every registered experiment (`register(..., headlines=...)`),
    in the order of REGISTERED (the --help order), whatever order their modules were imported
    in: a table that names no experiment takes the first headline of its metric."""
    modules = [f"pecli.experiments.{m}" for _, names in REGISTERED for m in names]

    def rank(item) -> int:
        module = item[1].run.__module__
        return modules.index(module) if module in modules else len(modules)

    return [(name, h) for name, e in sorted(load_all().items(), key=rank) for h in e.headlines]


def _headline(experiment: str, metric: str) -> Headline | None:
    """The headline of `metric` in `experiment`'s tables (a table that names no experiment:
    the first headline of that metric)."""
    return next((h for name, h in headlines()
                 if h.metric == metric and (name == experiment or not experiment)), None)


def _reads() -> str:
    """The experiments whose runs compare reads, in words."""
    names = list(dict.fromkeys(name for name, _ in headlines())) + [LM_EVAL_NAME]
    return ", ".join(names[:-1]) + " and " + names[-1]


def distinct_runs(run_dirs) -> list[Path]:
    """The run folders given, each once (the same folder named twice, or a folder inside
    another one given, is read once)."""
    runs: list[Path] = []
    for run in map(Path, run_dirs):
        if not run.is_dir():
            raise DataError(f"{run} is not a folder; pass run folders written by pecli (--out)")
        where = run.resolve()
        if any(where == r.resolve() or where.is_relative_to(r.resolve()) for r in runs):
            continue
        runs = [r for r in runs if not r.resolve().is_relative_to(where)] + [run]
    return runs


def written_by_compare(table: Path) -> bool:
    """Whether `table` is an earlier compare's own output (its sidecar says so)."""
    try:
        return read_sidecar(table).get("config", {}).get("command") == "compare"
    except (OSError, ValueError, AttributeError):
        return False


def table_files(run_dirs) -> list[tuple[str, Path]]:
    """(run label, table path) of every results table under each run folder, in order;
    an earlier compare's compare.csv is not a result and is skipped."""
    found = []
    for run in distinct_runs(run_dirs):
        files = sorted(p for pattern in ("*.csv", "*.csv.gz") for p in run.rglob(pattern)
                       if not any(part.startswith(".") for part in p.relative_to(run).parts)
                       and not written_by_compare(p))
        if not files:
            raise DataError(f"{run} holds no results tables (*.csv); pass a folder a pecli run wrote")
        found += [(_label(run, p), p) for p in files]
    return found


def _check_whole_rows(path: Path) -> None:
    """A table without a checksum: refuse it when cut short, a row with fewer fields than the
    header or no final newline (pandas would fill the missing cells with NaN, or keep half a
    number). A cut at a row's end still passes: only a checksum knows the rows that are gone."""
    import csv
    import gzip

    def cut(why: str) -> DataError:
        return DataError(f"{path}: {why}: the table was cut short or edited; remove it or rerun "
                         "the run that wrote it")

    gzipped = path.suffix == ".gz"
    try:
        with (gzip.open if gzipped else open)(path, "rt", newline="", encoding="utf-8") as f:
            rows = csv.reader(f)
            width = len(next(rows, []))
            for number, row in enumerate(rows, start=2):
                if len(row) != width:
                    raise cut(f"row {number} has {len(row)} of the header's {width} fields")
        if not gzipped:  # a gzip stream cut short fails to decompress instead
            with open(path, "rb") as f:
                if f.seek(0, 2):  # not empty: its last byte
                    f.seek(-1, 2)
                    if f.read(1) != b"\n":
                        raise cut("its last row has no final newline")
    except (OSError, UnicodeDecodeError, EOFError, csv.Error):
        return  # not a text table at all: read_csv's own error says so below


def read_table(path: Path) -> pd.DataFrame:
    """A results table, or a one-line DataError naming the file when it cannot be trusted:
    changed since pecli wrote it (its sidecar's sha256), not CSV, or edited so that `value`
    or an interval holds non-numbers."""
    from pecli.runs.provenance import read_sha256

    try:
        written = read_sidecar(path).get("table_sha256")
    except (OSError, ValueError):
        written = None  # no sidecar, or one from before pecli recorded checksums
    if written and read_sha256(path) != written:
        raise DataError(f"{path} was changed after pecli wrote it (its sha256 differs from "
                        f"{sidecar_of(path).name}): it was damaged or edited; rerun the run that wrote it")
    if not written:
        _check_whole_rows(path)
    try:
        df = pd.read_csv(path, low_memory=False)
    except (ValueError, OSError, UnicodeDecodeError, EOFError) as err:  # pandas' ParserError is a ValueError
        raise DataError(f"{path} is not a readable table ({str(err).splitlines()[0][:120]}); "
                        "it was damaged or edited: remove it or rerun the run that wrote it") from None
    for col in ("value", "ci_low", "ci_high"):
        if col in df:
            numbers = pd.to_numeric(df[col], errors="coerce")
            bad = numbers.isna() & df[col].notna()
            if bad.any():
                raise DataError(f"{path}: column {col} holds {df[col][bad].iloc[0]!r}, not a number "
                                f"(row {int(bad.idxmax()) + 2}); the table was edited or damaged: "
                                "remove it or rerun the run that wrote it")
            df[col] = numbers
    return labels.upgraded(df)  # written before 0.2: the intact model's old name, no condition column


def _label(run: Path, table: Path) -> str:
    """The run a table belongs to: its folder, named from the run folder given."""
    sub = table.parent.relative_to(run)
    return run.name if sub == Path(".") else f"{run.name}/{sub.as_posix()}"


def headline_rows(df: pd.DataFrame, recorded_interval: str = "") -> pd.DataFrame:
    """The headline rows of one table (its experiment's `headlines`), with `metric` the compared name,
    `condition` naming each, `slot` (a length, bucket or depth; '' for one number per
    condition) and `interval`: the method of its 95 % interval, as the rows record it (an
    `interval_method` or `interval` column), else as `recorded_interval` (the sidecar) says,
    else the experiment's own."""
    if not {"metric", "value"} <= set(df.columns):
        return df.iloc[0:0]
    experiment = str(df["experiment"].iloc[0]) if "experiment" in df and len(df) else ""
    lm_eval = experiment == LM_EVAL_NAME and "task" in df.columns
    if lm_eval:  # pecli lm-eval: every metric of every task is a headline, <task>_<metric>
        df = df.assign(quantity=df["task"] + ": " + df["metric"].astype(str) + " (scored by lm-eval)",
                       metric=df["task"] + "_" + df["metric"].astype(str))
    kept = []
    for metric, rows in df.groupby("metric", sort=False):
        h = (Headline(metric, rows["quantity"].iloc[0], {}, LM_EVAL.condition, interval=LM_EVAL.interval)
             if lm_eval else _headline(experiment, str(metric)))
        if h is None or not set(h.where) <= set(rows.columns):
            continue
        for col, want in h.where.items():
            rows = rows[rows[col].map(lambda v: str(v).lower()) == str(want).lower()]
        rows = rows[rows["value"].notna()]  # a length the model cannot take: NaN, no number
        if rows.empty:
            continue
        if {"ci_low", "ci_high"} <= set(rows.columns):  # a table written before the rule: no [x, x]
            bounds = [proper(lo, hi) for lo, hi in zip(rows["ci_low"], rows["ci_high"], strict=True)]
            rows = rows.assign(ci_low=[b[0] for b in bounds], ci_high=[b[1] for b in bounds])
        rows = rows.assign(metric=h.label, quantity=h.quantity, axis=h.axis or h.quantity,
                           condition=[_condition(r, h) for _, r in rows.iterrows()],
                           slot=[h.slot(r) if h.slot else "" for _, r in rows.iterrows()],
                           interval=_interval_of(rows, recorded_interval or h.interval))
        key = [c for c in ("model", "metric", "condition", "slot") if c in rows]
        kept.append(rows.drop_duplicates(key))
    return pd.concat(kept, ignore_index=True) if kept else df.iloc[0:0]


def _interval_of(rows: pd.DataFrame, fallback: str) -> list[str]:
    """Each row's interval method: its own column where it has one, else `fallback`;
    '' where the row has no interval."""
    own = next((rows[c] for c in ("interval_method", "interval") if c in rows), None)
    has = rows["ci_low"].notna() if "ci_low" in rows else pd.Series(False, index=rows.index)
    return [("" if not h else str(o) if isinstance(o, str) and o else fallback)
            for h, o in zip(has, own if own is not None else [None] * len(rows), strict=True)]


def _condition(row, h: Headline) -> str:
    """A model's condition: `pecli.positions.conditions.label` (the tables' `condition`
    column: `intact`, `zero`, `zero + linear/legacy (study)`, `yarn:2`) where the headline's
    condition columns are a model's condition; else those columns in words (`alibi`, a
    trained scheme)."""
    named = labels.columns()
    values = [str(row[c]) for c in h.condition
              if c not in named and c in row.index and pd.notna(row[c])]
    if set(named) & set(h.condition):
        values.append(labels.label(row))
    return " ".join(values) or "intact"


def _sidecar_interval(path: Path) -> str:
    """How a table's intervals were computed, where its sidecar says (`pecli <command>` runs)."""
    try:
        config = read_sidecar(path).get("config", {})
    except (OSError, ValueError):
        return ""
    found = config.get("intervals") or config.get("interval_method") or ""
    return found.split(";")[0] if isinstance(found, str) else ""


def gather(run_dirs, allow_mixed: bool = False, against=None) -> pd.DataFrame:
    """The headline rows of every table of every run, in one tidy frame.

    Columns: `run` (the folder), `table` (its file name), `metric`, `condition`, `slot`,
    `value`, `ci_low`/`ci_high` and `interval` (the method), `mixed` (whether the metric's
    rows came from different data), with `against` (one of `run_dirs`) AGAINST_COLUMNS (each
    row's difference from its reference row, `differences`), and each table's own columns.
    `.attrs["skipped"]`: the folders inside a run folder (a reproduce folder) that hold no
    headline numbers.

    Raises:
        DataError: a run folder given that holds no headline numbers (never silently
            dropped), `against` not one of the run folders, or (unless allow_mixed) rows of
            one metric measured on different data (dataset, split, data revision or row count).
    """
    reference = _reference_label(run_dirs, against) if against is not None else None
    frames, skipped = [], []
    by_run: dict[str, list[Path]] = {}
    located: dict[tuple[str, str], Path] = {}  # (run, table) -> its file
    for run, path in table_files(run_dirs):
        located[run, path.name.split(".")[0]] = path
        if path.name.split(".")[0].endswith("_by_seed"):
            continue  # one number per training seed: its table without the suffix is the headline
        by_run.setdefault(run, []).append(path)
    for run, paths in by_run.items():
        found = [headline_rows(read_table(p), _sidecar_interval(p)).assign(run=run, table=p.name.split(".")[0])
                 for p in paths]
        found = [f for f in found if not f.empty]
        if found:
            frames += found
        else:
            skipped.append(f"{run} ({', '.join(p.name for p in paths)})")
    for root in distinct_runs(run_dirs):
        if not any(f["run"].iloc[0] == root.name or f["run"].iloc[0].startswith(root.name + "/")
                   for f in frames):
            tables = sorted({p.name for r, ps in by_run.items() if r == root.name or
                             r.startswith(root.name + "/") for p in ps})
            raise DataError(f"{root}: no headline numbers compare can use in {', '.join(tables)} "
                            f"(compare reads {_reads()} runs)")
    out = pd.concat(frames, ignore_index=True).copy()  # copied: one block per dtype, not per table
    out["mixed"] = False
    for metric, rows in out.groupby("metric", sort=False):
        reason = _incomparable(rows)
        if reason and not allow_mixed:
            raise DataError(f"{metric} rows are not comparable: {reason}; compare runs on the "
                            "same texts, or pass --allow-mixed to gather them anyway")
        out.loc[rows.index, "mixed"] = bool(reason)
    first = ["run", "table", "model", "metric", "condition", "slot", "value", "ci_low", "ci_high",
             "interval", "mixed"]
    for col in ("ci_low", "ci_high"):
        if col not in out:
            out[col] = float("nan")
    if reference is not None:
        out = differences(out, reference, located)
        first += list(AGAINST_COLUMNS)
    out = out[first + [c for c in out.columns if c not in first]]
    out.attrs["skipped"] = skipped
    return out


def _incomparable(rows: pd.DataFrame) -> str:
    """Why rows of one metric cannot be compared ('' when they can). Rows of different slots
    (a passkey depth and all depths, two held-out sets of one mask fit) are not compared with
    each other: each slot's rows are, across runs and conditions."""
    cols = [c for c in SAME_DATA if c in rows]
    if not cols:
        return ""
    if "slot" in rows and rows["slot"].nunique() > 1:
        return next((why for _, part in rows.groupby("slot", sort=False)
                     if (why := _incomparable(part))), "")
    key = pd.Series([" ".join(map(str, t)) for t in rows[cols].itertuples(index=False)],
                    index=rows.index)
    if key.nunique() <= 1:
        return ""
    a, b = rows.loc[key.drop_duplicates().index[:2]].to_dict("records")
    diff = next(c for c in cols if str(a[c]) != str(b[c]))
    at = f" at {a['slot']}" if str(a.get("slot", "")) not in ("", "nan") else ""
    return (f"{a['run']} has {diff} {_short(a[diff])}, {b['run']} has {_short(b[diff])}{at}")


def _short(value) -> str:
    text = str(value)
    return text[:19] + "..." if len(text) > 22 else text


# --- differences from a reference run (--against) ---------------------------------------------

AGAINST_COLUMNS = ("against", "diff_vs_against", "diff_against_ci_low", "diff_against_ci_high",
                   "diff_against_interval")
DIFFERENCE_BOOTSTRAP = 1000  # resamples of units whose values are partial (a mean recall)


def _reference_label(run_dirs, against) -> str:
    """The run label of the reference folder, which must be one of the folders given."""
    where = Path(against).resolve()
    for run in distinct_runs(run_dirs):
        if where == run.resolve():
            return run.name
        if where.is_relative_to(run.resolve()):
            return _label(run, run / where.relative_to(run.resolve()) / "table")
    raise DataError(f"--against {against} is not one of the run folders given; name it among "
                    "them too (pecli compare A B --against A)")


def differences(table: pd.DataFrame, reference: str, paths: dict[tuple[str, str], Path]) -> pd.DataFrame:
    """`table` with AGAINST_COLUMNS: each row's difference from its reference row in the run
    `reference` (the same metric and slot; the same model and condition where that run has
    them, else its intact row; '' and a reason where none or several fit), with a 95 % interval
    from the headline's units (`_interval`): paired where the two rows read one draw,
    independent where they share none."""
    nan = float("nan")
    mine = (table["run"] == reference) | table["run"].str.startswith(reference + "/")
    refs, read = table[mine], {}
    units = {h.label: h.units for _, h in headlines() if h.units}  # each metric's, looked up once
    found = []
    for i, row in table.iterrows():
        if mine[i]:
            found.append(("(reference)", nan, nan, nan, ""))
            continue
        ref, why = _reference_row(row, refs)
        if ref is None:
            found.append(("", nan, nan, nan, why))
            continue
        found.append((f"{ref['run']}: {ref['model']}, {ref['condition']}", row["value"] - ref["value"],
                      *_interval(row, ref, units.get(row["metric"]), paths, read)))
    return pd.concat([table, pd.DataFrame(found, columns=list(AGAINST_COLUMNS), index=table.index)], axis=1)


def _reference_row(row: pd.Series, refs: pd.DataFrame) -> tuple[pd.Series | None, str]:
    """(the reference run's row for `row`, '') or (None, why none)."""
    fits = refs[(refs["metric"] == row["metric"]) & (refs["slot"] == row["slot"])]
    for col, fallback in (("model", None), ("condition", labels.INTACT)):
        same = fits[fits[col] == row[col]]
        if same.empty and fallback is not None:
            same = fits[fits[col] == fallback]
        fits = same if len(same) else fits
    if len(fits) == 1:
        return fits.iloc[0], ""
    if fits.empty:
        return None, "no reference: the reference run has no row of this metric at this slot"
    names = "; ".join(f"{r.model}, {r.condition}" for r in fits.itertuples())
    return None, f"no reference: {len(fits)} rows of the reference run fit ({names})"


def _interval(row: pd.Series, ref: pd.Series, spec, paths, cache: dict) -> tuple[float, float, str]:
    """(low, high, method) of row - ref from their units (`spec`, the headline's `Units`; None
    where its metric keeps none): paired by unit where every unit of both reads the same draw
    (one seed's keys read by two models or two conditions), `independent_mean_difference` where
    no draw is shared (Newcombe's interval for independent proportions, a bootstrap of each
    side's units for partial recalls); NaN bounds and the reason otherwise."""
    from pecli.measures.intervals import (
        difference_method,
        independent_mean_difference,
        paired_mean_difference,
    )

    nan = float("nan")
    if spec is None:
        return nan, nan, "no interval: this metric has no table of right-or-wrong units"
    x, r = (_units_of(s, spec, paths, cache) for s in (row, ref))
    for side, name in ((x, row), (r, ref)):
        if isinstance(side, str):
            return nan, nan, f"no interval: {name['run']} {side}"
    joined = x.join(r, how="outer", lsuffix="_x", rsuffix="_r")
    same = [all(_same(u[f"{d}_x"], u[f"{d}_r"]) for d in spec.draw) for _, u in joined.iterrows()]
    if all(same):  # one draw read twice: units paired
        low, high = paired_mean_difference(joined["value_x"], joined["value_r"],
                                           n_boot=DIFFERENCE_BOOTSTRAP, seed=0)[1:]
        method = difference_method(joined["value_x"], joined["value_r"], paired=True)
        return low, high, f"{method}, {len(joined)} units paired by draw"
    if any(same):
        return nan, nan, (f"no interval: the two runs share {sum(same)} of {len(same)} draws (a seed "
                          "in common, or one run's draws a part of the other's); compare runs over "
                          "the same draws, or draws apart")
    low, high = independent_mean_difference(x["value"], r["value"], n_boot=DIFFERENCE_BOOTSTRAP, seed=0)[1:]
    method = difference_method(x["value"], r["value"], paired=False)
    return low, high, f"{method}, {len(x)} and {len(r)} units drawn apart"


def _units_of(row: pd.Series, spec, paths, cache: dict) -> pd.DataFrame | str:
    """A headline row's scored units (value and draw columns, indexed by `spec.pair`), or why
    there are none: its units' table missing, or not matching its value."""
    table = paths[row["run"], row["table"]]
    name = row["table"] + spec.suffix
    found = next((p for p in (table.parent / f"{name}.csv", table.parent / f"{name}.csv.gz")
                  if p.exists()), None)
    if found is None:
        return f"has no {name}.csv beside {table.name}"
    if found not in cache:
        cache[found] = labels.labelled(read_table(found))
    units = cache[found]
    keep = (units["model"].astype(str) == str(row["model"])) & (units["condition"] == row["condition"])
    for col in spec.cell:
        if str(row.get(col)) != "all":
            keep &= units[col].map(lambda v, want=row.get(col): _same(v, want))
    if "note" in units:
        keep &= units["note"].fillna("").eq("")
    units = units[keep]
    if spec.per_unit is not None:
        units = spec.per_unit(units, row["metric"])
    if units.empty or abs(units["value"].astype(float).mean() - float(row["value"])) > 1e-9:
        return (f"{name}.csv holds no units for {row['model']}, {row['condition']}, {row['slot']}"
                if units.empty else f"{name}.csv does not give its row's value (a stale table?)")
    return units.set_index(list(spec.pair), drop=False)[["value", *spec.draw]].astype({"value": float})


def _same(a, b) -> bool:
    """Two cells of one column read from two tables (1024 and 1024.0 alike; a missing one
    equals nothing)."""
    if pd.isna(a) or pd.isna(b):
        return False
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


# --- figures: one per metric, models x conditions, interval bars -----------------------------


def figures(csv_paths: dict, fig_dir) -> list[Path]:
    """One figure per metric of the gathered table (`compare` in csv_paths): models (or, for a
    metric by length, bucket or depth, its slots) across, one colour per condition, interval
    bars named by their method, the scale's meaningful values as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from pecli.plots.style import color_of, points, save

    df = pd.read_csv(csv_paths["compare"], low_memory=False, keep_default_na=False,
                     na_values=[""])
    df["slot"] = df["slot"].fillna("").astype(str) if "slot" in df else ""
    out = []
    for metric, rows in df.groupby("metric", sort=False):
        slotted = rows["slot"].ne("").any()
        rows, xs, common = _placed(rows, slotted)
        series = list(dict.fromkeys(rows["series"]))
        wide = min(14.0, max(5.0, (0.9 if slotted else 1.3) * len(xs) + 2.5))
        against = "diff_vs_against" in rows and rows["diff_vs_against"].notna().any()
        if against:  # a panel under the values: each row minus its reference row
            fig, (ax, below) = plt.subplots(2, 1, figsize=(wide, 6.6), sharex=True,
                                            gridspec_kw={"height_ratios": [3, 2]})
        else:
            fig, ax = plt.subplots(figsize=(wide, 4.2))
        width = 0.7 / max(len(series), 1)
        # colour: the first part the condition changes (its intervention, else its mask or rope
        # scaling), read from the rows' columns; marker: the rest of it or, by slot, the model
        variants = list(dict.fromkeys(rows["variant"]))
        for i, name in enumerate(series):
            sel = rows[rows["series"] == name]
            x = np.array([xs.index(w) for w in sel["where"]]) + (i - (len(series) - 1) / 2) * width
            points(ax, x, sel, color_of(sel["colour_key"].iloc[0]), name,
                   marker=MARKERS[variants.index(sel["variant"].iloc[0]) % len(MARKERS)])
        if metric == "cosine_mean":
            _baselines(ax, df, rows, xs)
        _references(ax, metric, rows)
        _labelled(ax, metric, rows, xs, common)
        if against:
            _differences(below, ax, rows, xs, series, width, variants)
        out.append(save(fig, Path(fig_dir) / f"compare_{metric}.png"))
    return out


def _differences(ax, above, rows: pd.DataFrame, xs: list[str], series: list[str], width: float,
                 variants: list[str]) -> None:
    """The panel of `--against`: each row's difference from its reference row at the places,
    colours and markers of the values above, with its interval (the methods named in the
    panel), a line at 0; the reference's own rows have none."""
    import numpy as np

    from pecli.plots.style import color_of, points

    for i, name in enumerate(series):
        sel = rows[(rows["series"] == name) & rows["diff_vs_against"].notna()]
        if sel.empty:
            continue
        x = np.array([xs.index(w) for w in sel["where"]]) + (i - (len(series) - 1) / 2) * width
        shown = sel.assign(value=sel["diff_vs_against"], ci_low=sel["diff_against_ci_low"],
                           ci_high=sel["diff_against_ci_high"])
        points(ax, x, shown, color_of(sel["colour_key"].iloc[0]), None,
               marker=MARKERS[variants.index(sel["variant"].iloc[0]) % len(MARKERS)])
    ax.axhline(0.0, color="0.5", lw=0.8, ls="--", zorder=0)
    reference = rows.loc[rows["against"] == "(reference)", "run"]
    ax.set_ylabel(_wrapped(f"minus {reference.iloc[0] if len(reference) else 'the reference'}'s row", 30),
                  fontsize=8)
    methods = list(dict.fromkeys(
        m.rsplit(", ", 1)[0].replace("95 % ", "").replace(" score interval for a difference of", ",")
        for m in rows["diff_against_interval"].dropna() if m and not m.startswith("no ")))
    missing = rows["diff_vs_against"].notna() & rows["diff_against_ci_low"].isna()
    said = "bars: " + "; ".join(methods) if methods else "no bars"
    if missing.any():
        said += f"; {int(missing.sum())} without an interval (compare.csv says why)"
    ax.set_title(_wrapped(said, 110), fontsize=7, loc="left")
    ax.grid(axis="y", alpha=0.3)
    _ticks(ax, xs)
    ax.set_xlabel(above.get_xlabel(), fontsize=8)
    above.set_xlabel("")
    above.tick_params(labelbottom=False)


def _placed(rows: pd.DataFrame, slotted: bool) -> tuple[pd.DataFrame, list[str], str]:
    """(rows with their x place `where` and `series`, the x places in order, the head every
    slot shares, or ""): x is the models, or the slots with a series per (model, condition)
    when several models."""
    models = _x_labels(rows)
    parts = [list(labels.changed(r).values()) for _, r in rows.iterrows()]
    by_model = slotted and len(set(models)) > 1
    rows = rows.assign(  # a condition in words (a trained scheme): coloured by its first word
        colour_key=[p[0] if p else str(c).split()[0] for p, c in zip(parts, rows["condition"], strict=True)],
        variant=[m.replace(chr(10), " ") if by_model else " + ".join(p[1:])
                 for m, p in zip(models, parts, strict=True)])
    if slotted:
        rows = rows.assign(where=rows["slot"], series=[
            f"{m.replace(chr(10), ' ')}: {c}" if by_model else c
            for m, c in zip(models, rows["condition"], strict=True)])
    else:
        rows = rows.assign(where=models, series=rows["condition"])
    xs = list(dict.fromkeys(rows["where"]))
    common = _common_head(xs) if slotted else ""
    if common:  # one length throughout: it goes to the axis label, the ticks keep the rest
        rows = rows.assign(where=[w[len(common) + 2:] for w in rows["where"]])
        xs = [w[len(common) + 2:] for w in xs]
    return rows, xs, common


def _labelled(ax, metric: str, rows: pd.DataFrame, xs: list[str], common: str) -> None:
    """A compare figure's ticks, axis labels, scale, title (the quantity; models x conditions
    and the data) and legend (titled by the interval method)."""
    from pecli.plots.style import wants_log

    _ticks(ax, xs)
    quantity = str(rows["quantity"].iloc[0]) if "quantity" in rows else metric
    ax.set_ylabel(_wrapped(str(rows["axis"].iloc[0]) if "axis" in rows else quantity, 45), fontsize=8)
    if common:
        ax.set_xlabel(f"prompts or windows of {common}" if common.endswith("tokens") else common, fontsize=8)
    if wants_log(rows["value"]) and (rows["value"] > 0).all():  # a zero has no place on a log axis
        ax.set_yscale("log")
    data = ", ".join(sorted({f"{r.dataset}/{r.split}, {int(r.rows):,} rows" for r in
                             rows.itertuples() if pd.notna(getattr(r, "rows", None))}))
    mixed = " (MIXED DATA: --allow-mixed)" if rows["mixed"].any() else ""
    ax.set_title(f"{_wrapped(quantity, 80)}\n{rows['model'].nunique()} model(s) x "
                 f"{rows['condition'].nunique()} condition(s); {data}{mixed}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, title=_bars(rows), title_fontsize=7,
              loc="center left", bbox_to_anchor=(1.01, 0.5))


MARKERS = "os^vDP*XphH<>d"


def _ticks(ax, xs: list[str]) -> None:
    """The places across, slanted where they crowd."""
    crowded = len(xs) > 3 or (len(xs) > 1 and max(map(len, xs)) > 14)
    ax.set_xticks(range(len(xs)), xs, rotation=25 if crowded else 0,
                  ha="right" if crowded else "center", fontsize=8)
    ax.set_xlim(-0.6, len(xs) - 0.4)


def _common_head(slots: list[str]) -> str:
    """`16,384 tokens` when every slot starts `16,384 tokens, ...`; else ''."""
    heads = {s.split(", ", 1)[0] for s in slots if ", " in s}
    return heads.pop() if len(heads) == 1 and all(", " in s for s in slots) else ""


def _wrapped(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or text


def _bars(rows: pd.DataFrame) -> str | None:
    """The legend's title: what the bars are, as the rows record it (each method once)."""
    if "interval" not in rows:
        return None
    methods = list(dict.fromkeys(str(m).split(" (")[0] for m in rows["interval"].dropna() if str(m)))
    return _wrapped("bars: " + "; ".join(methods), 48) if methods else None


def _references(ax, metric: str, rows: pd.DataFrame) -> None:
    """Lines at a scale's meaningful values: its own (between_baselines' 0 and 1) and chance
    where the rows record it (mc's `chance`)."""
    lines = [h.reference for _, h in headlines() if h.label == metric and h.reference]
    refs = list(lines[0]) if lines else []
    if "chance" in rows:
        chance = pd.to_numeric(rows["chance"], errors="coerce").dropna().unique()
        refs += [(float(c), "chance" if len(chance) == 1 else f"chance ({c:.3g})") for c in chance[:3]]
    for value, label in refs:
        ax.axhline(value, color="0.5", lw=0.8, ls="-." if "chance" in label else "--", label=label, zorder=0)


def _baselines(ax, df: pd.DataFrame, rows: pd.DataFrame, xs: list[str]) -> None:
    """The in-model baselines of each model's run as lines across its slot, when gathered."""
    styles = {"token_pair_cosine_mean": ("--", "in-model baseline: two different tokens"),
              "self_similarity_mean": (":", "in-model baseline: one token in two texts")}
    labelled = set()
    for x, (model, run) in enumerate(dict.fromkeys(zip(rows["model"], rows["run"], strict=True))):
        for metric, (style, label) in styles.items():
            hit = df[(df["metric"] == metric) & (df["model"] == model) & (df["run"] == run)]
            if hit.empty:
                continue
            ax.hlines(hit["value"].iloc[0], x - 0.45, x + 0.45, colors="0.45", linestyles=style,
                      label=None if metric in labelled else label)
            labelled.add(metric)


def _x_labels(rows: pd.DataFrame) -> list[str]:
    """The model, with its run where one model appears in several runs."""
    runs_per_model = rows.groupby("model")["run"].nunique()
    return [m if runs_per_model[m] == 1 else f"{m}\n({r.rsplit('/', 1)[-1]})"
            for m, r in zip(rows["model"], rows["run"], strict=True)]
