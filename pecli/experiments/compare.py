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

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from pecli.runs.errors import DataError

# What must agree for two rows of one metric to be compared.
SAME_DATA = ("dataset", "split", "data_revision", "rows")


@dataclass(frozen=True)
class Headline:
    """One headline metric: the rows that give one number per model x condition."""

    metric: str
    quantity: str  # axis label
    where: dict = field(default_factory=dict)  # column -> required value (the column must exist)
    condition: tuple[str, ...] = ("intervention",)  # columns that name the condition


HEADLINES = (
    Headline("cosine_mean", "mean cosine of each token with vs without the intervention "
             "(final layer)", {"final_layer": True, "special_tokens": "included"}),
    Headline("token_pair_cosine_mean", "cosine of two different tokens (final layer, own positions)",
             {"final_layer": True}),
    Headline("self_similarity_mean", "cosine of one token in two texts (final layer, own positions)",
             {"final_layer": True}),
    Headline("between_baselines", "mean cosine on the in-model scale (0 = other token, 1 = same token)",
             {"final_layer": True, "special_tokens": "included"}),
    Headline("probe_accuracy", "sentiment probe accuracy (held-out texts)"),
    Headline("perplexity", "corpus perplexity", {"aggregation": "corpus"},
             ("intervention", "mask", "mask_semantics", "protocol")),
    Headline("exact_match", "toy arithmetic exact match", {"operation": "all"}, ("pe",)),
    Headline("order_accuracy", "which-comes-first accuracy of position rows", {}, ("matrix",)),
)
BY_METRIC = {h.metric: h for h in HEADLINES}
# Every metric of `pecli lm-eval`'s table is a headline, named "<task>_<metric>"
LM_EVAL = Headline("", "", {}, ("intervention", "mask", "mask_semantics", "rope_scaling"))


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
    side = table.parent / (table.name.split(".")[0] + ".json")
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
        return meta.get("config", {}).get("command") == "compare"
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


def read_table(path: Path) -> pd.DataFrame:
    """A results table, or a one-line DataError naming the file when it cannot be trusted:
    changed since pecli wrote it (its sidecar's sha256), not CSV, or edited so that `value`
    or an interval holds non-numbers."""
    from pecli.runs.provenance import file_sha256

    side = path.parent / (path.name.split(".")[0] + ".json")
    try:
        written = json.loads(side.read_text(encoding="utf-8")).get("table_sha256")
    except (OSError, ValueError, AttributeError):
        written = None  # no sidecar, or one from before pecli recorded checksums
    if written and file_sha256.__wrapped__(path) != written:
        raise DataError(f"{path} was changed after pecli wrote it (its sha256 differs from "
                        f"{side.name}): it was damaged or edited; rerun the run that wrote it")
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
    return df


def _label(run: Path, table: Path) -> str:
    """The run a table belongs to: its folder, named from the run folder given."""
    sub = table.parent.relative_to(run)
    return run.name if sub == Path(".") else f"{run.name}/{sub.as_posix()}"


