"""Figures of `pecli attn` from its CSVs (pandas + matplotlib only), one file per kind, a
panel per model and condition:

    attn_heads.png       layer x head heatmaps: first-token mass (sinks boxed), mean
                         distance, entropy
    attn_entropy.png     entropy (mean over heads) against query position, a few layers,
                         uniform attention dotted, the context marked
    attn_distance.png    attention mass by distance bin (mean over layers and heads)
    attn_frequency.png   rotary frequency usage: mean |q| |k| per layer x pair
    attn_positional.png  positional vectors' first two components, coloured by position
    attn_norms.png       hidden-state norm by position per layer, and the position probe
                         from the norm alone against the whole vector
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from pecli.plots.length import condition_label, short_name
from pecli.plots.style import WIDTH, color_of, first_or_all, save

CONDITION = ["model", "intervention", "mask", "mask_semantics", "rope_scaling"]


def _groups(df: pd.DataFrame):
    """(title, rows) per model and condition, in the table's order."""
    for _, rows in df.groupby(CONDITION, sort=False, dropna=False):
        r = rows.iloc[0]
        yield f"{short_name(r['model'])}: {condition_label(r)}", rows


def heads(df: pd.DataFrame, path: Path) -> Path | None:
    df = df[df["scope"] == "head"]
    if df.empty:
        return None
    groups, shown = first_or_all(list(_groups(df)))
    metrics = [("first_token_mass", "first-token mass (sink: > eps)", "viridis"),
               ("mean_distance", "mean distance (tokens)", "magma"),
               ("entropy", "entropy (nats)", "cividis")]
    fig, axes = plt.subplots(len(groups), 3, figsize=(WIDTH * 1.6, 2.6 * len(groups) + 0.6),
                             squeeze=False, constrained_layout=True)
    for i, (name, rows) in enumerate(groups):
        for j, (metric, label, cmap) in enumerate(metrics):
            ax = axes[i, j]
            m = rows[rows["metric"] == metric].pivot(index="layer", columns="head", values="value")
            vmax = 1.0 if metric == "first_token_mass" else None
            im = ax.imshow(m.values, aspect="auto", origin="lower", cmap=cmap, vmin=0, vmax=vmax,
                           interpolation="nearest")
            if metric == "first_token_mass":
                eps = float(rows["epsilon"].iloc[0])
                ys, xs = np.nonzero(m.values > eps)
                ax.scatter(xs, ys, s=6, c="red", marker="s", lw=0, label=f"sink (> {eps:g})")
                if len(xs):
                    ax.legend(loc="upper right", fontsize=6, framealpha=0.7)
            fig.colorbar(im, ax=ax, shrink=0.85)
            ax.set_title(f"{name}\n{label}" if j == 0 else label, fontsize=8)
            ax.set_xlabel("head", fontsize=8)
            if j == 0:
                ax.set_ylabel("layer", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    r = df.iloc[0]
    fig.suptitle(f"Attention per layer and head ({r['rows']} texts of {r['length']} tokens, {r['dataset']})"
                 f"{shown}", fontsize=10 if not shown else 8)
    return save(fig, path)


def entropy(df: pd.DataFrame, path: Path) -> Path | None:
    df = df[df["metric"] == "entropy"]
    if df.empty:
        return None
    groups = list(_groups(df))
    cols = min(2, len(groups))
    rows_n = (len(groups) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(WIDTH * (1 if cols == 1 else 1.4), 3.0 * rows_n),
                             squeeze=False, constrained_layout=True)
    for ax, (name, rows) in zip(axes.flat, groups, strict=False):
        layers = sorted(rows["layer"].unique())
        pick = sorted(set(np.linspace(0, len(layers) - 1, min(4, len(layers))).round().astype(int)))
        cmap = plt.get_cmap("viridis")
        for k, li in enumerate(pick):
            at = rows[rows["layer"] == layers[li]]
            x = (at["position_start"] + at["position_end"]) / 2
            c = cmap(k / max(len(pick) - 1, 1))
            ax.plot(x, at["value"], "-o", ms=2.5, color=c, label=f"layer {layers[li]}")
            ax.fill_between(x, at["ci_low"], at["ci_high"], color=c, alpha=0.2, lw=0)
        at = rows[rows["layer"] == layers[0]]
        ax.plot((at["position_start"] + at["position_end"]) / 2, at["uniform_entropy"], ":", color="0.4",
                label="uniform attention")
        context = int(rows["context"].iloc[0])
        if context < int(rows["position_end"].max()):
            ax.axvline(context, color="0.3", ls="--", lw=1)
            ax.annotate(f"context {context}", (context, 0.02), xycoords=("data", "axes fraction"),
                        xytext=(3, 0), textcoords="offset points", fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("query position")
        ax.set_ylabel("entropy (nats)")
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.suptitle("Attention entropy by query position (mean over heads, 95 % interval over texts)",
                 fontsize=10)
    return save(fig, path)


MODEL_MARKERS = "osD^vP*X"


def distance(df: pd.DataFrame, path: Path) -> Path | None:
    """Attention mass per distance bin (mean over layers, heads and queries): decoders and
    encoders in panels of their own, one colour per condition (as in every figure), one marker
    per model. The bins double in width (0, 1, 2-3, 4-7, ...): the axis is log2 of distance,
    and the mass is per bin, not per token of distance."""
    df = df[df["head"] == -1]
    if df.empty:
        return None
    kinds = [(c, "decoders (causal)" if c else "encoders") for c in (True, False)
             if (df["causal"].astype(bool) == c).any()]
    fig, axes = plt.subplots(1, len(kinds), figsize=(WIDTH * (0.75 + 0.45 * len(kinds)), 3.8),
                             squeeze=False, constrained_layout=True, sharey=True)
    models = list(dict.fromkeys(df["model"]))
    for ax, (causal, title) in zip(axes[0], kinds, strict=True):
        names, seen = [], {}
        for name, rows in _groups(df[df["causal"].astype(bool) == causal]):
            prof = rows.groupby(["distance_low", "distance_high"], sort=True)["value"].mean().reset_index()
            r = rows.iloc[0]
            color = color_of(condition_label(r))
            style = ("-", "--", ":", "-.")[seen.get((r["model"], color), 0) % 4]  # two conditions, one colour
            seen[(r["model"], color)] = seen.get((r["model"], color), 0) + 1
            ax.plot(np.arange(len(prof)), prof["value"], marker=MODEL_MARKERS[models.index(r["model"]) % 8],
                    ms=4, lw=1.2, ls=style, color=color, label=name)
            bins = [f"{lo}" if hi - lo == 1 else f"{lo}-{hi - 1}" for lo, hi in
                    zip(prof["distance_low"], prof["distance_high"], strict=True)]
            names = bins if len(bins) > len(names) else names
        ax.set_xticks(np.arange(len(names)), names, rotation=45, fontsize=7)
        ax.set_xlabel("distance |query - key| (tokens; bins double in width: log2 scale)", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=6, title="colour: condition; marker: model", title_fontsize=6)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("attention mass in the bin\n(mean over layers, heads, queries)", fontsize=8)
    fig.suptitle("Attention-distance profile", fontsize=10)
    return save(fig, path)


def frequency(df: pd.DataFrame, path: Path) -> Path | None:
    if df.empty:
        return None
    groups = list(_groups(df))
    fig, axes = plt.subplots(1, len(groups), figsize=(min(WIDTH * 1.6, 3.4 * len(groups) + 0.6), 3.4),
                             squeeze=False, constrained_layout=True)
    for ax, (name, rows) in zip(axes.flat, groups, strict=True):
        m = rows.groupby(["layer", "pair"])["value"].mean().unstack("pair")
        im = ax.imshow(m.values, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest")
        fig.colorbar(im, ax=ax, shrink=0.85, label="mean |q| |k| of the pair")
        ax.set_xlabel("rotary pair (0 = highest frequency)")
        ax.set_ylabel("layer")
        ax.set_title(name, fontsize=9)
    fig.suptitle("Rotary frequency usage (Barbero et al.): query x key norm per pair, mean over heads",
                 fontsize=9)
    return save(fig, path)


def _pick(values, k: int = 4) -> list:
    values = sorted(values)
    return [values[i] for i in sorted(set(np.linspace(0, len(values) - 1, min(k, len(values))).round().astype(int)))]


def positional(df: pd.DataFrame, path: Path) -> Path | None:
    if df.empty:
        return None
    groups, shown = first_or_all(list(_groups(df)))
    cols = max(len(_pick(rows["layer"].unique())) for _, rows in groups)
    fig, axes = plt.subplots(len(groups), cols, figsize=(2.4 * cols + 0.8, 2.4 * len(groups) + 0.5),
                             squeeze=False, constrained_layout=True)
    for i, (name, rows) in enumerate(groups):
        pick = _pick(rows["layer"].unique())
        for j in range(cols):
            ax = axes[i, j]
            if j >= len(pick):
                ax.set_visible(False)
                continue
            layer = pick[j]
            at = rows[rows["layer"] == layer]
            sc = ax.scatter(at["pc1"], at["pc2"], c=at["position"], cmap="plasma", s=6)
            ax.set_title((f"{name}\n" if j == 0 else "") +
                         f"layer {layer} ({at['explained_pc1'].iloc[0]:.0%}, {at['explained_pc2'].iloc[0]:.0%})",
                         fontsize=7)
            ax.tick_params(labelsize=6)
            if j == 0:
                ax.set_ylabel("PC2", fontsize=7)
            ax.set_xlabel("PC1", fontsize=7)
        fig.colorbar(sc, ax=axes[i, len(pick) - 1], label="position", shrink=0.85)
    fig.suptitle("Positional vectors (Dong et al.): first two principal components "
                 f"(explained variance){shown.replace(' (', chr(10) + '(')}", fontsize=9)
    return save(fig, path)


def norms(positions: pd.DataFrame, probe: pd.DataFrame | None, path: Path) -> Path | None:
    df = positions[positions["metric"] == "hidden_norm"]
    if df.empty:
        return None
    groups, shown = first_or_all(list(_groups(df)))
    fig, axes = plt.subplots(len(groups), 2, figsize=(WIDTH * 1.4, 2.8 * len(groups) + 0.5),
                             squeeze=False, constrained_layout=True)
    for i, (name, rows) in enumerate(groups):
        ax = axes[i, 0]
        layers = sorted(rows["layer"].unique())
        cmap = plt.get_cmap("viridis")
        for k, layer in enumerate(layers):
            at = rows[rows["layer"] == layer]
            x = (at["position_start"] + at["position_end"]) / 2
            base = at["value"].iloc[-1] if at["value"].iloc[-1] else 1.0
            ax.plot(x, at["value"] / base, color=cmap(k / max(len(layers) - 1, 1)), lw=1,
                    label="embedding" if layer == 0 else (f"layer {layer}" if layer == layers[-1] else None))
        ratios = rows["value"] / rows.groupby("layer")["value"].transform("last")
        if ratios.max() / max(ratios.min(), 1e-12) > 5:  # a massive first token: a log axis
            ax.set_yscale("log")
        ax.set_xlabel("position")
        ax.set_ylabel("norm / norm at the last bucket")
        ax.set_title(f"{name}: hidden-state norm by position", fontsize=8)
        ax.legend(fontsize=6)
        ax = axes[i, 1]
        if probe is not None and not probe.empty:
            sel = probe
            for col in CONDITION:
                sel = sel[sel[col].astype(str) == str(rows.iloc[0][col])]
            for feats, marker in (("vector", "o"), ("norm", "s")):
                at = sel[(sel["metric"] == "probe_mae") & (sel["features"] == feats)]
                ax.errorbar(at["layer"], at["value"], yerr=[at["value"] - at["ci_low"], at["ci_high"] - at["value"]],
                            marker=marker, ms=3, lw=1, capsize=2,
                            label="whole vector" if feats == "vector" else "norm alone")
            if not sel.empty:
                ax.axhline(float(sel["chance_mae"].iloc[0]), color="0.4", ls=":", label="chance (mean position)")
            ax.set_xlabel("layer (0 = embedding)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel("position probe MAE (tokens)")
            ax.set_title("position probe: held-out error", fontsize=8)
            ax.legend(fontsize=6)
        else:
            ax.set_visible(False)
    fig.suptitle(f"Does position ride on the norm?{shown}", fontsize=10 if not shown else 8)
    return save(fig, path)


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    fig_dir = Path(fig_dir)

    def read(name):
        return pd.read_csv(csv_paths[name]) if name in csv_paths else None

    out = []
    attn, positions = read("attn"), read("attn_positions")
    if attn is not None:
        out.append(heads(attn, fig_dir / "attn_heads.png"))
    if positions is not None:
        out.append(entropy(positions, fig_dir / "attn_entropy.png"))
        out.append(norms(positions, read("attn_probe"), fig_dir / "attn_norms.png"))
    for name, fn in (("attn_distance", distance), ("attn_frequency", frequency),
                     ("attn_positional", positional)):
        df = read(name)
        if df is not None:
            out.append(fn(df, fig_dir / f"{name}.png"))
    return [p for p in out if p is not None]
