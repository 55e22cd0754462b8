"""Figures of `pe-recover`, from its CSVs (pandas + matplotlib only).

- token accuracy against position, one panel per model: the model's positions, the ceiling
  (no position), the random-rows and sinusoid controls, chance;
- the per-layer token-identity probe, with and without the model's positions.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from pecli.plots.pe import folds_label  # noqa: E402
from pecli.plots.style import color_of, drawn, save  # noqa: E402

LABELS = {"learned": "the model's positions added", "none": "no position (ceiling)",
          "random": "random rows, learned rows' scale", "sinusoidal": "sinusoid + Gaussian tokens"}
DASH = {"none": "--", "sinusoidal": "-.", "random": ":", "learned": "-"}


def _width(n: int) -> float:
    """Figure width for n panels: at least room for the two-line suptitle."""
    return max(4.8 * n, 8.5)


def _panels(n: int, height: float = 3.8):
    fig, axes = plt.subplots(1, n, figsize=(_width(n), height), squeeze=False, sharey=True,
                             layout="constrained")  # titles of two lines clear of the suptitle
    return fig, axes[0]


def _model_title(rows: pd.DataFrame) -> str:
    model = rows["model"].iloc[0]
    return f"{model} (random init)" if bool(rows["random_init"].iloc[0]) else model


def token_by_position(df: pd.DataFrame, out: Path) -> Path:
    """Row 1: accuracy on the full scale; row 2: the same curves zoomed to 0.9-1."""
    models = list(dict.fromkeys(df["model"]))
    fig, axes = plt.subplots(2, len(models), figsize=(_width(len(models)), 6.4), squeeze=False,
                             sharey="row", height_ratios=[3, 2])
    for col, model in enumerate(models):
        rows = df[df["model"] == model]
        for ax in axes[:, col]:
            for cond in ("none", "learned", "random", "sinusoidal"):
                r = rows[rows["condition"] == cond].sort_values("pos")
                if r.empty:
                    continue
                color = color_of(cond)
                ax.plot(r["pos"], r["value"], DASH[cond], color=color, lw=1.2, label=LABELS[cond])
                ax.fill_between(r["pos"], r["ci_low"], r["ci_high"], color=color, alpha=0.18, lw=0)
            ax.grid(alpha=0.3)
        axes[0, col].axhline(rows["chance_accuracy"].iloc[0], color="0.5", lw=0.8, ls=(0, (1, 3)),
                             label="chance (1 / vocabulary rows)")
        axes[0, col].set(ylim=(-0.03, 1.03))
        axes[0, col].set_title(f"{_model_title(rows)}: {rows['tokens_sampled'].iloc[0]} tokens x "
                               f"{rows['positions'].iloc[0]} positions", fontsize=9)
        axes[1, col].set(ylim=(0.9, 1.005), xlabel="position p")
    axes[0, 0].set_ylabel("token accuracy (nearest row, cosine)")
    axes[1, 0].set_ylabel("zoom: 0.9 to 1")
    axes[0, -1].legend(loc="center right", fontsize=8, title="bands: 95 % bootstrap over tokens",
                       title_fontsize=8)
    fig.suptitle("Token identity decoded from x = E_tok[v] + E_pos[p] (the model's own "
                 "normalisation),\nreal vocabulary, every position, with the ceiling and two controls",
                 fontsize=11)
    return save(fig, out)


def hidden_probe(df: pd.DataFrame, out: Path) -> Path:
    models = list(dict.fromkeys(df["model"]))
    fig, axes = _panels(len(models))
    for ax, model in zip(axes, models, strict=True):
        rows = df[df["model"] == model]
        for iv, label in [("intact", "with the model's positions"), ("zero", "position rows zeroed")]:
            r = rows[(rows["intervention"].replace({"learned": "intact"}) == iv)
                     & (rows["metric"] == "token_probe_accuracy")]
            r = r.sort_values("layer")
            ax.errorbar(r["layer"], r["value"], yerr=[r["value"] - r["ci_low"], r["ci_high"] - r["value"]],
                        color=color_of(iv), marker="o", ms=4, capsize=3, label=label)
        chance = rows[rows["metric"] == "token_probe_chance_accuracy"]
        ax.axhline(chance["value"].max(), color="0.5", lw=0.8, ls="--",
                   label="chance (most frequent class)")
        first = rows.iloc[0]
        ax.set(title=f"{_model_title(rows)}\n{first['rows']} {first['dataset']} texts, "
                     f"top {first['classes']} tokens ({first['probe_rows']} rows)",
               xlabel="layer (0 = embedding output)", ylim=(0, 1.03))
        ax.title.set_fontsize(9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out token accuracy (linear probe)")
    axes[-1].legend(loc="lower left", fontsize=8, title="bars: 95 % bootstrap over texts",
                    title_fontsize=8)
    fig.suptitle("Token identity read from each layer, with and without positions "
                 f"(ridge probe, {folds_label(df)} CV over texts)", fontsize=10)
    return save(fig, out)


def recover_figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    """All figures of a `pe-recover` run (none when every model was rotary)."""
    return drawn(csv_paths, fig_dir, {"by_position": (token_by_position, "pe_recover_token_by_position.png"),
                                      "hidden": (hidden_probe, "pe_recover_hidden_probe.png")})