def headline_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The headline rows of one table (see HEADLINES), with `condition` naming each."""
    if not {"metric", "value"} <= set(df.columns):
        return df.iloc[0:0]
    if "task" in df.columns and df["experiment"].eq("lm-eval").all():  # pecli lm-eval: a
        df = df.assign(metric=df["task"] + "_" + df["metric"])  # metric per task, all headlines
    kept = []
    for metric, rows in df.groupby("metric", sort=False):
        h = BY_METRIC.get(metric) or (LM_EVAL if "task" in rows and
                                      rows["experiment"].eq("lm-eval").all() else None)
        if h is not None and h is LM_EVAL:
            h = Headline(metric, f"{metric} (lm-eval)", {}, LM_EVAL.condition)
        if h is None or not set(h.where) | set(h.condition) <= set(rows.columns):
            continue
        for col, want in h.where.items():
            rows = rows[rows[col].map(lambda v: str(v).lower()) == str(want).lower()]
        if rows.empty:
            continue
        rows = rows.assign(condition=[_condition(r, h) for _, r in rows.iterrows()])
        kept.append(rows.drop_duplicates(["model", "condition"] if "model" in rows else ["condition"]))
    return pd.concat(kept, ignore_index=True) if kept else df.iloc[0:0]


def _condition(row, h: Headline) -> str:
    # the default mask is one computation under every semantics and protocol: name it once
    if h.metric == "perplexity" and row["mask"] == "default":
        return str(row["intervention"])
    parts = [str(row[c]) for c in h.condition]
    if h.metric == "perplexity":
        return f"{parts[0]} + {parts[1]}/{parts[2]} ({parts[3]})"
    return " ".join(parts)


def gather(run_dirs, allow_mixed: bool = False) -> pd.DataFrame:
    """The headline rows of every table of every run, in one tidy frame.

    Columns: `run` (the folder), `table` (its file name), `condition`, `mixed` (whether
    the metric's rows came from different data) and each table's own columns (intervals
    `ci_low`/`ci_high` where the table has them).

    Raises:
        DataError: no headline rows, or (unless allow_mixed) rows of one metric measured
            on different data (dataset, split, data revision or row count).
    """
    frames = []
    for run, path in table_files(run_dirs):
        rows = headline_rows(read_table(path))
        if not rows.empty:
            frames.append(rows.assign(run=run, table=path.name.split(".")[0]))
    if not frames:
        raise DataError("no headline numbers in " + ", ".join(map(str, distinct_runs(run_dirs)))
                        + f" (looked for metrics {', '.join(BY_METRIC)})")
    out = pd.concat(frames, ignore_index=True)
    out["mixed"] = False
    for metric, rows in out.groupby("metric", sort=False):
        reason = _incomparable(rows)
        if reason and not allow_mixed:
            raise DataError(f"{metric} rows are not comparable: {reason}; compare runs on the "
                            "same texts, or pass --allow-mixed to gather them anyway")
        out.loc[rows.index, "mixed"] = bool(reason)
    first = ["run", "table", "model", "metric", "condition", "value", "ci_low", "ci_high", "mixed"]
    for col in ("ci_low", "ci_high"):
        if col not in out:
            out[col] = float("nan")
    return out[first + [c for c in out.columns if c not in first]]


def _incomparable(rows: pd.DataFrame) -> str:
    """Why rows of one metric cannot be compared ('' when they can)."""
    cols = [c for c in SAME_DATA if c in rows]
    if not cols:
        return ""
    key = pd.Series([" ".join(map(str, t)) for t in rows[cols].itertuples(index=False)],
                    index=rows.index)
    if key.nunique() <= 1:
        return ""
    a, b = rows.loc[key.drop_duplicates().index[:2]].to_dict("records")
    diff = next(c for c in cols if str(a[c]) != str(b[c]))
    return (f"{a['run']} has {diff} {_short(a[diff])}, {b['run']} has {_short(b[diff])}")


def _short(value) -> str:
    text = str(value)
    return text[:19] + "..." if len(text) > 22 else text


# --- figures: one per metric, models x conditions, interval bars -----------------------------


def figures(csv_paths: dict, fig_dir) -> list[Path]:
    """One PNG per metric of the gathered table (`compare` in csv_paths)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from pecli.plots.style import color_of, interval_note, points, save, wants_log

    df = pd.read_csv(csv_paths["compare"], low_memory=False)
    out = []
    for metric, rows in df.groupby("metric", sort=False):
        rows = rows.assign(where=_x_labels(rows))
        xs = list(dict.fromkeys(rows["where"]))
        conditions = list(dict.fromkeys(rows["condition"]))
        fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(xs) + 2.5), 4.2))
        width = 0.7 / max(len(conditions), 1)
        # colour: the intervention; marker: the rest of the condition (the mask variant)
        variants = list(dict.fromkeys(_variant(c) for c in conditions))
        for i, cond in enumerate(conditions):
            sel = rows[rows["condition"] == cond]
            x = np.array([xs.index(w) for w in sel["where"]]) + (i - (len(conditions) - 1) / 2) * width
            points(ax, x, sel, color_of(cond.split(" + ")[0].split()[0]), cond,
                   marker=MARKERS[variants.index(_variant(cond)) % len(MARKERS)])
        if metric == "cosine_mean":
            _baselines(ax, df, rows, xs)
        crowded = len(xs) > 3 or (len(xs) > 1 and max(map(len, xs)) > 14)
        ax.set_xticks(range(len(xs)), xs, rotation=20 if crowded else 0,
                      ha="right" if crowded else "center", fontsize=8)
        ax.set_xlim(-0.6, len(xs) - 0.4)
        ax.set_ylabel(metric)
        if wants_log(rows["value"]):
            ax.set_yscale("log")
        data = ", ".join(sorted({f"{r.dataset}/{r.split}, {int(r.rows):,} rows" for r in
                                 rows.itertuples() if pd.notna(getattr(r, "rows", None))}))
        mixed = " (MIXED DATA: --allow-mixed)" if rows["mixed"].any() else ""
        ax.set_title(f"{BY_METRIC[metric].quantity if metric in BY_METRIC else metric}\n"
                     f"{len(xs)} model(s) x {len(conditions)} condition(s); {data}{mixed}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, title=interval_note(rows) or None, title_fontsize=7,
                  loc="center left", bbox_to_anchor=(1.01, 0.5))
        out.append(save(fig, Path(fig_dir) / f"compare_{metric}.png"))
    return out


MARKERS = "os^vDP*XphH<>d"


def _variant(condition: str) -> str:
    """`zero + linear/legacy (study)` -> `linear/legacy (study)`; `zero` -> ''."""
    return condition.split(" + ", 1)[1] if " + " in condition else ""


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
