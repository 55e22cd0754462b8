"""Perplexity figures from the written CSVs (pandas + matplotlib only)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

AGG_ORDER = ("corpus", "mean_per_text", "median_per_text", "mean_per_token")


def condition_label(row) -> str:
    """`zero + linear/log-bias (study)`: the short name of one condition."""
    label = row["intervention"]
    if row["mask"] != "default":
        label += f" + {row['mask']}/{row['mask_semantics']} ({row['protocol']})"
    return label


def _conditions(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["condition"] = df.apply(condition_label, axis=1)
    # the default mask is one computation under every semantics/protocol: show it once
    return df.drop_duplicates(["condition", "aggregation"] if "aggregation" in df else ["condition", "text_index"])


def aggregation_bars(df: pd.DataFrame, path: Path) -> Path:
    """Grouped bars: every aggregation of every condition, log scale."""
    df = _conditions(df)
    pivot = df.pivot_table(index="condition", columns="aggregation", values="value", sort=False)
    pivot = pivot[[a for a in AGG_ORDER if a in pivot.columns]]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(pivot) + 2), 4.5))
    x = np.arange(len(pivot))
    width = 0.8 / len(pivot.columns)
    for j, agg in enumerate(pivot.columns):
        ax.bar(x + (j - (len(pivot.columns) - 1) / 2) * width, pivot[agg], width, label=agg)
    ax.set_yscale("log")
    ax.set_xticks(x, pivot.index, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("perplexity (log scale)")
    first = df.iloc[0]
    ax.set_title(f"{first['model']} on {first['dataset']} ({first['rows']} texts, "
                 f"{first['tokens']} scored tokens)", fontsize=10)
    ax.legend(title="aggregation", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def per_text_boxes(df: pd.DataFrame, path: Path) -> Path:
    """The distribution of per-text perplexities per condition (what mean/median summarise)."""
    df = _conditions(df.dropna(subset=["value"]))
    groups = list(dict.fromkeys(df["condition"]))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(groups) + 2), 4.5))
    ax.boxplot([np.log10(df.loc[df["condition"] == g, "value"]) for g in groups], showmeans=True)
    ax.set_xticks(range(1, len(groups) + 1), groups, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("log10 per-text perplexity")
    ax.set_title("per-text perplexity (triangle: mean of the logs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    """PNGs for the `perplexity` and `texts` tables that are present."""
    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    out = []
    if "perplexity" in csv_paths:
        out.append(aggregation_bars(pd.read_csv(csv_paths["perplexity"]), fig_dir / "perplexity.png"))
    if "texts" in csv_paths:
        out.append(per_text_boxes(pd.read_csv(csv_paths["texts"]), fig_dir / "perplexity_texts.png"))
    return out
