"""TruthfulQA multiple-choice figure from the written mc.csv (pandas + matplotlib only)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pecli.plots.style import color_of, drawn, points, save
from pecli.positions.labels import label as condition_label

PANELS = (("mc1", "MC1 accuracy"), ("mc2", "MC2 (true probability mass)"),
          ("mc1_norm", "MC1, length-normalised"))


def accuracy_bars(df: pd.DataFrame, path: Path) -> Path:
    """One panel per metric: a bar per condition with its interval, chance level dashed; under
    each, every condition's paired difference from intact on the same items, where the table
    has them."""
    df = df.copy()
    df["condition"] = df.apply(condition_label, axis=1)
    df = df.drop_duplicates(["condition", "metric"])  # the default mask: one model under any semantics
    conditions = list(dict.fromkeys(df["condition"]))
    paired = "diff_vs_intact" in df and df["diff_vs_intact"].notna().any()
    fig, grid = plt.subplots(1 + paired, len(PANELS), figsize=(max(9.0, 1.1 * len(conditions) * 3),
                                                                4.4 + 1.9 * paired),
                             sharex=True, sharey="row", squeeze=False, layout="constrained",
                             gridspec_kw={"height_ratios": [3, 1.3] if paired else [1]})
    x = np.arange(len(conditions))
    for j, (metric, title) in enumerate(PANELS):
        ax = grid[0, j]
        part = df[df["metric"] == metric].set_index("condition").loc[conditions]
        colors = [color_of(i) for i in part["intervention"]]
        hatches = ["" if m == "default" else "//" for m in part["mask"]]
        err = np.vstack([part["value"] - part["ci_low"], part["ci_high"] - part["value"]])
        bars = ax.bar(x, part["value"], 0.7, color=colors, edgecolor="black", linewidth=0.6)
        for bar, hatch in zip(bars, hatches, strict=True):
            bar.set_hatch(hatch)
            bar.set_alpha(0.85)
        if np.isfinite(err).all():
            for colour, width in (("white", 3.0), ("black", 1.2)):  # outlined: visible on dark bars
                ax.errorbar(x, part["value"], yerr=err, fmt="none", ecolor=colour, capsize=4,
                            elinewidth=width, capthick=width, zorder=5)
        level = part["chance"].iloc[0]
        ax.axhline(level, color="grey", ls="--", lw=1.2, zorder=3)
        ax.set_title(f"{title}\nchance {level:.2f} (dashed)", fontsize=10)
        ax.set_ylim(0, 1)
        if paired:
            _differences(grid[1, j], x, part)
        grid[-1, j].set_xticks(x, conditions, rotation=30, ha="right", fontsize=8)
    grid[0, 0].set_ylabel("mean over items")
    first = df.iloc[0]
    lines = [f"TruthfulQA multiple choice: {first['model']} on {first['dataset']} ({first['items']} items)",
             "bars: 95 % interval over items (Wilson for MC1, bootstrap for MC2); dashed: chance "
             "(uniform choice); hatched: graded mask"]
    if paired:
        lines.append("below: minus intact on the same items (Newcombe's paired interval for MC1, "
                     "a paired bootstrap for MC2)")
    fig.suptitle("\n".join(lines), fontsize=9)
    return save(fig, path)


def _differences(ax, x: np.ndarray, part: pd.DataFrame) -> None:
    """Each condition's paired difference from intact, as a point with its interval."""
    diffs = part[["diff_vs_intact", "diff_ci_low", "diff_ci_high"]].set_axis(["value", "ci_low", "ci_high"], axis=1)
    for i, (intervention, row) in enumerate(zip(part["intervention"], diffs.itertuples(index=False), strict=True)):
        if row.value == row.value:
            points(ax, [x[i]], diffs.iloc[[i]], color_of(intervention), "_nolegend_")
    ax.axhline(0, color="black", lw=0.8)
    ax.grid(axis="y", alpha=0.3)
    if ax.get_subplotspec().is_first_col():
        ax.set_ylabel("minus intact\n(paired)", fontsize=8)


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    return drawn(csv_paths, fig_dir, {"mc": (accuracy_bars, "mc.png")})
