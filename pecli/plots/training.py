"""Figures of the training experiments (toy, train-lm), from their CSVs: pandas + matplotlib only."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from pecli.plots.style import (  # noqa: E402
    MARKERS,
    WIDTH,
    band_note,
    color_of,
    interval_note,
    points,
    save,
    wants_log,
)

SCHEME_ORDER = ("learned", "sinusoidal", "none", "rope", "alibi", "t5", "randomized", "p-rope")


def _ordered(schemes) -> list[str]:
    present = list(dict.fromkeys(schemes))
    return [s for s in SCHEME_ORDER if s in present] + [s for s in present if s not in SCHEME_ORDER]


def toy_accuracy(csv: Path, out: Path, by_seed: Path | None = None) -> Path:
    """Exact match per scheme (points in the scheme's colour, bars its interval), one marker
    per operation; with several training seeds (`by_seed`) the mean over them, each seed's
    own exact match a small grey dot beside it."""
    df = pd.read_csv(csv)
    acc = df[df.metric == "exact_match"]
    secs = df[df.metric == "train_seconds"].set_index("pe")["value"]
    seeds = pd.read_csv(by_seed).query("metric == 'exact_match'") if by_seed is not None else None
    schemes = _ordered(acc.pe)
    ops = [o for o in ("all", "add", "sub") if o in set(acc.operation)]
    names = {"all": "all test sums", "add": "i+j only", "sub": "i-j only"}
    n_seeds = int(acc["seeds"].max()) if "seeds" in acc else 1
    fig, ax = plt.subplots(figsize=(WIDTH, 3.8), layout="constrained")
    for k, op in enumerate(ops):
        rows = acc[acc.operation == op].set_index("pe").reindex(schemes)
        x = np.arange(len(schemes)) + (k - (len(ops) - 1) / 2) * 0.22
        for xi, scheme in zip(x, schemes, strict=True):
            points(ax, [xi], rows.loc[[scheme]], color_of(scheme), None, marker=MARKERS[k])
            if seeds is not None and n_seeds > 1:
                own = seeds[(seeds.pe == scheme) & (seeds.operation == op)]["value"]
                ax.plot([xi + 0.07] * len(own), own, ".", color="0.55", ms=3, zorder=1)
        ax.plot([], [], MARKERS[k], color="0.3", label=names[op])  # marker legend only
    if seeds is not None and n_seeds > 1:
        ax.plot([], [], ".", color="0.55", ms=3, label="one training seed")
    ax.set_xticks(range(len(schemes)),
                  [f"{s}\n({secs.get(s, float('nan')):.0f} s {'each' if n_seeds > 1 else 'training'})"
                   for s in schemes])
    first = acc.iloc[0]
    over = (f"mean of {n_seeds} training seeds (bars: 95 % interval, seeds and sums resampled)"
            if n_seeds > 1 else "one training seed (bars: 95 % Wilson interval over the sums)")
    return _finished(fig, ax, out, 1.02, "exact match on held-out sums", "position scheme",
                     f"toy arithmetic: exact match per position scheme\n{first['dataset']}, "
                     f"{int(first['rows']):,} held-out sums; {int(first['layers'])} layers x "
                     f"{int(first['width'])}, {int(first['steps'])} steps\n{over}",
                     title_size=10, legend={"fontsize": 8, "loc": "lower left"})


def _finished(fig, ax, out: Path, top: float, ylabel: str, xlabel: str, title: str, *,
              title_size: float, legend: dict) -> Path:
    """A per-scheme points figure's axes (y from 0 to `top`), title, legend and grid; saved."""
    ax.set_ylim(0, top)
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=title_size)
    ax.legend(**legend)
    ax.grid(axis="y", color="0.9", lw=0.6)
    return save(fig, out)


