"""`pecli finetune` figures: sentiment accuracy per condition (fine-tuned vs the frozen-feature
probe), and the recovery curve of held-out perplexity (pandas + matplotlib only)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pecli.plots.style import WIDTH, band_note, color_of, drawn, save, title, wants_log
from pecli.positions import labels


def accuracy(df: pd.DataFrame, path: Path) -> Path:
    """Test accuracy per condition: the probe (Wilson bars), each seed (dots) and their mean
    (bars: seeds and test texts resampled together)."""
    conds = list(dict.fromkeys(df["intervention"]))
    fig, ax = plt.subplots(figsize=(WIDTH, 3.8))
    for i, cond in enumerate(conds):
        part = df[df["intervention"] == cond]
        color = color_of(cond)
        for dx, metric, marker, label in ((-0.15, "probe_accuracy", "s", "frozen-feature probe"),
                                          (0.15, "finetune_accuracy_mean", "o",
                                           "fine-tuned, mean over seeds")):
            row = part[part["metric"] == metric]
            if row.empty:
                continue
            y, lo, hi = (float(row[c].iloc[0]) for c in ("value", "ci_low", "ci_high"))
            err = np.nan_to_num([[y - lo], [hi - y]])
            ax.errorbar(i + dx, y, yerr=err, fmt=marker, color=color, capsize=3, ms=6,
                        mfc="white" if metric == "probe_accuracy" else color,
                        label=label if i == 0 else None)
        seeds = part[part["metric"] == "finetune_accuracy"]
        ax.plot(np.full(len(seeds), i + 0.3), seeds["value"], ".", color=color, alpha=0.6,
                label="fine-tuned, each seed" if i == 0 else None)
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.set_xticks(range(len(conds)), conds)
    ax.set_ylabel("IMDB test accuracy")
    first = df.iloc[0]
    ax.set_title(title(df, f"sentiment after fine-tuning ({first['fine_tuning']}) vs the "
                           "frozen-feature probe"), fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    ax.text(1.0, -0.16, "probe bars: Wilson over test texts; mean bars: bootstrap over seeds and texts; "
            "dotted: chance", transform=ax.transAxes, ha="right", fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    return save(fig, path)


def recovery(df: pd.DataFrame, path: Path) -> Path:
    """Held-out perplexity against training steps per start (mean over seeds with its
    band over seeds and texts, each seed thin), the untrained intact model and 10 % above it."""
    fig, ax = plt.subplots(figsize=(WIDTH, 4.0))
    intact = df[df["metric"] == "intact_perplexity"]["value"].iloc[0]
    for cond in dict.fromkeys(df.loc[df["metric"] == "perplexity_mean", "condition"]):
        mean = df[(df["metric"] == "perplexity_mean") & (df["condition"] == cond)].sort_values("step")
        start = mean.iloc[0]  # its columns name the start: an intervention, and a mask or not
        masked = "mask" in labels.changed(start)
        color = color_of("fitted") if masked else color_of(start["intervention"])
        name = ("intact start (control)" if labels.label(start) == labels.INTACT
                else f"{start['intervention']} + fitted mask" if labels.fitted_mask(start) else cond)
        ax.plot(mean["step"], mean["value"], "-o", ms=3, color=color, label=f"{name}, mean")
        if mean["ci_low"].notna().any():
            ax.fill_between(mean["step"], mean["ci_low"].clip(lower=1e-9), mean["ci_high"],
                            color=color, alpha=0.15)
        seeds = df[(df["metric"] == "perplexity") & (df["condition"] == cond)]
        for _, part in seeds.groupby("seed_run"):
            ax.plot(part["step"], part["value"], "-", lw=0.6, color=color, alpha=0.5)
    ax.axhline(intact, color="black", lw=1, label=f"intact, untrained ({intact:.4g})")
    ax.axhline(intact * 1.1, color="black", lw=1, ls="--", label="10 % above intact")
    log = wants_log([*df.loc[df["metric"] == "perplexity_mean", "value"], intact * 1.1])
    if log:  # a collapse and its recovery span orders of magnitude; a small change does not
        ax.set_yscale("log")
    ax.set_xlabel("fine-tuning steps")
    ax.set_ylabel("held-out corpus perplexity" + (" (log axis)" if log else ""))
    n = int(df["seeds"].iloc[0])
    band = band_note(df[df["metric"] == "perplexity_mean"])
    ax.set_title(title(df, f"recovery after positions are removed ({n} seeds; {band})"), fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return save(fig, path)


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    return drawn(csv_paths, fig_dir, {"finetune": (accuracy, "finetune.png"),
                                      "recovery": (recovery, "recovery.png")})
