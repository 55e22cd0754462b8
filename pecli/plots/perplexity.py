"""Perplexity figures from the written CSVs (pandas + matplotlib only).

A condition is (intervention, mask, semantics, protocol). The figures put the mask variant on
the x axis, colour by intervention (pecli's one palette) and mark the protocol, so a panel
holds a handful of series; the headline aggregation (corpus) gets its own large panels.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pecli.plots.style import (
    MARKERS,
    WIDTH,
    color_of,
    drawn,
    interval_note,
    points,
    save,
    title,
    wants_log,
)

AGG_ORDER = ("corpus", "mean_per_text", "median_per_text", "mean_per_token")
AGG_LABEL = {"corpus": "corpus perplexity exp(total NLL / tokens)",
             "mean_per_text": "mean of per-text perplexities",
             "median_per_text": "median of per-text perplexities",
             "mean_per_token": "mean over tokens of exp(NLL)"}
NO_MASK = "no mask"



def _variants(df: pd.DataFrame) -> pd.DataFrame:
    """Rows with `variant` (the x category: 'no mask' or mask/semantics) and the default
    mask, one computation under every semantics and protocol, kept once."""
    df = df.copy()
    several_masks = df.loc[df["mask"] != "default", "mask"].nunique() > 1
    df["variant"] = [NO_MASK if m == "default" else (f"{m}/{s}" if several_masks else s)
                     for m, s in zip(df["mask"], df["mask_semantics"], strict=True)]
    default = df["mask"] == "default"
    df.loc[default, "protocol"] = "any"
    keys = ["intervention", "variant", "protocol"] + (["aggregation"] if "aggregation" in df
                                                      else ["text_id" if "text_id" in df else "text_index"])
    return df.drop_duplicates(keys)


STUDY_LABEL = "x: the study's number (gpt2, transformers 4.x)"


def _panel(ax, part: pd.DataFrame, variants: list[str], protocols: list[str],
           study: bool = False) -> None:
    """Points per (intervention, protocol) at each mask variant, dodged side by side;
    `study`: the study's number beside each (rows' study_value, gpt2 only) as a cross."""
    interventions = list(dict.fromkeys(part["intervention"]))
    series = [(iv, p) for iv in interventions for p in protocols]
    width = 0.7 / max(len(series), 1)
    for k, (iv, proto) in enumerate(series):
        # the default mask (protocol "any") is drawn once, with the first protocol's series
        shown = [proto, "any"] if proto == protocols[0] else [proto]
        rows = part[(part["intervention"] == iv) & (part["protocol"].isin(shown))]
        rows = rows.set_index("variant").reindex(variants).dropna(subset=["value"])
        if rows.empty:  # e.g. `learned` only without a mask: no empty legend entry
            continue
        x = np.array([variants.index(v) for v in rows.index]) + (k - (len(series) - 1) / 2) * width
        label = iv if len(protocols) == 1 else f"{iv}, {proto} protocol"
        if (rows["protocol"] == "any").all():
            label = f"{iv}, no mask (any protocol)"
        points(ax, x, rows.reset_index(), color_of(iv), label,
               marker=MARKERS[protocols.index(proto) % len(MARKERS)])
        if study and "study_value" in rows and rows["study_value"].notna().any():
            first = not any(h.get_label() == STUDY_LABEL for h in ax.lines)
            ax.plot(x, rows["study_value"].to_numpy(dtype=float), "x", color=color_of(iv), ms=8,
                    mew=1.5, label=STUDY_LABEL if first else None)
    ax.set_xticks(range(len(variants)), variants)
    if wants_log(part["value"]):
        ax.set_yscale("log")
    ax.grid(axis="y", color="0.9", lw=0.6)


def aggregation_figure(df: pd.DataFrame, path: Path) -> Path:
    """Corpus perplexity large (one panel per protocol), the other aggregations small."""
    df = _variants(df)
    variants = list(dict.fromkeys([NO_MASK] + list(df["variant"])))
    variants = [v for v in variants if v in set(df["variant"])]
    protocols = [p for p in dict.fromkeys(df["protocol"]) if p != "any"] or ["any"]
    others = [a for a in AGG_ORDER[1:] if a in set(df["aggregation"])]
    fig = plt.figure(figsize=(WIDTH * 1.15, 7.2), layout="constrained")
    grid = fig.add_gridspec(2, max(len(others), 1), height_ratios=[1.6, 1])
    top = grid[0, :].subgridspec(1, len(protocols), wspace=0.05)
    corpus = df[df["aggregation"] == "corpus"]
    head_axes = []
    for i, proto in enumerate(protocols):
        ax = fig.add_subplot(top[0, i], sharey=head_axes[0] if head_axes else None)
        _panel(ax, corpus, variants, [proto], study=True)
        ax.set_title(f"corpus perplexity (headline), {proto} protocol" if proto != "any"
                     else "corpus perplexity (headline)", fontsize=9)
        ax.set_xlabel("mask semantics of the linear mask" if variants != [NO_MASK] else "")
        if i == 0:
            ax.set_ylabel("perplexity" + (" (log scale)" if ax.get_yscale() == "log" else ""))
        head_axes.append(ax)
    shown = pd.concat([corpus["value"], corpus.get("study_value", pd.Series(dtype=float))])
    if wants_log(shown):  # shared axis: both panels the same scale (the study's numbers too)
        for ax in head_axes:
            ax.set_yscale("log")
    for j, agg in enumerate(others):
        ax = fig.add_subplot(grid[1, j])
        _panel(ax, df[df["aggregation"] == agg], variants, protocols)
        ax.set_title(AGG_LABEL.get(agg, agg), fontsize=8)
        ax.tick_params(axis="x", labelrotation=40, labelsize=7)
        ax.tick_params(axis="y", labelsize=7)
        if j == 0:
            ax.set_ylabel("perplexity", fontsize=8)
    # one legend for all panels, below them: colour = positions, marker = protocol
    handles = max((a.get_legend_handles_labels() for a in fig.axes), key=lambda hl: len(hl[1]))
    fig.legend(*handles, loc="outside lower center", ncol=min(len(handles[1]), 4), fontsize=8,
               title=interval_note(df) or None, title_fontsize=8)
    for ax in fig.axes:  # a linear axis cut above 0 magnifies small differences: say so
        low = ax.get_ylim()[0]
        if ax.get_yscale() == "linear" and low > 0:
            ax.set_title(f"{ax.get_title()}\n(y axis from {low:,.4g}, not 0)", fontsize=ax.title.get_fontsize())
    tokens = int(df["tokens"].iloc[0])
    masked = ", graded masks" if (df["mask"].astype(str) != "default").any() else ""
    fig.suptitle(title(df, f"perplexity with and without positions{masked} "
                           f"({tokens:,} scored tokens)"), fontsize=10)
    return save(fig, path)


def per_text_boxes(df: pd.DataFrame, path: Path) -> Path:
    """The distribution of per-text perplexities per condition (what mean/median summarise):
    one panel per protocol, one box per (mask variant, intervention), coloured by intervention."""
    df = _variants(df.dropna(subset=["value"]))
    protocols = [p for p in dict.fromkeys(df["protocol"]) if p != "any"] or ["any"]
    variants = [v for v in dict.fromkeys([NO_MASK] + list(df["variant"])) if v in set(df["variant"])]
    interventions = list(dict.fromkeys(df["intervention"]))
    n_boxes = len(variants) * len(interventions)
    fig, axes = plt.subplots(1, len(protocols), figsize=(WIDTH, 0.32 * n_boxes + 1.8),
                             sharex=True, sharey=True, squeeze=False, layout="constrained")
    for ax, proto in zip(axes[0], protocols, strict=True):
        part = df[df["protocol"].isin([proto, "any"])]
        data, labels, colors = [], [], []
        for v in variants:
            for iv in interventions:
                vals = part.loc[(part["variant"] == v) & (part["intervention"] == iv), "value"]
                if len(vals):
                    data.append(np.log10(vals.to_numpy(dtype=float)))
                    labels.append(f"{iv}, {v}")
                    colors.append(color_of(iv))
        box = ax.boxplot(data[::-1], vert=False, showmeans=True, patch_artist=True, widths=0.6,
                         meanprops={"marker": "^", "markerfacecolor": "white",
                                    "markeredgecolor": "k", "markersize": 5},
                         medianprops={"color": "k"}, flierprops={"markersize": 2, "alpha": 0.4})
        for patch, c in zip(box["boxes"], colors[::-1], strict=True):
            patch.set(facecolor=c, alpha=0.35, edgecolor=c)
        ax.set_yticks(range(1, len(labels) + 1), labels[::-1], fontsize=7)
        ax.set_title(f"{proto} protocol" if proto != "any" else "", fontsize=9)
        ax.set_xlabel("log10 per-text perplexity")
        if ax is axes[0][0]:
            ax.set_ylabel("positions, mask semantics")
        ax.grid(axis="x", color="0.9", lw=0.6)
    fig.suptitle(title(df, "per-text perplexity (box: quartiles, whiskers 1.5 IQR, "
                           "triangle: mean of log10)"), fontsize=9)
    return save(fig, path)


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    """PNGs for the `perplexity` and `texts` tables that are present."""
    return drawn(csv_paths, fig_dir, {"perplexity": (aggregation_figure, "perplexity.png"),
                                      "texts": (per_text_boxes, "perplexity_texts.png")})