def toy_attention(csv: Path, out: Path, layer: int | None = None) -> Path:
    """Head-mean attention on the probe per scheme, in the first attention layer unless
    `layer` is given (layer 0 is the embedding output, so that is layer 1); of the first
    training seed's models where there are several."""
    df = pd.read_csv(csv, keep_default_na=False)
    df["seed"] = pd.to_numeric(df["seed"])
    several = df["seed"].nunique() > 1
    df = df[df["seed"] == df["seed"].min()]
    df["layer"] = pd.to_numeric(df["layer"])
    layer = int(df["layer"].min()) if layer is None else layer
    att = df[(df.metric == "attention") & (df["head"].astype(str) == "mean") & (df.layer == layer)]
    first = df[df.layer == layer]
    gaps = first[first.metric == "shared_key_row_gap"].set_index("pe")["value"]
    key_gaps = first[first.metric == "repeat_key_gap"].set_index("pe")["value"]
    schemes = _ordered(att.pe)
    cols = min(len(schemes), 3)
    rows = -(-len(schemes) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(WIDTH, 2.15 * rows + 0.8), squeeze=False,
                             layout="constrained")
    for ax, scheme in zip(axes.ravel(), schemes, strict=False):
        sub = att[att.pe == scheme]
        n = int(sub.query_pos.max()) + 1
        grid = np.full((n, n), np.nan)
        grid[sub.query_pos.astype(int), sub.key_pos.astype(int)] = sub.value.astype(float)
        labels = sub.sort_values("query_pos").drop_duplicates("query_pos")["query_token"].tolist()
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis")
        ax.set_xticks(range(n), labels, fontsize=7, rotation=90)
        ax.set_yticks(range(n), labels, fontsize=7)
        ax.set_xlabel("key", fontsize=8)
        ax.set_ylabel("query", fontsize=8)
        ax.set_title(f"{scheme}\nrow gap {gaps.get(scheme, float('nan')):.2g}, "
                     f"key gap {key_gaps.get(scheme, float('nan')):.2g}", fontsize=8)
    for ax in axes.ravel()[len(schemes):]:
        ax.axis("off")
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight (head mean)")
    probe = att["probe"].iloc[0]
    seed = f" (training seed {int(df['seed'].iloc[0])})" if several else ""
    fig.suptitle(f"layer {layer} attention on the probe {probe!r}, per position scheme{seed}\n"
                 "row gap: how differently two copies of a token attend; "
                 "key gap: how differently a query weighs them", fontsize=9)
    return save(fig, out)


def lm_curve(csv: Path, out: Path, perplexity_csv: Path | None = None) -> Path:
    """Train and held-out loss against steps per scheme; the unigram's test NLL as a line."""
    import math

    df = pd.read_csv(csv)
    fig, ax = plt.subplots(figsize=(WIDTH, 3.8), layout="constrained")
    for scheme in _ordered(df.pe):
        sub = df[df.pe == scheme].groupby(["metric", "step"], as_index=False)["value"].mean()
        ev = sub[sub.metric == "eval_loss"]  # mean over training seeds
        tr = sub[sub.metric == "train_loss"]
        ax.plot(ev.step, ev.value, marker=".", color=color_of(scheme), label=f"{scheme}: held-out")
        ax.plot(tr.step, tr.value, ls=":", marker="x", ms=3, color=color_of(scheme),
                label=f"{scheme}: train")
    if perplexity_csv is not None and Path(perplexity_csv).exists():
        ppl = pd.read_csv(perplexity_csv)
        for base, ls in (("unigram", "--"), ("bigram", "-.")):
            row = ppl[(ppl.model == base) & (ppl.metric == "test_perplexity")]
            if len(row):
                ax.axhline(math.log(row.value.iloc[0]), color=color_of(base), ls=ls,
                           label=f"{base} (test)")
    steps = sorted(df.step.unique())
    if len(steps) == 1:  # one point: an axis around it, not from step - 1 to step + 1
        ax.set_xlim(0, steps[0] * 1.15)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("loss (nats per token)")
    held_out = df[df.metric == "eval_loss"].iloc[0]  # a train_loss row names the training data
    ax.set_title(f"small causal LMs on {held_out['dataset']} per position scheme: loss by step\n"
                 f"{int(held_out['layers'])} layers x {int(held_out['width'])}, context "
                 f"{int(held_out['context'])}, {held_out['tokenizer']} tokenizer "
                 f"({int(held_out['vocab_size'])}); held-out: {int(held_out['rows'])} test reviews",
                 fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return save(fig, out)


def lm_perplexity(csv: Path, out: Path) -> Path:
    """Test perplexity per scheme and the unigram baseline: points on a linear axis (the
    values are of one order of magnitude), interval bars when the table has them."""
    df = pd.read_csv(csv)
    ppl = df[df.metric == "test_perplexity"]
    baselines = [b for b in ("unigram", "bigram") if b in set(ppl.model)]
    names = baselines + [f"lm-{s}" for s in _ordered(ppl[~ppl.model.isin(baselines)].pe)]
    vals = ppl.set_index("model").reindex(names)
    fig, ax = plt.subplots(figsize=(WIDTH, 3.2), layout="constrained")
    for i, name in enumerate(names):
        points(ax, [i], vals.loc[[name]], color_of(name), None)
        ax.annotate(f"{vals.loc[name, 'value']:.0f}", (i, vals.loc[name, "value"]),
                    textcoords="offset points", xytext=(7, -3), fontsize=8)
    ax.set_xticks(range(len(names)), [n.removeprefix("lm-") for n in names])
    if wants_log(vals["value"]):
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, vals["value"].max() * 1.12)
    ax.set_ylabel("test perplexity")
    ax.set_xlabel("position scheme (unigram, bigram: counts only)")
    first = ppl[~ppl.model.isin(baselines)].iloc[0]
    ax.set_title(f"small causal LMs: test perplexity per position scheme\n{first['dataset']}/"
                 f"{first['split']}, {int(first['rows'])} reviews, {int(first['tokens']):,} "
                 f"scored tokens; {int(first['steps'])} steps" + (f"; {interval_note(ppl)}"
                                                                  if interval_note(ppl) else ""),
                 fontsize=9)
    ax.grid(axis="y", color="0.9", lw=0.6)
    return save(fig, out)


