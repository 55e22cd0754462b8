"""One look for every figure: a colour per condition name, the same in every figure of a run
and in `pecli compare`, titles that say what is plotted, interval bars, one way to save.

    from pecli.plots.style import color_of, save
    ax.plot(x, y, color=color_of("zero"), label="zero")
    save(fig, fig_dir / "name.png")      # every format asked for: --format png,pdf,svg

Titles are "WHAT IS PLOTTED\nOF WHAT, ON WHAT" (`title`): with --short-titles, `save` keeps
the first line and writes the full titles (the provenance) to `<name>.json` beside the figure.
Which formats and whether short: `figure_output` (set once per command by pecli.cli).
"""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from pecli.positions.labels import remedy_method  # noqa: E402

plt.rcParams["svg.hashsalt"] = "pecli"  # stable element ids: the same SVG bytes on every run

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
    "t5": "#117733",
    "randomized": "#AA4499",
    "p-rope": "#332288",
    "identity": "#D55E00",
    "unigram": "#888888",
}
# Training-free remedies (docs/remedies.md), by method: `sinks:0:W` is window attention.
_METHODS = {"window": "#661100", "sinks": "#0072B2", "lminfinite": "#E69F00",
            "selfextend": "#CC79A7", "rerope": "#117733", "droplow": "#332288",
            "drophigh": "#AA4499"}
_SPARE = ("#332288", "#117733", "#44AA99", "#88CCEE", "#DDCC77", "#AA4499", "#999933",
          "#661100", "#6699CC")
MARKERS = ("o", "s", "D", "^", "v", "P", "X")
WIDTH = 6.4  # inches: a figure of at most two panels side by side, readable when halved
LOG_SPAN = 30.0  # max / min beyond which a positive axis goes logarithmic


def color_of(name: str) -> str:
    """The colour of a condition, by name: fixed for known names and the remedies' methods
    (`rerope:W` any W), else a stable hash pick. `toy-learned` / `lm-learned` take their
    kind's colour."""
    key = str(name)
    for prefix in ("lm-", "toy-", "train-lm:", "toy:"):
        key = key.removeprefix(prefix)
    if key in _FIXED:
        return _FIXED[key]
    method = remedy_method(key)  # None for per-layer variants: their own colour
    if method in _METHODS:
        return _METHODS[method]
    digest = int(hashlib.sha256(key.encode()).hexdigest(), 16)
    return _SPARE[digest % len(_SPARE)]


def model_name(df: pd.DataFrame) -> str:
    """The model as the rows name it (the user's spelling), with `(random weights)` if so."""
    first = df.iloc[0]
    name = str(first.get("model", "?"))
    if str(first.get("random_init", "")).lower() == "true" and not name.startswith("random"):
        name += " (random weights)"
    return name


def dtype_note(row) -> str:
    """`, bfloat16` for a title where the rows were computed in another dtype than float32."""
    dtype = str(row.get("dtype", "float32"))
    return "" if dtype == "float32" else f", {dtype}"


def data_label(row, word: str = "text") -> str:
    """`imdb/test, 20 texts`; a file by its name, without the split a file does not have
    (`mydoc.csv, 1 document`)."""
    dataset = str(row.get("dataset", "") or "")
    split = row.get("split")
    is_file = "/" in dataset or "." in Path(dataset).name
    where = Path(dataset).name if is_file else dataset
    if isinstance(split, str) and split and not (is_file and split in ("file", "train")):
        where += f"/{split}"
    rows = row.get("rows")
    if rows is None or not pd.notna(rows):
        return where
    n = int(rows)
    return f"{where}, {n:,} {word if n == 1 else word + 's'}"


def title(df: pd.DataFrame, quantity: str, rows_word: str = "texts") -> str:
    """`QUANTITY\nMODEL, DATASET/SPLIT, N texts`: what is plotted, of what, on what."""
    return f"{quantity}\n{model_name(df)}, {data_label(df.iloc[0], rows_word.removesuffix('s'))}"


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
    """What the bars are, for a legend or caption line ('' when the table has none): the
    table's own `interval` text where it names one, else pecli's bootstrap over texts."""
    if not has_intervals(df):
        return ""
    said = df["interval"].dropna().unique() if "interval" in df else ()
    if len(said) == 1 and ("two-level" in said[0] or "Student t" in said[0]):  # over seeds: in a few words
        return band_note(df).replace("band:", "bars:")
    return f"bars: {said[0]}" if len(said) == 1 else "bars: 95 % bootstrap interval over texts"


