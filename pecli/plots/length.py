"""Length figures from length.csv (pandas + matplotlib only): NLL against position inside
the window, one line per condition, a panel per model, the model's training or original
context marked."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pecli.plots.style import WIDTH, color_of, save


def condition_label(row) -> str:
    """`zero + linear/log-bias, yarn:2`: intervention, mask (if any), rope scaling (if any)."""
    label = str(row["intervention"])
    if row["mask"] != "default":
        label += f" + {row['mask']}/{row['mask_semantics']}"
    rope = row.get("rope_scaling")
    if isinstance(rope, str) and rope != "none":
        return rope if label == "learned" else f"{label}, {rope}"
    return "intact" if label == "learned" else label


def _panel(ax, part: pd.DataFrame) -> None:
    part = part.assign(condition=[condition_label(r) for _, r in part.iterrows()])
    longest = part["length"].max()
    for condition, rows in part.groupby("condition", sort=False):
        color = color_of(condition)
        shown = False
        for length, at in rows.groupby("length"):
            at = at[~at["all_positions"] & (at["tokens"] > 0)]
            if at.empty:
                continue
            x = (at["window_start"] + at["window_end"]) / 2
            main = length == rows.loc[rows["tokens"] > 0, "length"].max()
            ax.plot(x, at["nll_mean"], "-o" if main else ":", color=color, ms=3,
                    lw=1.6 if main else 0.9, alpha=1 if main else 0.6,
                    label=condition if main and not shown else None)
            shown = shown or main
            if main and at["ci_low"].notna().any():
                ax.fill_between(x, np.log(at["ci_low"]), np.log(at["ci_high"]), color=color, alpha=0.15, lw=0)
        missing = rows[rows["note"].fillna("").astype(bool)]
        for _, r in missing.drop_duplicates("length").iterrows():
            ax.plot([], [], " ", label=f"{condition} @ {r['length']}: {r['note']}")
    context = int(part["context"].iloc[0])
    if context < longest:
        kind = "training" if str(part["position_table"].iloc[0]) != "rotary" or part["random_init"].iloc[0] \
            else "original"
        ax.axvline(context, color="0.4", ls="--", lw=1)
        ax.annotate(f"{kind} context {context}", (context, 1), xycoords=("data", "axes fraction"),
                    xytext=(3, -12), textcoords="offset points", fontsize=7, color="0.3")
    ax.set_xlabel("position in the window (tokens; bucket midpoints)")
    ax.set_ylabel("mean NLL (nats)")
    ax.set_title(str(part["model"].iloc[0]), fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)


def nll_by_position(df: pd.DataFrame, path: Path) -> Path:
    models = list(dict.fromkeys(df["model"]))
    cols = min(len(models), 2)
    rows = -(-len(models) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(WIDTH * (1 if cols == 1 else 0.8 * cols), 4.2 * rows),
                             squeeze=False)
    for ax, model in zip(axes.flat, models, strict=False):
        _panel(ax, df[df["model"] == model])
    for ax in axes.flat[len(models):]:
        ax.axis("off")
    first = df.iloc[0]
    lengths = ", ".join(str(n) for n in sorted(df["length"].unique()))
    fig.suptitle(f"NLL by position, {first['window_protocol']} windows of {lengths} tokens\n"
                 f"{first['dataset']}/{first['split']}, {first['rows']} documents, "
                 f"{first['stream_tokens']:,} stream tokens\n"
                 "solid: the longest window; dotted: shorter ones; band: 95 % bootstrap over windows",
                 fontsize=8.5, y=1.0)
    fig.tight_layout()
    return save(fig, path)


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    if "length" not in csv_paths:
        return []
    return [nll_by_position(pd.read_csv(csv_paths["length"], keep_default_na=True), Path(fig_dir) / "length.png")]