def toy_length(csv: Path, out: Path) -> Path:
    """Exact match against test length, one panel per task: each scheme's mean over training
    seeds with its interval as a band; the training lengths shaded, N marked."""
    df = pd.read_csv(csv)
    acc = df[df.metric == "exact_match"]
    tasks = list(dict.fromkeys(acc.task))
    schemes = _ordered(acc.pe)
    cols = min(len(tasks), 2)
    rows = -(-len(tasks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(WIDTH * 1.25, 2.7 * rows + 1.0), squeeze=False,
                             sharey=True, layout="constrained")
    n_train = int(acc.train_length.iloc[0])
    for ax, task in zip(axes.ravel(), tasks, strict=False):
        sub = acc[acc.task == task]
        for k, scheme in enumerate(schemes):
            r = sub[sub.pe == scheme].sort_values("test_length")
            ax.plot(r.test_length, r.value, marker=MARKERS[k % len(MARKERS)], ms=3.5,
                    color=color_of(scheme), label=scheme, lw=1.3)
            if "ci_low" in r and r.ci_low.notna().any():
                ax.fill_between(r.test_length, r.ci_low.clip(0, 1), r.ci_high.clip(0, 1),
                                color=color_of(scheme), alpha=0.12, lw=0)
        ax.axvspan(0, n_train, color="0.93", zorder=0)
        ax.axvline(n_train, color="0.4", ls="--", lw=0.9)
        ax.text(n_train, 1.03, f" N = {n_train}", fontsize=7, color="0.3", va="bottom")
        ax.set_xlim(0, sub.test_length.max() + 1)
        ax.set_ylim(-0.03, 1.1)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("test length (digits per input)", fontsize=8)
        ax.grid(color="0.92", lw=0.6)
    for ax in axes[:, 0]:
        ax.set_ylabel("exact match (greedy)", fontsize=8)
    for ax in axes.ravel()[len(tasks):]:
        ax.axis("off")
    handles, labels = axes.ravel()[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=8, title="scheme",
               title_fontsize=8)
    first = acc.iloc[0]
    fig.suptitle(f"train short (lengths 1-{n_train}, shaded), test long: exact match by length\n"
                 f"mean of {int(first['seeds'])} training seeds, {band_note(acc)}; "
                 f"{int(first['layers'])} layers x {int(first['width'])}, {int(first['steps'])} steps, "
                 f"{int(first['rows'])} test items per length", fontsize=9)
    return save(fig, out)


def toy_length_ranking(csv: Path, out: Path) -> Path:
    """Exact match past the training length per scheme (mean over tasks and training seeds,
    with its interval), in a fixed order: not ranked, since a ranking of schemes whose
    intervals overlap ranks noise (the table's MRR column keeps Kazemnejad et al.'s ranking)."""
    df = pd.read_csv(csv)
    past = df[df.metric == "exact_match_past_train_length"].set_index("pe")
    schemes = _ordered(past.index)
    fig, ax = plt.subplots(figsize=(WIDTH, 3.3), layout="constrained")
    for i, scheme in enumerate(schemes):
        row = past.loc[[scheme]].assign(ci_low=lambda r: r.ci_low.clip(0, 1),  # a t interval can leave [0, 1]
                                        ci_high=lambda r: r.ci_high.clip(0, 1))
        points(ax, [i], row, color_of(scheme), None)
    ax.plot([], [], "o", color="0.3", label="mean; " + band_note(past).replace("band:", "bar:"))
    ax.set_xticks(range(len(schemes)), schemes, fontsize=8)
    first = df.iloc[0]
    return _finished(fig, ax, out, 1.05, f"exact match past N = {int(first['train_length'])}",
                     "position scheme (a fixed order, not a ranking)",
                     f"train short, test long: tasks {first['tasks']}, mean over tasks and "
                     f"{int(first['seeds'])} seeds\n(no ranking: schemes whose intervals "
                     "overlap are not ordered by this run)",
                     title_size=9, legend={"fontsize": 7, "loc": "upper right"})


def toy_length_attention(csv: Path, out: Path) -> Path:
    """Mean attention distance per scheme and layer at the longest test length, one panel per
    task (pecli.measures.attention's statistic; interval over training seeds)."""
    df = pd.read_csv(csv)
    att = df[df.metric == "attention_mean_distance"]
    tasks = list(dict.fromkeys(att.task))
    schemes = _ordered(att.pe)
    layers = sorted(att.layer.unique())
    fig, axes = plt.subplots(1, len(tasks), figsize=(WIDTH * 1.25, 3.3), squeeze=False,
                             sharey=True, layout="constrained")
    for ax, task in zip(axes[0], tasks, strict=True):
        sub = att[att.task == task]
        for k, layer in enumerate(layers):
            for i, scheme in enumerate(schemes):
                r = sub[(sub.pe == scheme) & (sub.layer == layer)]
                if len(r):
                    points(ax, [i + (k - (len(layers) - 1) / 2) * 0.25], r, color_of(scheme), None,
                           marker=MARKERS[k % len(MARKERS)])
        ax.set_xticks(range(len(schemes)), schemes, rotation=60, fontsize=7)
        ax.set_title(task, fontsize=9)
        ax.grid(axis="y", color="0.9", lw=0.6)
    for k, layer in enumerate(layers):
        axes[0, 0].plot([], [], MARKERS[k % len(MARKERS)], color="0.3", label=f"layer {layer}")
    axes[0, 0].legend(fontsize=7)
    axes[0, 0].set_ylabel("mean attention distance (tokens)", fontsize=8)
    first = att.iloc[0]
    fig.suptitle(f"how far the trained models attend, at test length {int(first['test_length'])} "
                 f"(trained on 1-{int(first['train_length'])})\nhead mean over {int(first['rows'])} "
                 f"test sequences; mean of {int(first['seeds'])} training seeds, 95 % t interval",
                 fontsize=9)
    return save(fig, out)


def toy_length_map(csv: Path, out: Path) -> Path:
    """The seed's question at a length never trained on: the probe's attention (head mean)
    from every query at or after "=" to every key, one panel per scheme (columns) and layer
    (rows); keys on the x axis, labelled with their tokens, the operands' digits numbered."""
    df = pd.read_csv(csv)
    schemes = _ordered(df.pe)
    layers = sorted(df.layer.unique())
    first = df.iloc[0]
    keys = df.drop_duplicates("key").sort_values("key")
    queries = df.drop_duplicates("query").sort_values("query")
    # the operand length: keys <bos> L + L "=" answer <eos>; queries "=" answer <eos>
    digits = (len(keys) - len(queries) - 2) // 2
    vmax = float(df.value.max())  # one colour scale for every panel

    def label(k: int, token: str) -> str:  # 1-based digit place inside each operand
        if 1 <= k <= digits:
            return f"{token}{k}"
        if digits + 2 <= k <= 2 * digits + 1:
            return f"{token}{k - digits - 1}"
        return token

    width = max(WIDTH, 1.9 * len(schemes))
    fig, axes = plt.subplots(len(layers), len(schemes), figsize=(width, 1.9 * len(layers) + 0.9),
                             squeeze=False, layout="constrained")
    image = None
    for row, layer in enumerate(layers):
        for col, scheme in enumerate(schemes):
            ax = axes[row, col]
            sub = df[(df.pe == scheme) & (df.layer == layer)]
            grid = sub.pivot(index="query", columns="key", values="value").reindex(
                index=queries["query"], columns=keys["key"])  # NaN: keys a query cannot see
            image = ax.imshow(grid.to_numpy(), vmin=0, vmax=vmax, cmap="viridis", aspect="auto",
                              interpolation="nearest")
            ax.set_xticks(range(len(keys)), [label(k, t) for k, t in zip(keys["key"], keys["key_token"],
                                                                         strict=True)],
                          fontsize=4, rotation=90)
            ax.set_yticks(range(len(queries)), list(queries["query_token"]), fontsize=4)
            if row == 0:
                ax.set_title(scheme, fontsize=8)
            if col == 0:
                ax.set_ylabel(f"layer {layer}: query", fontsize=7)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="attention (head mean)")
    fig.suptitle(f"the seed's question at {digits} digits (trained on 1-{int(first['train_length'])}): "
                 f"{first['probe']} teacher-forced, first training seed\n"
                 "does the answer's k-th digit find the operands' k-th 1s? (x: keys, operand "
                 "digits numbered by place, units first; y: queries from '=' on)", fontsize=8)
    return save(fig, out)


