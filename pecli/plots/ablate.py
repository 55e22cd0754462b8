"""`pecli ablate` figures from the written CSVs (pandas + matplotlib only)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from pecli.plots.style import WIDTH, color_of, interval_note, points, save, title


def cosine_by_layer(main: pd.DataFrame, path: Path) -> Path:
    """Mean cosine (all real tokens) at each layer, one line per intervention; the shaded
    band is ±1 standard deviation over tokens, bars (when the table has them) the interval."""
    sel = main[main["special_tokens"] == "included"]
    fig, ax = plt.subplots(figsize=(WIDTH, 5.0), layout="constrained")
    for name, group in sel.groupby("intervention", sort=False):
        mean = group[group["metric"] == "cosine_mean"].set_index("layer").sort_index()
        std = group[group["metric"] == "cosine_std"].set_index("layer")["value"].reindex(mean.index)
        color = color_of(name)
        ax.plot(mean.index, mean["value"], color=color, lw=1.2)
        points(ax, mean.index, mean, color, f"{name}: mean")
        ax.fill_between(mean.index, mean["value"] - std, mean["value"] + std, color=color,
                        alpha=0.15, lw=0, label=f"{name}: ±1 s.d. over tokens")
    # In-model baselines (the model's own positions, same texts), when the table has them.
    for metric, ls, label in BASELINES:
        base = main[main["metric"] == metric].sort_values("layer")
        if len(base):
            ax.plot(base["layer"], base["value"], color="0.45", ls=ls, lw=1.2, label=label)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="1 = unchanged")
    layers = sorted(sel["layer"].unique())
    ax.set_xticks(layers if len(layers) <= 13 else layers[::max(1, -(-len(layers) // 12))])  # readable at column width
    ax.set_xlabel("layer (0 = embedding output)")
    ax.set_ylabel("cosine similarity of hidden states")
    ax.set_title(title(main, "mean hidden-state cosine with vs without the model's positions, per layer"),
                 fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=2, fontsize=8,
               title=interval_note(sel) or None, title_fontsize=8)
    return save(fig, path)


# The ablate table's in-model baselines: what "similar" means inside this model.
BASELINES = (("self_similarity_mean", "--", "baseline: the same token in another text"),
             ("token_pair_cosine_mean", "-.", "baseline: two different tokens (anisotropy floor)"))


FEW_TEXTS = 4  # per-position means over fewer texts are drawn dotted (no interval from so few)
NEAR_ONE = 1e-3  # every per-position cosine closer to 1 than this: plot 1 − cosine, log axis


def cosine_by_position(pos: pd.DataFrame, path: Path) -> Path:
    """Mean final-layer cosine at each position index; token counts shaded on a second axis."""
    fig, ax = plt.subplots(figsize=(WIDTH, 3.8), layout="constrained")
    # Cosines all within NEAR_ONE of 1 (a model that barely uses its positions) read as an
    # offset axis ("1e-5+9.999e-1"): plot the distance from 1 on a log axis instead.
    gap = 1.0 - pos["value"]
    near_one = bool(gap.max() < NEAR_ONE)
    few = False
    for name, group in pos.groupby("intervention", sort=False):
        g = group.sort_values("position")
        y = (1.0 - g["value"]).where(lambda d: d > 0) if near_one else g["value"]
        solid = g["tokens"] >= FEW_TEXTS  # a mean over 1-3 texts: faint, and said so
        ax.plot(g["position"], y.where(solid), lw=1, color=color_of(name),
                label=f"{name}: {'1 − mean cosine' if near_one else 'mean cosine'}")
        if (~solid).any():
            few = True
            ax.plot(g["position"], y.where(~solid | solid.shift(-1, fill_value=False)), lw=0.8,
                    ls=":", alpha=0.6, color=color_of(name))
    if near_one:
        ax.set_yscale("log")
    if few:
        ax.plot([], [], ":", color="0.4", lw=0.8, label=f"fewer than {FEW_TEXTS} texts reach it: dotted")
    counts = pos.drop_duplicates("position").sort_values("position")
    twin = ax.twinx()
    twin.fill_between(counts["position"], counts["tokens"], color="grey", alpha=0.15, step="mid",
                      label="texts reaching this position (right axis)")
    twin.set_ylabel("texts reaching this position", color="grey")
    ax.set_zorder(twin.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.set_xlabel("position index in the text (0 = first token)")
    layer = int(pos['layer'].max())
    ax.set_ylabel(f"1 − mean cosine, final layer ({layer}), log" if near_one
                  else f"mean cosine, final layer ({layer})")
    ax.set_title(title(pos, "final-layer cosine with vs without positions, per position"),
                 fontsize=10)
    handles = ax.get_legend_handles_labels()
    extra = twin.get_legend_handles_labels()
    ax.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=8)
    return save(fig, path)


def random_baseline(main: pd.DataFrame, rand: pd.DataFrame, path: Path) -> Path:
    """Histogram of random-pair cosines with each intervention's observed mean marked."""
    hist = rand[rand["metric"] == "random_cosine_hist_count"]
    fig, ax = plt.subplots(figsize=(WIDTH, 3.8), layout="constrained")
    ax.bar(hist["bin_left"], hist["value"], width=hist["bin_right"] - hist["bin_left"],
           align="edge", color="0.7",
           label=f"{int(hist['pairs'].iloc[0]):,} random pairs of {int(hist['dim'].iloc[0])}-d "
                 "normal vectors")
    final = main[(main["final_layer"]) & (main["special_tokens"] == "included")]
    marked: list[float] = []
    for name, group in final.groupby("intervention", sort=False):
        observed = group.loc[group["metric"] == "cosine_mean", "value"].iloc[0]
        z = group.loc[group["metric"] == "z_score", "value"].iloc[0]
        # A line drawn on one already there (both 1.0000) is dashed, so both stay visible.
        covers = any(abs(observed - m) < 0.004 for m in marked)
        ax.axvline(observed, color=color_of(name), lw=2, ls=(0, (4, 3)) if covers else "-",
                   label=f"{name}: observed mean {observed:.4f} (z = {z:.1f})")
        marked.append(observed)
    left, right = ax.get_xlim()
    ax.set_xlim(left, max(right, max(marked, default=right) + 0.03 * (right - left)))  # no line on the frame
    ax.set_xlabel("cosine similarity")
    ax.set_ylabel("random pairs per bin")
    ax.set_title(title(main, "final-layer mean cosine against the cosine of random vectors"),
                 fontsize=10)
    ax.legend(fontsize=8)
    return save(fig, path)


def ablate_figures(csv_paths: dict, fig_dir) -> list[Path]:
    """All ablate figures from the tables `ablate`, `ablate_positions`, `ablate_random`."""
    fig_dir = Path(fig_dir)
    main = pd.read_csv(csv_paths["ablate"])
    out = [cosine_by_layer(main, fig_dir / "ablate_layers.png")]
    if "ablate_positions" in csv_paths:
        out.append(cosine_by_position(pd.read_csv(csv_paths["ablate_positions"]),
                                      fig_dir / "ablate_positions.png"))
    if "ablate_random" in csv_paths:
        out.append(random_baseline(main, pd.read_csv(csv_paths["ablate_random"]),
                                   fig_dir / "ablate_random_baseline.png"))
    return out