def band_note(rows: pd.DataFrame, units: str = "texts") -> str:
    """A band's interval over training seeds in a few words, from the rows' own `interval`
    (`units`: what the seeds were scored on, as the reader knows them)."""
    said = [s for s in rows["interval"].dropna().unique() if s] if "interval" in rows else []
    if len(said) != 1:
        return "band: 95 % interval (see the table's interval column)" if len(said) else "no band"
    if "two-level" in said[0]:
        return (f"band: 95 % bootstrap over seeds and the shared test {units}" if "once for all" in said[0]
                else "band: 95 % bootstrap over seeds, then test items within each")
    return "band: 95 % t interval over seeds" if "Student t" in said[0] else f"band: {said[0]}"


from pecli.runs.names import FIGURE_FORMATS as FORMATS  # noqa: E402, F401 (what save may write)
from pecli.runs.names import parse_formats  # noqa: E402

# How figures are written: the innermost setting of each key wins (figure_output).
_OUTPUT: list[dict] = [{"format": ("png",), "short_titles": False, "all_panels": False}]


@contextmanager
def figure_output(format=None, short_titles: bool | None = None, *, default: bool = False,
                  all_panels: bool | None = None):
    """Within the block, `save` writes each of `format` (e.g. "png,pdf") and, if
    `short_titles`, one-line titles; figures of many panels draw them all only if
    `all_panels` (else the first condition's, which reads at a column's width). None leaves
    a setting as it is; `default=True` (a preset's own keys) sets only what no enclosing
    block set (CLI > YAML > defaults)."""
    given = {k: v for k, v in {"format": None if format is None else parse_formats(format),
                               "short_titles": short_titles, "all_panels": all_panels}.items()
             if v is not None}
    top = _OUTPUT[-1]
    set_before = top.get("_set", set())
    if default:
        given = {k: v for k, v in given.items() if k not in set_before}
    _OUTPUT.append({**top, **given, "_set": set_before | set(given)})
    try:
        yield
    finally:
        _OUTPUT.pop()


def formats() -> tuple[str, ...]:
    """The formats `save` writes now."""
    return _OUTPUT[-1]["format"]


def short_titles() -> bool:
    """Whether `save` shortens titles now."""
    return _OUTPUT[-1]["short_titles"]


def all_panels() -> bool:
    """Whether a figure of a panel per model and condition draws every one (--all-panels)."""
    return _OUTPUT[-1]["all_panels"]


def first_or_all(groups: list) -> tuple[list, str]:
    """The (title, rows) groups a many-panel figure draws: all under --all-panels, else the
    first (a summary that reads at a column's width), with what the title says about it."""
    if all_panels() or len(groups) <= 1:
        return groups, ""
    return groups[:1], f" (the first of {len(groups)} conditions; --all-panels draws every one)"


def _titles(fig) -> list:
    """Every title artist of a figure: its suptitle, then each axes' three titles."""
    texts = [fig._suptitle] if getattr(fig, "_suptitle", None) is not None else []
    for ax in fig.axes:
        texts += [ax.title, ax._left_title, ax._right_title]
    return [t for t in texts if t.get_text()]


def drawn(csv_paths: dict, fig_dir, figures: dict) -> list[Path]:
    """The figures of the tables a run wrote: `figures` maps a table's name to (draw(frame,
    path), the figure's file name); a table the run did not write draws nothing."""
    return [draw(pd.read_csv(csv_paths[table]), Path(fig_dir) / name)
            for table, (draw, name) in figures.items() if table in csv_paths]


def save(fig, path: Path, dpi: int = 150) -> Path:
    """Lay out, write and close a figure in every format asked for (`figure_output`; PNG
    alone by default), the folder created; returns the path of the first format. With short
    titles each title keeps its first line, and `<name>.json` keeps them whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    setting = _OUTPUT[-1]
    if setting["short_titles"]:
        full = [t.get_text() for t in _titles(fig)]
        for t in _titles(fig):
            t.set_text(t.get_text().split("\n")[0])
        path.with_suffix(".json").write_text(json.dumps(
            {"figure": path.stem, "formats": list(setting["format"]), "titles": full,
             "note": "drawn with --short-titles: the full titles (what, of what model, on what "
                     "data); every row of the tables it was drawn from carries its provenance"},
            indent=2), encoding="utf-8")
    written = []
    for fmt in setting["format"]:
        target = path.with_suffix(f".{fmt}")
        # no creation date in PDF or SVG: the same figure gives the same bytes
        meta = {"pdf": {"CreationDate": None}, "svg": {"Date": None}}.get(fmt)
        fig.savefig(target, dpi=dpi, bbox_inches="tight", metadata=meta)
        written.append(target)
    plt.close(fig)
    return written[0]
