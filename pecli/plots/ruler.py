"""RULER figures from ruler.csv (pandas + matplotlib only): accuracy against length, one panel
per task, one line per model and condition, with each cell's 95 % interval over samples;
lengths past the model's context marked."""

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
    cols = 2 if len(tasks) == 4 else min(len(tasks), 3)  # four tasks: 2 x 2, no empty panels
    rows = -(-len(tasks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(WIDTH * 0.5 * cols + 0.6, 2.8 * rows + 1.0),
                             squeeze=False, sharey=True, layout="constrained")
    lengths = sorted(df["length"].unique())
    context = int(df["context"].max())
    for ax, task in zip(axes.flat, tasks, strict=False):
        part = df[df["task"] == task]
        for (model, condition), line in part.groupby(["model", "condition"], sort=False):
            line = line.sort_values("length")
            x = [lengths.index(n) for n in line["length"]]
            name = condition if len(models) == 1 else f"{short_name(model)}: {condition}"
            ax.plot(x, line["value"], "-", color=color_of(condition), lw=1, alpha=0.7)
            points(ax, x, line, color_of(condition), name)
        ax.set_title(task, fontsize=9)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xticks(range(len(lengths)), [f"{n:,}{'*' if n > context else ''}" for n in lengths],
                      fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(tasks):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy (mean recall)", fontsize=8)
    for ax in axes[-1, :]:
        ax.set_xlabel(f"length (tokens{'; * past the context' if lengths[-1] > context else ''})", fontsize=8)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 4), fontsize=8)
    first = df.iloc[0]
    samples = int(df["samples"].max())
    fig.suptitle(f"RULER tasks: accuracy against length, greedy decoding\n{', '.join(map(short_name, models))}, "
                 f"context {context:,} tokens{dtype_note(first)}, {samples} samples per cell, "
                 f"haystack {first['haystack']}\nbars: 95 % interval over samples (Wilson's; a bootstrap where "
                 "recall is fractional)", fontsize=9)
    return save(fig, path)


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    return drawn(csv_paths, fig_dir, {"ruler": (by_length, "ruler.png")})
