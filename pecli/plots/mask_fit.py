"""`pecli mask fit` figures: the fitted curve beside ALiBi and the study's linear mask, and
held-out perplexity per condition with the gap each closes (pandas + matplotlib only)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

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
    """Held-out corpus perplexity per condition (log axis, bootstrap bars), one panel per
    evaluation set, each bar labelled with the gap it closes."""
    sets = list(dict.fromkeys(zip(df["dataset"], df["split"], strict=True)))
    fig, axes = plt.subplots(1, len(sets), figsize=(WIDTH * len(sets) / 1.3, 4.6), squeeze=False,
                             layout="constrained")
    for ax, (dataset, split) in zip(axes[0], sets, strict=True):
        part = df[(df["dataset"] == dataset) & (df["split"] == split)].reset_index(drop=True)
        y = part["value"].to_numpy(float)
        err = np.vstack([y - part["ci_low"].to_numpy(float), part["ci_high"].to_numpy(float) - y])
        colors = [color_of("intact") if c == "intact" else color_of("zero") if c == "no positions"
                  else color_of(c.split(" ")[0]) for c in part["condition"]]
        ax.bar(range(len(part)), y, color=colors, alpha=0.8)
        ax.errorbar(range(len(part)), y, yerr=np.nan_to_num(np.clip(err, 0, None)), fmt="none",
                    color="black", capsize=2, lw=1)
        by = part.set_index("condition")["value"]
        gap = by.get("no positions", np.nan) > by.get("intact", np.nan)  # else nothing to close
        for i, row in part.iterrows():
            if row["condition"] not in ("intact", "no positions"):
                ax.text(i, 0.02, f"{row['gap_closed']:+.0%}" if gap else "no gap", ha="center", va="bottom", fontsize=7,
                        rotation=90, transform=ax.get_xaxis_transform(),
                        bbox={"facecolor": "white", "alpha": 0.8, "lw": 0, "pad": 1})
        ax.set_yscale("log")
        ax.set_xticks(range(len(part)), part["condition"], rotation=40, ha="right", fontsize=7)
        ax.set_title(f"{dataset}/{split}, {int(part['texts'].iloc[0])} held-out texts", fontsize=9)
        ax.set_ylabel("corpus perplexity (log axis)")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{df['model'].iloc[0]} without positions: held-out perplexity by mask\n"
                 "bars: 95 % bootstrap interval over texts; label at the foot: share of the gap "
                 "closed, (zero - x) / (zero - intact) in log perplexity", fontsize=9)
    return save(fig, path)


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    return drawn(csv_paths, fig_dir, {
        "mask_fit_curve": (curve, "mask_fit_curve.png"),
        "mask_fit": (lambda df, path: perplexities(df[df["metric"] == "perplexity"], path), "mask_fit.png")})
