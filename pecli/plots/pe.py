"""Figures of `pe-sinusoidal` and `pe-probe`, from their CSVs (pandas + matplotlib only).

The 512 x 512 sinusoid heatmap is drawn from the closed form (numpy) with the base of
the table, since a CSV of 262,144 rows would only store that formula's values.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from pecli.plots.style import WIDTH, color_of, drawn, model_name, points, save  # noqa: E402
from pecli.positions.sinusoid import sinusoidal  # noqa: E402  (numpy only)


def _heatmap(ax, values: np.ndarray, title: str, xlabel: str, ylabel: str, **kw):
    im = ax.imshow(values, aspect="auto", interpolation="nearest", **kw)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return im


def encoding_heatmaps(encoding: pd.DataFrame, out: Path) -> Path:
    """The table's encoding (positions x dims) beside the 512 x 512 case of the same base."""
    base = float(encoding["base"].iloc[0])
    small = encoding.pivot(index="pos", columns="dim_index", values="value").to_numpy()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    im = _heatmap(axes[0], small, f"sinusoidal PE, {small.shape[0]} x {small.shape[1]}",
                  "dimension", "position", cmap="RdBu", vmin=-1, vmax=1)
    _heatmap(axes[1], sinusoidal(512, 512, base), "sinusoidal PE, 512 x 512", "dimension",
             "position", cmap="RdBu", vmin=-1, vmax=1)
    fig.colorbar(im, ax=axes, shrink=0.8, label="PE(pos, dim)")
    fig.suptitle(f"PE(pos, 2i) = sin(pos / {base:g}^(2i/d)), PE(pos, 2i+1) = cos(...)")
    return save(fig, out)


