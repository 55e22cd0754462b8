"""One look for every figure: a colour per condition name, the same in every figure of a run
and in `pecli compare`, and one way to save.

    from pecli.plots.style import color_of, save
    ax.plot(x, y, color=color_of("zero"), label="zero")
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import matplotlib.pyplot as plt

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
}
_SPARE = ("#332288", "#117733", "#44AA99", "#88CCEE", "#DDCC77", "#AA4499", "#999933",
          "#661100", "#6699CC", "#888888")


def color_of(name: str) -> str:
    """The colour of a condition, by name: fixed for known names, else a stable hash pick."""
    key = str(name)
    if key in _FIXED:
        return _FIXED[key]
    digest = int(hashlib.sha256(key.encode()).hexdigest(), 16)
    return _SPARE[digest % len(_SPARE)]


def save(fig, path: Path, dpi: int = 150) -> Path:
    """Lay out, write and close a figure; the folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