def toy_length_figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    """toy-length's figures from its written tables (accuracy, ranking, attention_map)."""
    out = []
    if "attention_map" in csv_paths:
        out.append(toy_length_map(csv_paths["attention_map"], fig_dir / "toy_length_map.png"))
    if "accuracy" in csv_paths:
        out.append(toy_length(csv_paths["accuracy"], fig_dir / "toy_length.png"))
        out.append(toy_length_attention(csv_paths["accuracy"], fig_dir / "toy_length_attention.png"))
    if "ranking" in csv_paths:
        out.append(toy_length_ranking(csv_paths["ranking"], fig_dir / "toy_length_ranking.png"))
    return out


def lm_positions(csv: Path, out: Path) -> Path:
    """`pecli perplexity` on each trained checkpoint: intact against positions removed (zero),
    mean over training seeds with its interval."""
    df = pd.read_csv(csv)
    schemes = _ordered(df.pe)
    fig, ax = plt.subplots(figsize=(WIDTH, 3.2), layout="constrained")
    for i, scheme in enumerate(schemes):
        sub = df[df.pe == scheme]
        for k, (cond, shift) in enumerate((("intact", -0.12), ("zero", 0.12))):
            rows = sub[(sub.intervention.astype(str) == "zero") == (cond == "zero")]
            if len(rows):
                points(ax, [i + shift], rows.iloc[[0]], color_of(scheme), None, marker=MARKERS[k],
                       mfc="white" if cond == "zero" else None)
    ax.plot([], [], MARKERS[0], color="0.3", label="intact")
    ax.plot([], [], MARKERS[1], mfc="white", color="0.3", label="positions removed (zero)")
    ax.set_xticks(range(len(schemes)), schemes)
    if wants_log(df["value"]):
        ax.set_yscale("log")
    ax.set_ylabel("IMDB test perplexity (corpus)")
    ax.set_xlabel("position scheme the model was trained with")
    first = df.iloc[0]
    ax.set_title("does the model use its positions? pecli perplexity, intact vs zero\n"
                 f"{int(first['rows'])} test reviews, each truncated to the positions trained; "
                 f"mean of {int(first['seeds'])} training seeds, "
                 f"{interval_note(df).replace('bars: ', '') or 'no interval'}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", color="0.9", lw=0.6)
    return save(fig, out)


def toy_figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    """The toy experiment's figures from its written tables (accuracy, attention)."""
    out = []
    if "accuracy" in csv_paths:
        out.append(toy_accuracy(csv_paths["accuracy"], fig_dir / "toy_accuracy.png", csv_paths.get("by_seed")))
    if "attention" in csv_paths:
        out.append(toy_attention(csv_paths["attention"], fig_dir / "toy_attention.png"))
    return out


def train_lm_figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    """train-lm's figures from its written tables (curve, perplexity)."""
    out = []
    if "curve" in csv_paths:
        out.append(lm_curve(csv_paths["curve"], fig_dir / "train_lm_curve.png",
                            csv_paths.get("perplexity")))
    if "perplexity" in csv_paths:
        out.append(lm_perplexity(csv_paths["perplexity"], fig_dir / "train_lm_perplexity.png"))
    if "positions" in csv_paths:
        out.append(lm_positions(csv_paths["positions"], fig_dir / "train_lm_positions.png"))
    if "length" in csv_paths:  # train short, test long
        from pecli.plots.length import figures as length_figures

        out += length_figures({"length": csv_paths["length"]}, fig_dir)
    return out
