"""Passkey figures from passkey.csv (pandas + matplotlib only): accuracy as a depth x length
heatmap, one panel per model and condition, each cell annotated with its accuracy and
trials and its 95 % Wilson interval; lengths past the model's context marked."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pecli.plots.length import short_name
from pecli.plots.style import WIDTH, drawn, dtype_note, save
from pecli.positions.labels import label as condition_label


def _panel(ax, part: pd.DataFrame, first_column: bool, bottom_row: bool):
    cells = part[part["depth"].astype(str) != "all"].assign(depth=lambda d: d["depth"].astype(float))
    lengths = sorted(cells["length"].unique())
    depths = sorted(cells["depth"].unique())
    grid = np.full((len(depths), len(lengths)), np.nan)
    for _, row in cells.iterrows():
        grid[depths.index(row["depth"]), lengths.index(row["length"])] = row["value"]
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="upper")
    for (i, j), value in np.ndenumerate(grid):
        row = cells[(cells["depth"] == depths[i]) & (cells["length"] == lengths[j])].iloc[0]
        text = "n/a" if value != value else (
            f"{value:.0%}\n{int(row['correct'])}/{int(row['trials'])}"
            + (f"\n[{row['ci_low']:.0%}, {row['ci_high']:.0%}]" if row["ci_low"] == row["ci_low"] else ""))
        ax.text(j, i, text, ha="center", va="center", fontsize=7,
                color="black" if value == value and value > 0.6 else "white")
    context = int(part["context"].iloc[0])
    ax.set_xticks(range(len(lengths)),
                  [f"{n}{'*' if n > context else ''}" for n in lengths], fontsize=8)
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=8)
    if bottom_row:
        ax.set_xlabel("prompt length (tokens; * past the context)", fontsize=8)
    if first_column:
        ax.set_ylabel("depth of the key (0 = start)", fontsize=8)
    ax.set_title(f"{short_name(part['model'].iloc[0])}: {part['condition'].iloc[0]}", fontsize=9)
    return image


def _points(df: pd.DataFrame, path: Path) -> Path:
    """One length and one depth: a heatmap would be one cell a panel, so each condition is a
    point with its Wilson interval, its paired difference from intact beneath its name."""
    cells = df[df["depth"].astype(str) != "all"]
    fig, ax = plt.subplots(figsize=(WIDTH, 3.4), layout="constrained")
    ticks, models = [], cells["model"].nunique() > 1
    for x, (_, row) in enumerate(cells.iterrows()):
        ax.errorbar(x, row["value"], yerr=[[row["value"] - row["ci_low"]], [row["ci_high"] - row["value"]]],
                    fmt="o", color="black", ms=5, capsize=4, lw=1.2)
        ax.annotate(f"{int(row['correct'])}/{int(row['trials'])}", (x, row["value"]),
                    textcoords="offset points", xytext=(8, -3), fontsize=8)
        diff = row.get("diff_vs_intact", np.nan)
        pair = "" if diff != diff else f"\n{diff:+.2f}" + (
            f" [{row['diff_ci_low']:+.2f}, {row['diff_ci_high']:+.2f}]"
            if row.get("diff_ci_low") == row.get("diff_ci_low") else " (no interval)")
        ticks.append(f"{short_name(row['model']) + ': ' if models else ''}{row['condition']}{pair}")
    ax.set_xticks(range(len(ticks)), ticks, fontsize=7.5)
    ax.set_xlim(-0.5, len(ticks) - 0.5)
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("passkey accuracy")
    ax.grid(axis="y", color="0.9", lw=0.6)
    first = cells.iloc[0]
    past = " (past the context)" if first["length"] > first["context"] else ""
    fig.suptitle(f"passkey retrieval at {int(first['length']):,} tokens{past}, depth {first['depth']}; "
                 f"{'models' if models else short_name(first['model'])}"
                 f"{dtype_note(first)}\nbars: 95 % Wilson interval over trials; under each "
                 "condition its paired difference from intact (Newcombe's paired interval)", fontsize=9)
    return save(fig, path)


def heatmap(df: pd.DataFrame, path: Path) -> Path:
    df = df.assign(condition=[condition_label(r) for _, r in df.iterrows()])
    cells = df[df["depth"].astype(str) != "all"]
    if cells["length"].nunique() == 1 and cells["depth"].nunique() == 1:
        return _points(df, path)
    groups = list(df.groupby(["model", "condition"], sort=False))
    cols = min(len(groups), 3)
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(WIDTH * 0.42 * cols + 1.0, 3.0 * rows + 0.8),
                             squeeze=False, layout="constrained")
    image = None
    for i, (ax, (_, part)) in enumerate(zip(axes.flat, groups, strict=False)):
        image = _panel(ax, part, first_column=i % cols == 0, bottom_row=i + cols >= len(groups))
    for ax in axes.flat[len(groups):]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="accuracy")
    first = df.iloc[0]
    fig.suptitle(f"passkey retrieval: greedy decoding, up to {first['max_new_tokens']} new tokens, "
                 f"context {first['context']} tokens{dtype_note(first)}\n"
                 "cells: accuracy, right/trials" + (", 95 % Wilson interval" if df["ci_low"].notna().any()
                                                    else " (no interval: a cell's trials share their filler)"),
                 fontsize=9)
    return save(fig, path)


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    return drawn(csv_paths, fig_dir, {"passkey": (heatmap, "passkey.png")})
