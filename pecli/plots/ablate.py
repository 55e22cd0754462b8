"""`pecli ablate` figures from the written CSVs (pandas + matplotlib only)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd


def _title(df: pd.DataFrame) -> str:
    first = df.iloc[0]
    return f"{first['model']} on {first['dataset']}/{first['split']} ({first['rows']} texts)"


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def cosine_by_layer(main: pd.DataFrame, path: Path) -> Path:
    """Mean cosine (all real tokens) at each layer, one line per intervention, ±1 std band."""
    sel = main[(main["special_tokens"] == "included")]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, group in sel.groupby("intervention", sort=False):
        mean = group[group["metric"] == "cosine_mean"].set_index("layer")["value"].sort_index()
        std = group[group["metric"] == "cosine_std"].set_index("layer")["value"].reindex(mean.index)
        ax.plot(mean.index, mean.values, marker="o", label=name)
        ax.fill_between(mean.index, mean - std, mean + std, alpha=0.15)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("layer (0 = embedding output)")
    ax.set_ylabel("cosine with the model's own positions")
    ax.set_title(_title(main), fontsize=10)
    ax.legend(title="intervention", fontsize=8)
    return _save(fig, path)


def cosine_by_position(pos: pd.DataFrame, path: Path) -> Path:
    """Mean final-layer cosine at each position index; token counts on a second axis."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, group in pos.groupby("intervention", sort=False):
        g = group.sort_values("position")
        ax.plot(g["position"], g["value"], lw=1, label=name)
    counts = pos.drop_duplicates("position").sort_values("position")
    twin = ax.twinx()
    twin.fill_between(counts["position"], counts["tokens"], color="grey", alpha=0.15, step="mid")
    twin.set_ylabel("tokens at this position", color="grey")
    ax.set_zorder(twin.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.set_xlabel("position index in the text")
    ax.set_ylabel("mean cosine (final layer)")
    ax.set_title(_title(pos), fontsize=10)
    ax.legend(title="intervention", fontsize=8)
    return _save(fig, path)


def random_baseline(main: pd.DataFrame, rand: pd.DataFrame, path: Path) -> Path:
    """Histogram of random-pair cosines with each intervention's observed mean marked."""
    hist = rand[rand["metric"] == "random_cosine_hist_count"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.bar(hist["bin_left"], hist["value"], width=hist["bin_right"] - hist["bin_left"],
           align="edge", color="tab:blue", alpha=0.7,
           label=f"{int(hist['pairs'].iloc[0])} random pairs, d = {int(hist['dim'].iloc[0])}")
    final = main[(main["final_layer"]) & (main["special_tokens"] == "included")]
    zs = []
    for i, (name, group) in enumerate(final.groupby("intervention", sort=False)):
        observed = group.loc[group["metric"] == "cosine_mean", "value"].iloc[0]
        z = group.loc[group["metric"] == "z_score", "value"].iloc[0]
        ax.axvline(observed, color=f"C{i + 1}", lw=2, label=f"{name}: {observed:.4f} (z = {z:.1f})")
        zs.append(f"{name} z = {z:.1f}")
    ax.set_xlabel("cosine similarity")
    ax.set_ylabel("random pairs")
    ax.set_title(f"{_title(main)}\nobserved mean cosine vs random baseline: {', '.join(zs)}",
                 fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


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
