"""Figures of the training experiments (toy, train-lm), from their CSVs: pandas + matplotlib only."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

SCHEME_ORDER = ("learned", "sinusoidal", "none", "rope", "alibi")


def _ordered(schemes) -> list[str]:
    present = list(dict.fromkeys(schemes))
    return [s for s in SCHEME_ORDER if s in present] + [s for s in present if s not in SCHEME_ORDER]


def _save(fig, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def toy_accuracy(csv: Path, out: Path) -> Path:
    """Exact match per scheme, split by operation (+, -, all), with training time in the label."""
    df = pd.read_csv(csv)
    acc = df[df.metric == "exact_match"]
    secs = df[df.metric == "train_seconds"].set_index("pe")["value"]
    schemes = _ordered(acc.pe)
    ops = ["add", "sub", "all"]
    fig, ax = plt.subplots(figsize=(1.6 * len(schemes) + 2, 3.6))
    width = 0.8 / len(ops)
    for i, op in enumerate(ops):
        vals = acc[acc.operation == op].set_index("pe").reindex(schemes)["value"]
        ax.bar([x + (i - 1) * width for x in range(len(schemes))], vals, width, label=op)
    ax.set_xticks(range(len(schemes)))
    ax.set_xticklabels([f"{s}\n{secs.get(s, float('nan')):.0f} s" for s in schemes])
    ax.set_ylim(0, 1)
    ax.set_ylabel("exact match (test)")
    first = acc.iloc[0]
    ax.set_title(f"{first['dataset']}: {int(first['steps'])} steps, {int(first['layers'])}x"
                 f"{int(first['width'])}", fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, out)


def toy_attention(csv: Path, out: Path, layer: int = 0) -> Path:
    """Head-mean attention on the probe per scheme (layer `layer`, 0 = the first)."""
    df = pd.read_csv(csv, keep_default_na=False)
    att = df[(df.metric == "attention") & (df["head"].astype(str) == "mean")
             & (df.layer == layer)]
    first = df[df.layer == layer]
    gaps = first[first.metric == "shared_key_row_gap"].set_index("pe")["value"]
    key_gaps = first[first.metric == "repeat_key_gap"].set_index("pe")["value"]
    schemes = _ordered(att.pe)
    fig, axes = plt.subplots(1, len(schemes), figsize=(3.0 * len(schemes), 3.2), squeeze=False)
    for ax, scheme in zip(axes[0], schemes, strict=True):
        sub = att[att.pe == scheme]
        n = int(sub.query_pos.max()) + 1
        grid = [[float("nan")] * n for _ in range(n)]
        for r in sub.itertuples():
            grid[int(r.query_pos)][int(r.key_pos)] = r.value
        labels = sub.sort_values("query_pos").drop_duplicates("query_pos")["query_token"].tolist()
        ax.imshow(grid, vmin=0, vmax=1, cmap="viridis")
        ax.set_xticks(range(n))
        ax.set_xticklabels(labels, fontsize=7, rotation=90)
        ax.set_yticks(range(n))
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_title(f"{scheme}\nrow gap {gaps.get(scheme, float('nan')):.2g}, "
                     f"key gap {key_gaps.get(scheme, float('nan')):.2g}", fontsize=9)
    fig.suptitle(f"layer {layer + 1} attention (head mean) on {sub['probe'].iloc[0]!r}. Row gap: "
                 "repeated tokens' rows over shared keys; key gap: a query's weights on two copies",
                 fontsize=8)
    return _save(fig, out)


def lm_curve(csv: Path, out: Path, perplexity_csv: Path | None = None) -> Path:
    """Train and held-out loss against steps per scheme; the unigram's test NLL as a line."""
    import math

    df = pd.read_csv(csv)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for scheme in _ordered(df.pe):
        sub = df[df.pe == scheme]
        ev = sub[sub.metric == "eval_loss"]
        tr = sub[sub.metric == "train_loss"]
        line = ax.plot(ev.step, ev.value, marker=".", label=f"{scheme} (test slice)")[0]
        ax.plot(tr.step, tr.value, ls=":", color=line.get_color(), label=f"{scheme} (train)")
    if perplexity_csv is not None and Path(perplexity_csv).exists():
        ppl = pd.read_csv(perplexity_csv)
        uni = ppl[(ppl.model == "unigram") & (ppl.metric == "test_perplexity")]
        if len(uni):
            ax.axhline(math.log(uni.value.iloc[0]), color="grey", ls="--", label="unigram (test)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(f"IMDB LM, tokenizer {df.tokenizer.iloc[0]} ({int(df.vocab_size.iloc[0])})",
                 fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, out)


def lm_perplexity(csv: Path, out: Path) -> Path:
    """Test perplexity per scheme and the unigram baseline (log scale)."""
    df = pd.read_csv(csv)
    ppl = df[df.metric == "test_perplexity"]
    names = ["unigram"] + [f"lm-{s}" for s in _ordered(ppl[ppl.model != "unigram"].pe)]
    vals = ppl.set_index("model").reindex(names)["value"]
    fig, ax = plt.subplots(figsize=(1.2 * len(names) + 2, 3.4))
    bars = ax.bar(range(len(names)), vals, color=["grey"] + ["C0"] * (len(names) - 1))
    for bar, v in zip(bars, vals, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.0f}", ha="center", va="bottom",
                fontsize=8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([n.removeprefix("lm-") for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("IMDB test perplexity")
    return _save(fig, out)
