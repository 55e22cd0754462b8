"""lm-eval figures from lm_eval.csv (pandas + matplotlib only): each task's metric per
condition, a point with its 95 % interval, the intact model first and marked by a line."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pecli.plots.style import WIDTH, color_of, drawn, points, save
from pecli.positions.labels import label as condition_label


def by_condition(df: pd.DataFrame, path: Path) -> Path:
    """One panel per (task, metric): the value under each condition with its interval."""
    df = df.assign(condition=df.apply(condition_label, axis=1))
    conditions = list(dict.fromkeys(df["condition"]))
    panels = list(dict.fromkeys(zip(df["dataset"], df["metric"], df["filter"], strict=True)))
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, layout="constrained",
                             figsize=(max(WIDTH * 0.5 * cols, 0.9 * len(conditions) * cols + 1.5),
                                      3.2 * rows + 0.7))
    x = np.arange(len(conditions))
    for ax, (task, metric, filt) in zip(axes.flat, panels, strict=False):
        part = df[(df["dataset"] == task) & (df["metric"] == metric) & (df["filter"] == filt)]
        part = part.set_index("condition").reindex(conditions)
        for i, (cond, row) in enumerate(part.iterrows()):
            if row.notna().any():
                points(ax, [i], part.loc[[cond]], color_of(row["intervention"]), cond)
            if i and np.isfinite(row.get("diff_vs_intact", np.nan)):
                paired = f"{row['diff_vs_intact']:+.2f}"
                if np.isfinite(row["diff_ci_low"]):
                    paired += f"\n[{row['diff_ci_low']:+.2f}, {row['diff_ci_high']:+.2f}]"
                ax.annotate("minus intact:\n" + paired, (i, row["value"]), xytext=(7, 0),
                            textcoords="offset points", ha="left", va="center", fontsize=7,
                            color="0.3")
        intact = part["value"].iloc[0]
        ax.axhline(intact, color="black", lw=0.8, ls=":", zorder=1)
        chance = part["chance"].dropna() if "chance" in part else part["value"].iloc[0:0]
        if len(chance):  # a multiple-choice accuracy: what a uniform guess scores
            ax.axhline(chance.iloc[0], color="0.5", lw=0.8, ls="--", zorder=1)
            ax.annotate(f"chance {chance.iloc[0]:.2f}", (0, chance.iloc[0]), xycoords=("axes fraction", "data"),
                        xytext=(3, 2), textcoords="offset points", fontsize=7, color="0.4")
        ax.set_xticks(x, conditions, rotation=30, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(conditions) - 0.1)  # room for the last difference's label
        version = part["task_version"].dropna()
        suffix = f" (v{version.iloc[0]})" if len(version) else ""
        method = " / ".join(dict.fromkeys(part["interval_method"].dropna()))
        ax.set_title(f"{task}{suffix}: {metric}" + ("" if filt == "none" else f" [{filt}]")
                     + (f"\nbars: {method.removesuffix(' over documents')}" if method else ""),
                     fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (_, metric, _) in zip(axes.flat, panels, strict=False):
        ax.set_ylabel(METRIC_WORDS.get(metric, metric.replace("_", " ")), fontsize=8)
    first = df.iloc[0]
    fig.suptitle(f"lm-eval's scores under each condition, per task and metric\n{first['model']}, "
                 f"{int(first['rows'])} documents per task\n"
                 f"bars: 95 % interval over documents; dotted: the intact model; dashed: chance;\n"
                 f"beside a point: minus intact on the same documents [paired bootstrap]",
                 fontsize=9)
    return save(fig, path)


# lm-eval's metric names in words, for axis labels
METRIC_WORDS = {"acc": "accuracy", "acc_norm": "accuracy, length-normalised", "exact_match": "exact match",
                "word_perplexity": "word perplexity", "byte_perplexity": "byte perplexity",
                "bits_per_byte": "bits per byte", "f1": "F1", "mcc": "Matthews correlation",
                "perplexity": "perplexity", "bleu": "BLEU"}


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    return drawn(csv_paths, fig_dir, {"lm_eval": (by_condition, "lm_eval.png")})
