"""Length figures from length.csv (pandas + matplotlib only): NLL against position inside
the window, one line per condition, a panel per model, the model's training or original
context marked; under them, where conditions share windows, each one's paired difference from
intact by position."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pecli.plots.style import WIDTH, color_of, data_label, drawn, dtype_note, save
from pecli.positions.labels import label as condition_label


def short_name(model: str) -> str:
    """A checkpoint directory by its last component (`runs/x/models/rope` -> `rope`)."""
    return str(model).rstrip("/").rsplit("/", 1)[-1]


def _lines(ax, rows: pd.DataFrame, label: str, color: str) -> None:
    """One series: the longest applicable window solid with its interval, shorter ones dotted;
    lengths that do not apply are named in the legend."""
    scored = rows[rows["tokens"] > 0]
    longest = scored["length"].max() if not scored.empty else None
    for length, at in scored.groupby("length"):
        at = at[~at["all_positions"]]
        x = (at["window_start"] + at["window_end"]) / 2
        main = length == longest
        ax.plot(x, np.log(at["value"]), "-o" if main else ":", color=color, ms=3, lw=1.6 if main else 0.9,
                alpha=1 if main else 0.6, label=label if main else None)
        if at["ci_low"].notna().any():  # every window length its band, the shorter ones fainter
            ax.fill_between(x, np.log(at["ci_low"]), np.log(at["ci_high"]), color=color,
                            alpha=0.15 if main else 0.06, lw=0)
    for _, r in rows[rows["note"].fillna("").astype(bool)].drop_duplicates("length").iterrows():
        ax.plot([], [], " ", label=f"{label} @ {r['length']}: {r['note']}")


def _context(ax, part: pd.DataFrame) -> None:
    """A dashed line at each model's training (pecli-trained) or original context."""
    longest = part["length"].max()
    if "context_kind" not in part:  # tables written before the column existed
        part = part.assign(context_kind="model's")
    marks = part.drop_duplicates("model")[["context", "context_kind"]].drop_duplicates()
    for i, (_, m) in enumerate(marks.iterrows()):
        if int(m["context"]) < longest:
            ax.axvline(int(m["context"]), color="0.4", ls="--", lw=1)
            ax.annotate(f"{m['context_kind']} context {int(m['context'])}", (int(m["context"]), 0),
                        xycoords=("data", "axes fraction"), xytext=(3, 4 + 10 * i),
                        textcoords="offset points", fontsize=7, color="0.3")


WINDOWS_BAND = "band: 95 % bootstrap over windows (none from fewer than 10)"


def band_label(df: pd.DataFrame) -> str:
    """What the band is: the table's own `interval` (train lm's: over training seeds and the
    shared windows), else the bootstrap over windows that `pecli length` computes."""
    from pecli.plots.style import band_note

    said = df["interval"].dropna().astype(str) if "interval" in df else pd.Series(dtype=str)
    return band_note(df, units="windows") if (said != "").any() else WINDOWS_BAND


def _finish(ax, title: str, shorter: bool = False, legend: bool = True, band: str = WINDOWS_BAND) -> None:
    if shorter:  # what the dotted lines are, in the legend itself
        ax.plot([], [], ":", color="0.35", lw=0.9, label="dotted: a shorter window (fainter band)")
    ax.fill_between([], [], [], color="0.5", alpha=0.15, lw=0, label=band)
    ax.set_xlabel("position in the window (tokens; bucket midpoints)")
    ax.set_ylabel("log of the mean perplexity (nats)" if band != WINDOWS_BAND else "mean NLL (nats)")
    ax.set_title(title, fontsize=9)
    if legend:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    ax.grid(alpha=0.3)  # the legend below the axes: it never hides a line


def _panel(ax, part: pd.DataFrame, title: str | None = None, legend: bool = True) -> None:
    """One model, a line per condition."""
    part = part.assign(condition=[condition_label(r) for _, r in part.iterrows()])
    for condition, rows in part.groupby("condition", sort=False):
        _lines(ax, rows, condition, color_of(condition))
    _context(ax, part)
    _finish(ax, title or short_name(part["model"].iloc[0]), part["length"].nunique() > 1, legend,
            band_label(part))


def detail_limits(df: pd.DataFrame) -> tuple[float, float] | None:
    """y-limits of a detail panel where one condition's rise squeezes the others: its top lies
    more than twice the others' whole span above them (None: one panel shows every line)."""
    at = df[(df["tokens"] > 0) & ~df["all_positions"].astype(bool)]
    at = at.assign(condition=[condition_label(r) for _, r in at.iterrows()])
    tops = at.groupby("condition")["nll_mean"].max().sort_values()
    if len(tops) < 3:
        return None
    low, high = float(at["nll_mean"].min()), float(tops.iloc[-2])
    span = high - low
    if float(tops.iloc[-1]) - high <= 2 * span:
        return None
    return low - 0.1 * span, high + 0.1 * span


def _overlay(ax, df: pd.DataFrame) -> None:
    """Several models each with one condition (train short, test long): a line per model,
    coloured by its name (a pecli-trained scheme: learned, sinusoidal, none, rope, alibi)."""
    for model, rows in df.groupby("model", sort=False):
        _lines(ax, rows, short_name(model), color_of(short_name(model)))
    _context(ax, df)
    _finish(ax, f"{condition_label(df.iloc[0])}, one line per model", df["length"].nunique() > 1,
            band=band_label(df))