def clock(encoding: pd.DataFrame, out: Path) -> Path:
    """Chosen (sin, cos) pairs as points on the unit circle, one per position: a clock's hands."""
    pairs = sorted(encoding["pair"].unique())
    chosen = sorted({pairs[0], pairs[min(1, len(pairs) - 1)], pairs[len(pairs) // 4], pairs[-1]})
    fig, axes = plt.subplots(1, len(chosen), figsize=(3.4 * len(chosen), 3.6), squeeze=False,
                             layout="constrained")
    t = np.linspace(0, 2 * np.pi, 200)
    for ax, pair in zip(axes[0], chosen, strict=True):
        rows = encoding[encoding["pair"] == pair]
        sin = rows[rows["component"] == "sin"].sort_values("pos")
        cos = rows[rows["component"] == "cos"].sort_values("pos")
        ax.plot(np.cos(t), np.sin(t), color="0.85", lw=1)
        # x = cos, y = sin: the angle pos * w_i, counter-clockwise from (1, 0)
        sc = ax.scatter(cos["value"], sin["value"], c=sin["pos"], cmap="viridis", s=25, zorder=3)
        for p, x, y in zip(sin["pos"], cos["value"], sin["value"], strict=True):
            if p < 4 or p == sin["pos"].max():
                ax.annotate(str(p), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set(title=f"pair {pair} (dims {2 * pair}, {2 * pair + 1})", xlabel="cos", ylabel="sin",
               xlim=(-1.2, 1.2), ylim=(-1.2, 1.2), aspect="equal")
    fig.colorbar(sc, ax=axes[0].tolist(), label="position", shrink=0.8)
    fig.suptitle("each (sin, cos) pair turns with position: fast early pairs, slow late pairs")
    return save(fig, out)


def dot_and_rotation(dot: pd.DataFrame, rotation: pd.DataFrame, out: Path) -> Path:
    """PE(p).PE(q) against p - q (all pairs), and the rotation error per offset."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained")
    axes[0].scatter(dot["offset"], dot["value"], s=8, alpha=0.5)
    axes[0].set(title="PE(p) . PE(q): one value per p - q, symmetric, decaying",
                xlabel="p - q", ylabel="dot product")
    axes[0].axvline(0, color="0.8", lw=1)
    err = rotation.sort_values("offset")
    exact = err["value"] == 0  # log axis: exact zeros are named, not drawn at an invented floor
    axes[1].semilogy(err.loc[~exact, "offset"], err.loc[~exact, "value"], marker=".", ls="none",
                     label="max over positions p")
    if exact.any():
        ks = ", ".join(str(int(k)) for k in err.loc[exact, "offset"])
        axes[1].plot([], [], " ", label=f"exactly 0 at k = {ks}")
    axes[1].legend(fontsize=8)
    axes[1].set(title="max |PE(p + k) - M_k PE(p)| over positions", xlabel="offset k",
                ylabel="max abs error (float64)")
    first = dot.iloc[0]
    fig.suptitle(f"sinusoidal encoding, {int(first['positions'])} positions x {int(first['dim'])} "
                 f"dimensions, base {float(first['base']):g}: dot products and the rotation "
                 "property")
    return save(fig, out)


def sinusoidal_figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    """All figures of pe-sinusoidal."""
    fig_dir = Path(fig_dir)
    encoding = pd.read_csv(csv_paths["encoding"])
    return [
        encoding_heatmaps(encoding, fig_dir / "pe_sinusoidal_heatmap.png"),
        clock(encoding, fig_dir / "pe_sinusoidal_clock.png"),
        dot_and_rotation(pd.read_csv(csv_paths["dot"]), pd.read_csv(csv_paths["rotation"]),
                         fig_dir / "pe_sinusoidal_dot_rotation.png"),
    ]


def similarity_heatmaps(sim: pd.DataFrame, out: Path) -> Path:
    """Cosine similarity of position rows: one row of panels per model, learned | sinusoidal."""
    models = list(dict.fromkeys(sim["model"]))
    kinds = ["learned", "sinusoidal"]
    fig, axes = plt.subplots(len(models), 2, figsize=(9, 4 * len(models)), squeeze=False,
                             layout="constrained")
    for r, model in enumerate(models):
        for c, kind in enumerate(kinds):
            part = sim[(sim["model"] == model) & (sim["matrix"] == kind)]
            ax = axes[r][c]
            if part.empty:
                ax.axis("off")
                continue
            grid = part.pivot(index="pos_p", columns="pos_q", values="value")
            n = grid.index.max()
            im = ax.imshow(grid.to_numpy(), cmap="RdBu", vmin=-1, vmax=1, origin="upper",
                           extent=(0, n, n, 0), interpolation="nearest")
            step = int(grid.index[1] - grid.index[0]) if len(grid) > 1 else 1
            ax.set(title=f"{model}: {kind}" + (" (reference)" if kind == "sinusoidal" else ""),
                   xlabel="position q" + (f" (every {step} positions shown)" if step > 1 else ""),
                   ylabel="position p")
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, label="cosine similarity")
    fig.suptitle("cosine similarity of position-embedding rows p and q: each model's learned "
                 "table beside sinusoids of the same shape")
    return save(fig, out)


def probe_layers(hidden: pd.DataFrame, out: Path) -> Path:
    """Probe MAE per layer, one panel per model, one line per intervention, chance dashed."""
    models = list(dict.fromkeys(hidden["model"]))
    cols = min(len(models), 2)
    rows = -(-len(models) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(WIDTH, 2.9 * rows + 0.6), squeeze=False,
                             layout="constrained")
    for ax, model in zip(axes.ravel(), models, strict=False):
        part = hidden[hidden["model"] == model]
        for iv, group in part.groupby("intervention", sort=False):
            mae = group[group["metric"] == "probe_mae"].sort_values("layer")
            ax.plot(mae["layer"], mae["value"], color=color_of(iv), lw=1)
            points(ax, mae["layer"], mae, color_of(iv), f"positions: {iv}", marker=".")
        # Same tokens and folds under every intervention, so one chance line per model.
        chance = part[part["metric"] == "probe_chance_mae"].groupby("layer")["value"].mean()
        ax.plot(chance.index, chance.to_numpy(), ls="--", color="0.5", label="chance (mean position)")
        note = part["note"].fillna("").iloc[0]
        ax.set_title(model_name(part) + (" (rotary: 'zero' = identity rotation)" if note else ""),
                     fontsize=9)
        ax.set(xlabel="layer (0 = embedding output)", ylabel="probe MAE (positions)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    for ax in axes.ravel()[len(models):]:
        ax.axis("off")
    first = hidden.iloc[0]
    fig.suptitle(f"linear probe of each token's position from hidden states, mean absolute error "
                 f"(held-out texts)\n{first['dataset']}/{first['split']}, {int(first['rows'])} texts "
                 f"per model", fontsize=10)
    return save(fig, out)


def matrix_points(matrix: pd.DataFrame, out: Path) -> Path:
    """Wang & Chen's two probes of a position table, per model: the learned rows beside
    sinusoids of the same shape, chance as a dashed tick."""
    models = list(dict.fromkeys(matrix["model"]))
    kinds = list(dict.fromkeys(matrix["matrix"]))
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 3.4), layout="constrained")
    panels = [(axes[0], "regression_mae", "regression_chance_mae",
               "predict a row's index (linear regression)", "MAE (positions; lower is better)"),
              (axes[1], "order_accuracy", "order_chance_accuracy",
               "which of two rows comes first", "accuracy (higher is better)")]
    for ax, metric, chance, name, ylabel in panels:
        for k, kind in enumerate(kinds):
            part = matrix[(matrix["metric"] == metric) & (matrix["matrix"] == kind)]
            part = part.set_index("model").reindex(models).dropna(subset=["value"])
            x = np.array([models.index(m) for m in part.index]) + (k - (len(kinds) - 1) / 2) * 0.25
            label = "model's own rows" if kind == "learned" else f"{kind} rows of the same shape"
            points(ax, x, part.reset_index(), color_of(kind), label)
        ref = matrix[matrix["metric"] == chance].groupby("model")["value"].first()
        for i, model in enumerate(models):
            ax.hlines(ref[model], i - 0.35, i + 0.35, colors="0.4", linestyles="--", lw=1,
                      label="chance" if i == 0 else None)
        ax.set_xticks(range(len(models)), models, fontsize=7, rotation=15)
        ax.set_ylim(bottom=0, top=1.05 if metric == "order_accuracy" else None)
        ax.set(title=name, ylabel=ylabel)
        ax.title.set_fontsize(9)
    axes[1].legend(fontsize=7, loc="lower right")
    sizes = matrix.drop_duplicates("model")
    fig.suptitle(f"what a position embedding table encodes (Wang & Chen 2020), {folds_label(matrix)} CV over rows\n"
                 + ", ".join(f"{m}: {int(p)} x {int(d)}" for m, p, d in
                             zip(sizes["model"], sizes["positions"], sizes["dim"], strict=True)),
                 fontsize=9)
    return save(fig, out)


def probe_figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    """All figures of pe-probe (matrix figures only when some model has a learned table)."""
    return drawn(csv_paths, fig_dir, {"hidden": (probe_layers, "pe_probe_layers.png"),
                                      "similarity": (similarity_heatmaps, "pe_probe_similarity.png"),
                                      "matrix": (matrix_points, "pe_probe_matrix.png")})


def folds_label(df) -> str:
    """`4-fold` from the table's `folds` column (pe-probe before v3, pe-recover before v2: `k-fold`)."""
    return f"{int(df['folds'].iloc[0])}-fold" if "folds" in df else "k-fold"
