"""One look for every figure: a colour per condition name, the same in every figure of a run
and in `pecli compare`, titles that say what is plotted, interval bars, one way to save.

    from pecli.plots.style import color_of, save
    ax.plot(x, y, color=color_of("zero"), label="zero")
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

# Colour-blind-safe (Okabe-Ito, then Tol's muted): fixed for the names the study uses.
_FIXED = {
    "learned": "#000000",        # the model's own positions: the baseline, black
    "intact": "#000000",
    "zero": "#D55E00",
    "none": "#D55E00",
    "shuffle": "#0072B2",
    "reverse": "#009E73",
    "random": "#CC79A7",
    "sinusoidal": "#E69F00",
    "rope": "#56B4E9",
    "alibi": "#882255",
    "identity": "#D55E00",
    "unigram": "#888888",
}
_SPARE = ("#332288", "#117733", "#44AA99", "#88CCEE", "#DDCC77", "#AA4499", "#999933",
          "#661100", "#6699CC")
MARKERS = ("o", "s", "D", "^", "v", "P", "X")
WIDTH = 6.4  # inches: a figure of at most two panels side by side, readable when halved
LOG_SPAN = 30.0  # max / min beyond which a positive axis goes logarithmic


def color_of(name: str) -> str:
    """The colour of a condition, by name: fixed for known names, else a stable hash pick.
    `swap:MODEL`, `shift:K` and `toy-learned` / `lm-learned` take their kind's colour."""
    key = str(name)
    for prefix in ("lm-", "toy-", "train-lm:", "toy:"):
        key = key.removeprefix(prefix)
    if key in _FIXED:
        return _FIXED[key]
    digest = int(hashlib.sha256(key.encode()).hexdigest(), 16)
    return _SPARE[digest % len(_SPARE)]


def model_name(df: pd.DataFrame) -> str:
    """The model as the rows name it (the user's spelling), with `(random weights)` if so."""
    first = df.iloc[0]
    name = str(first.get("model", "?"))
    if str(first.get("random_init", "")).lower() == "true" and not name.startswith("random"):
        name += " (random weights)"
    return name


def title(df: pd.DataFrame, quantity: str, rows_word: str = "texts") -> str:
    """`QUANTITY\\nMODEL, DATASET/SPLIT, N texts`: what is plotted, of what, on what."""
    first = df.iloc[0]
    where = str(first.get("dataset", ""))
    if isinstance(first.get("split"), str) and first["split"]:
        where += f"/{first['split']}"
    rows = first.get("rows")
    sized = f", {int(rows):,} {rows_word}" if rows is not None and pd.notna(rows) else ""
    return f"{quantity}\n{model_name(df)}, {where}{sized}"


def wants_log(values) -> bool:
    """True when positive values span more than LOG_SPAN (a log axis helps only then)."""
    v = np.asarray(pd.to_numeric(pd.Series(values), errors="coerce").dropna(), dtype=float)
    v = v[v > 0]
    return len(v) > 1 and v.max() / v.min() > LOG_SPAN


def has_intervals(df: pd.DataFrame) -> bool:
    return {"ci_low", "ci_high"} <= set(df.columns) and df["ci_low"].notna().any()


def points(ax, x, rows: pd.DataFrame, color: str, label: str, marker: str = "o", **kw):
    """Values of `rows` as points at `x`, with interval bars from ci_low/ci_high when present."""
    y = rows["value"].to_numpy(dtype=float)
    if has_intervals(rows):
        lo = rows["ci_low"].to_numpy(dtype=float)
        hi = rows["ci_high"].to_numpy(dtype=float)
        err = np.vstack([np.clip(y - lo, 0, None), np.clip(hi - y, 0, None)])
        ax.errorbar(x, y, yerr=np.where(np.isnan(err), 0, err), fmt=marker, color=color,
                    label=label, capsize=2.5, ms=5, lw=1, **kw)
    else:
        ax.plot(x, y, marker, color=color, label=label, ms=5, **kw)


def interval_note(df: pd.DataFrame) -> str:
    """What the bars are, for a legend or caption line ('' when the table has none)."""
    return "bars: 95 % bootstrap interval over texts" if has_intervals(df) else ""


def save(fig, path: Path, dpi: int = 150) -> Path:
    """Lay out, write and close a figure; the folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path
