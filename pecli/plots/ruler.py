"""RULER figures from ruler.csv (pandas + matplotlib only): accuracy against length, one panel
per task, one line per model and condition, with each cell's 95 % interval over samples;
lengths past the model's context marked; under each task, where a condition runs beside
intact, its paired difference from intact."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from pecli.plots.length import short_name
from pecli.plots.style import WIDTH, color_of, drawn, dtype_note, points, save
from pecli.positions.labels import label as condition_label


def by_length(df: pd.DataFrame, path: Path) -> Path:
    df = df.assign(condition=[condition_label(r) for _, r in df.iterrows()])
    tasks = list(dict.fromkeys(df["task"]))
    models = list(dict.fromkeys(df["model"]))
    paired = "diff_vs_intact" in df and df["diff_vs_intact"].notna().any()  # a remedy beside intact
    cols = 2 if len(tasks) == 4 else min(len(tasks), 3)  # four tasks: 2 x 2, no empty panels
    rows = -(-len(tasks) // cols)
    heights = [2.0, 1.0] * rows if paired else [1.0] * rows  # each task's differences under it
    fig, grid = plt.subplots(len(heights), cols, figsize=(max(WIDTH * 0.5 * cols + 0.6, 5.6),
                                                          2.8 * rows * (1.5 if paired else 1.0) + 1.2),
                             squeeze=False, height_ratios=heights, layout="constrained")
    axes, below = (grid[0::2], grid[1::2]) if paired else (grid, None)
    lengths = sorted(df["length"].unique())
    context = int(df["context"].max())
    ticks = (range(len(lengths)), [f"{n:,}{'*' if n > context else ''}" for n in lengths])
    lines = list(dict.fromkeys(zip(df["model"], df["condition"], strict=True)))
    dodge = {line: 0.06 * (i - (len(lines) - 1) / 2) for i, line in enumerate(lines)}  # bars side by side
    for k, (ax, task) in enumerate(zip(axes.flat, tasks, strict=False)):
        part = df[df["task"] == task]
        for (model, condition), line in part.groupby(["model", "condition"], sort=False):
            line = line.sort_values("length")
            x = [lengths.index(n) + dodge[model, condition] for n in line["length"]]
            name = condition if len(models) == 1 else f"{short_name(model)}: {condition}"
            ax.plot(x, line["value"], "-", color=color_of(condition), lw=1, alpha=0.7)
            points(ax, x, line, color_of(condition), name)
            if paired and line["diff_vs_intact"].notna().any():
                _differences(below.flat[k], x, line, color_of(condition))
        ax.set_title(task, fontsize=9)
        ax.set_ylim(-0.05, 1.05)
        if k % cols == 0:
            ax.set_ylabel("accuracy (mean recall)", fontsize=8)
        ax.set_xticks(*ticks, fontsize=8)
        if len(lengths) == 1:
            ax.set_xlim(-0.5, 0.5)
        ax.grid(alpha=0.3)
        if paired:
            low = below.flat[k]
            low.axhline(0, color="black", lw=0.8)
            low.set_ylim(-1.05, 1.05)
            if k % cols == 0:
                low.set_ylabel("minus intact\n(paired)", fontsize=8)
            low.set_xticks(*ticks, fontsize=8)
            low.set_xlim(ax.get_xlim())
            low.grid(alpha=0.3)
    for ax in [*axes.flat[len(tasks):], *(below.flat[len(tasks):] if paired else ())]:
        ax.axis("off")
    for ax in (below if paired else axes)[-1, :]:
        ax.set_xlabel(f"length (tokens{'; * past the context' if lengths[-1] > context else ''})", fontsize=8)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 4), fontsize=8)
    first = df.iloc[0]
    samples = int(df["samples"].max())
    under = ("\nbelow each task: minus intact on the same samples (Newcombe's paired\ninterval; "
             "a paired bootstrap where recall is fractional)" if paired else "")
    fig.suptitle(f"RULER tasks: accuracy against length, greedy decoding\n{', '.join(map(short_name, models))}, "
                 f"context {context:,} tokens{dtype_note(first)}, {samples} samples per cell,\n"
                 f"haystack {first['haystack']}; bars: 95 % interval over samples\n(Wilson's; a bootstrap "
                 f"where recall is fractional){under}", fontsize=9)
    return save(fig, path)


def _differences(ax, x, line: pd.DataFrame, color: str) -> None:
    """A condition's paired differences from intact at each length, with their intervals."""
    diffs = line[["diff_vs_intact", "diff_ci_low", "diff_ci_high"]].set_axis(["value", "ci_low", "ci_high"], axis=1)
    points(ax, x, diffs, color, "_nolegend_")


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    return drawn(csv_paths, fig_dir, {"ruler": (by_length, "ruler.png")})
