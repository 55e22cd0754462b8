"""TruthfulQA multiple-choice figure from the written mc.csv (pandas + matplotlib only)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pecli.plots.style import color_of, drawn, save
from pecli.positions.labels import label as condition_label

PANELS = (("mc1", "MC1 accuracy"), ("mc2", "MC2 (true probability mass)"),
          ("mc1_norm", "MC1, length-normalised"))


def accuracy_bars(df: pd.DataFrame, path: Path) -> Path:
    """One panel per metric: a bar per condition with its interval, chance level dashed."""
    df = df.copy()
    df["condition"] = df.apply(condition_label, axis=1)
    df = df.drop_duplicates(["condition", "metric"])  # the default mask: one model under any semantics
    conditions = list(dict.fromkeys(df["condition"]))
    fig, axes = plt.subplots(1, len(PANELS), figsize=(max(9.0, 1.1 * len(conditions) * 3), 4.6),
                             sharey=True)
    x = np.arange(len(conditions))
    for ax, (metric, title) in zip(axes, PANELS, strict=True):
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
        ax.text(0.02, level + 0.01, f"chance {level:.2f}", transform=ax.get_yaxis_transform(),
                ha="left", va="bottom", fontsize=8, color="dimgrey", zorder=4,
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
        ax.set_xticks(x, conditions, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("mean over items (95 %: Wilson mc1, mc1_norm; bootstrap mc2)")
    first = df.iloc[0]
    fig.suptitle(f"TruthfulQA multiple choice: {first['model']} on {first['dataset']} "
                 f"({first['items']} items); dashed: chance (uniform choice); hatched: graded mask",
                 fontsize=10)
    return save(fig, path)


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    return drawn(csv_paths, fig_dir, {"mc": (accuracy_bars, "mc.png")})