def paired_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The buckets with a difference from intact (the same windows under both), at each
    condition's longest scored window: what the difference panel draws (empty: no panel)."""
    if "diff_vs_intact" not in df:
        return df.iloc[:0]
    at = df[(df["tokens"] > 0) & ~df["all_positions"].astype(bool) & df["diff_vs_intact"].notna()]
    at = at.assign(condition=[condition_label(r) for _, r in at.iterrows()])
    longest = at.groupby(["model", "condition"])["length"].transform("max")
    return at[at["length"] == longest]


def _differences(ax, at: pd.DataFrame) -> None:
    """Each condition's perplexity minus intact's by position, with its paired interval where
    the table has one (10 windows or more), points alone where not; a symmetric log axis,
    said on the axis, where the differences span more than LOG_SPAN."""
    from pecli.plots.style import wants_log

    several = at["model"].nunique() > 1
    for (model, condition), rows in at.groupby(["model", "condition"], sort=False):
        x = (rows["window_start"] + rows["window_end"]) / 2
        y = rows["diff_vs_intact"].to_numpy(dtype=float)
        err = np.vstack([y - rows["diff_ci_low"].to_numpy(dtype=float), rows["diff_ci_high"].to_numpy(dtype=float) - y])
        name = f"{short_name(model)}: {condition}" if several else condition
        ax.errorbar(x, y, yerr=np.where(np.isnan(err), 0, np.clip(err, 0, None)), fmt="-o", ms=3, lw=1.2,
                    capsize=2.5, color=color_of(condition), label=name)
    ax.axhline(0, color="0.3", lw=0.8)
    magnitude = at["diff_vs_intact"].abs()
    if wants_log(magnitude):  # linear within +-linear (a power of ten), logarithmic beyond
        linear = 1.0 if (magnitude >= 1).any() else float(10.0 ** np.floor(np.log10(magnitude[magnitude > 0].min())))
        ax.set_yscale("symlog", linthresh=linear)
        ends = pd.concat([at["diff_vs_intact"], at["diff_ci_low"], at["diff_ci_high"]]).dropna()
        ax.set_ylim(min(-linear, 2 * ends.min()), max(linear, 2 * ends.max()))
        ax.set_ylabel(f"minus intact (perplexity)\nsymmetric log: linear in ±{linear:g}", fontsize=8)
    else:
        ax.set_ylabel("minus intact (perplexity)", fontsize=8)
    bars = ("bars: 95 % paired bootstrap over windows" if at["diff_ci_low"].notna().any()
            else "no interval: fewer than 10 windows")
    ax.set_title(f"Paired difference from intact, the same windows under both ({bars})", fontsize=8.5)
    ax.set_xlabel("position in the window (tokens; bucket midpoints)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, frameon=False)
    ax.grid(alpha=0.3)


def nll_by_position(df: pd.DataFrame, path: Path) -> Path:
    models = list(dict.fromkeys(df["model"]))
    one_condition = df.assign(c=[condition_label(r) for _, r in df.iterrows()])["c"].nunique() == 1
    panels = 1 if one_condition else len(models)
    detail = detail_limits(df) if panels == 1 and not one_condition else None
    cols = 2 if detail else min(panels, 2)
    rows = -(-panels // cols)
    paired = paired_rows(df) if not one_condition else df.iloc[:0]
    fig = plt.figure(figsize=(WIDTH * (1 if cols == 1 else 0.8 * cols), 4.2 * rows + 3.4 * (not paired.empty)))
    grid = fig.add_gridspec(rows + (not paired.empty), cols,
                            height_ratios=[4.2] * rows + [3.0] * (not paired.empty))
    axes = np.array([[fig.add_subplot(grid[r, c]) for c in range(cols)] for r in range(rows)])
    if not paired.empty:
        _differences(fig.add_subplot(grid[rows, :]), paired)
    if one_condition:
        _overlay(axes[0, 0], df)
    elif detail:  # the same lines, the rising one's scale beside the others' detail
        _panel(axes[0, 0], df)
        _panel(axes[0, 1], df, f"{short_name(models[0])}: detail", legend=False)
        axes[0, 1].set_ylim(*detail)
        panels = 2
    else:
        for ax, model in zip(axes.flat, models, strict=False):
            _panel(ax, df[df["model"] == model])
    for ax in axes.flat[panels:]:
        ax.axis("off")
    first = df.iloc[0]
    lengths = ", ".join(str(n) for n in sorted(df["length"].unique()))
    what = "NLL by position" if band_label(df) == WINDOWS_BAND else "log of the seeds' mean perplexity by position"
    fig.suptitle(f"{what}, {first['window_protocol']} windows of {lengths} tokens\n"
                 f"{data_label(first, 'document')}, {first['stream_tokens']:,} stream tokens{dtype_note(first)}",
                 fontsize=8.5, y=1.0)
    fig.tight_layout()
    return save(fig, path)


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    return drawn(csv_paths, fig_dir, {"length": (nll_by_position, "length.png")})
