"""`pecli mask fit` figures: the fitted curve beside ALiBi and the study's linear mask, and
held-out perplexity per condition and the share of the gap each closes (pandas + matplotlib only)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import ScalarFormatter

from pecli.plots.style import WIDTH, color_of, drawn, save

FLOOR = -12.0  # log-weight axis bottom: below, a key weighs < 6e-6 of the newest


def curve(df: pd.DataFrame, path: Path) -> Path:
    """log m(d) against distance: the fitted mask per head (solid), ALiBi per head (dashed),
    the study's linear mask (black, dotted) for the longest row."""
    fig, ax = plt.subplots(figsize=(WIDTH, 4.0))
    first = df.iloc[0]
    heads = sorted(df["head"].unique())
    fitted = df[df["shape"] == "fitted"]
    shared = fitted.groupby("distance")["value"].nunique().max() == 1  # one curve for every head
    palette = plt.get_cmap("viridis")
    for i, h in enumerate(heads[:1] if shared else heads):
        part = fitted[fitted["head"] == h]
        ax.plot(part["distance"], part["value"].clip(lower=FLOOR), lw=2,
                color=palette(i / max(len(heads) - 1, 1)) if not shared else color_of("fitted"),
                label="fitted (every head)" if shared else f"fitted, head {h}")
    for i, h in enumerate(heads):
        part = df[(df["shape"] == "alibi") & (df["head"] == h)]
        ax.plot(part["distance"], part["value"].clip(lower=FLOOR), "--", lw=1,
                color=color_of("alibi"), alpha=0.7, label="ALiBi's fixed slopes" if i == 0 else None)
    part = df[(df["shape"] == "linear") & (df["head"] == heads[0])]
    ax.plot(part["distance"], part["value"], ":", lw=2, color="black",
            label="the study's linear mask (1 -> 0.1)")
    rmse = df.groupby("shape")["rmse_to_fitted"].first()
    ax.set_ylim(FLOOR - 0.3, max(0.5, float(df["value"].max()) + 0.3))
    ax.set_xlabel("distance to the query (tokens; 0 = the query itself)")
    ax.set_ylabel("log weight = bias added to the logits")
    ax.set_title(f"fitted mask ({first['form']}, {first['model']}) vs ALiBi and the linear mask\n"
                 f"RMSE to the fitted curve: ALiBi {rmse.get('alibi', np.nan):.2f}, "
                 f"linear {rmse.get('linear', np.nan):.2f} (log weight; below {FLOOR:g} drawn at it)",
                 fontsize=9)
    ax.legend(fontsize=7, ncol=2, loc="lower left")
    ax.grid(alpha=0.3)
    return save(fig, path)


def perplexities(df: pd.DataFrame, path: Path) -> Path:
    """Per evaluation set, two panels: held-out corpus perplexity per condition (points with
    their bootstrap interval over texts, log axis), and below it the share of the gap in log
    perplexity each condition closes with its paired interval (linear axis: 0 is no positions,
    1 the intact model)."""
    sets = list(dict.fromkeys(zip(df["dataset"], df["split"], strict=True)))
    fig, axes = plt.subplots(2, len(sets), figsize=(WIDTH * len(sets) / 1.3, 6.2), squeeze=False,
                             layout="constrained", sharex="col", height_ratios=(1, 1))
    for k, (dataset, split) in enumerate(sets):
        top, low = axes[0, k], axes[1, k]
        part = df[(df["dataset"] == dataset) & (df["split"] == split)].reset_index(drop=True)
        x = np.arange(len(part))
        colors = [color_of("intact") if c == "intact" else color_of("zero") if c == "no positions"
                  else color_of(c.split(" ")[0]) for c in part["condition"]]
        by = part.set_index("condition")["value"]
        gap = by.get("no positions", np.nan) > by.get("intact", np.nan)  # else nothing to close
        for i, row in part.iterrows():
            _point(top, i, row["value"], row["ci_low"], row["ci_high"], colors[i])
            if gap and row["condition"] not in ("intact", "no positions"):
                _point(low, i, row["gap_closed"], row["gap_ci_low"], row["gap_ci_high"], colors[i])
        top.set_yscale("log")
        top.yaxis.set_major_formatter(ScalarFormatter())
        top.yaxis.set_minor_formatter(ScalarFormatter())
        top.tick_params(axis="y", which="minor", labelsize=7)
        top.set_ylabel("corpus perplexity (log axis)")
        top.set_title(f"{dataset}/{split}, {int(part['texts'].iloc[0])} held-out texts", fontsize=9)
        for level in (0, 1):
            low.axhline(level, color="0.4", ls="--", lw=0.8)
        if not gap:
            low.text(0.5, 0.5, "no gap to close: no positions is not worse than intact",
                     ha="center", va="center", fontsize=8, transform=low.transAxes)
        low.set_ylabel("share of the gap closed, linear axis\n(0 = no positions, 1 = intact)")
        low.set_xticks(x, part["condition"], rotation=40, ha="right", fontsize=7)
        for ax in (top, low):
            ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{df['model'].iloc[0]} without positions: held-out perplexity by mask\n"
                 "points: value with its 95 % bootstrap interval over texts (the gap closed: "
                 "paired, the same texts for every condition)", fontsize=9)
    return save(fig, path)


def _point(ax, x: float, y: float, low: float, high: float, color) -> None:
    ax.plot([x], [y], "o", color=color, ms=5)
    if low == low and high == high:
        ax.plot([x, x], [low, high], color=color, lw=1.6)


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    return drawn(csv_paths, fig_dir, {
        "mask_fit_curve": (curve, "mask_fit_curve.png"),
        "mask_fit": (lambda df, path: perplexities(df[df["metric"] == "perplexity"], path), "mask_fit.png")})
