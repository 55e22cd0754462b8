"""A condition's one name, from its table columns (torch-free: figures, summaries and
`pecli compare` read it from written CSVs).

`label(row)` names a condition (pecli.positions.conditions.Condition, or a row of any table
written by pecli): the parts that changed the model, in PARTS' order, joined by " + "
(`zero + linear/log-bias (study) + yarn:2`), or `intact` when nothing did. `labelled(df)`
adds the `condition` column to a table; `upgraded(df)` reads a table written before 0.2,
when the intact model was called `learned` (also for rotary, ALiBi and relative-bias models).

PARTS has one entry per kind of condition: its columns and its part of the label (`columns()`
lists every condition column from it: tables, summaries and `pecli compare` read those;
pecli.positions.conditions.KINDS writes them; tests/unit/test_conditions.py checks the two
agree).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from pecli.runs import names
from pecli.runs.errors import PecliError

INTACT = names.INTACT
UNCHANGED_ROPE = "none"  # the rope_scaling column of an unscaled model
OLD_INTACT = ("learned",)  # what results written before 0.2 call the intact model


def _text(row: Mapping, key: str, default: str) -> str:
    value = row.get(key, default)
    return default if value is None or str(value) in ("", "nan") else str(value)


def _intervention_label(row: Mapping) -> str | None:
    name = _text(row, "intervention", INTACT)
    return None if name in (INTACT, *OLD_INTACT) else name


def _mask_label(row: Mapping) -> str | None:
    mask = _text(row, "mask", "default")
    if mask == "default":
        return None
    protocol = _text(row, "protocol", "relative")
    return f"{mask}/{_text(row, 'mask_semantics', 'legacy')}" + (
        "" if protocol == "relative" else f" ({protocol})")


def _rope_label(row: Mapping) -> str | None:
    rope = _text(row, "rope_scaling", UNCHANGED_ROPE)
    return None if rope == UNCHANGED_ROPE else rope


@dataclass(frozen=True)
class Part:
    """One kind of condition as a table names it: its columns, in order, and its part of the
    label read from them (None: unchanged)."""

    columns: tuple[str, ...]
    label: Callable[[Mapping], str | None]


PARTS: dict[str, Part] = {  # kind -> its columns and its part of the label, in label order
    "intervention": Part(("intervention",), _intervention_label),
    "mask": Part(("mask", "mask_semantics", "protocol"), _mask_label),
    "rope": Part(("rope_scaling",), _rope_label),
}


def columns() -> tuple[str, ...]:
    """Every condition column, in PARTS' order: the one list (a kind added later included)."""
    return tuple(c for part in PARTS.values() for c in part.columns)


def changed(row: Mapping) -> dict[str, str]:
    """The kinds a row's condition changes, each with its part of the label, in PARTS' order
    (empty: intact): what figures colour and group by, read from the columns."""
    return {kind: p for kind, part in PARTS.items() if (p := part.label(row)) is not None}


def label(row: Mapping) -> str:
    """A condition's name from its columns (a table row, or `Condition.columns()`): the
    changed parts in PARTS' order joined by " + ", or `intact`. Rows written before 0.2
    (intervention `learned`) read as intact too."""
    parts = list(changed(row).values())
    return " + ".join(parts) if parts else INTACT


def labelled(df):
    """A table (pandas) with its `condition` column (`label` of each row's columns) just
    before its first condition column; a table with no condition column, or whose
    `intervention` names no intervention (`none`: a model as trained), is returned as is
    (ablate's random-vector baseline names its own condition, `random vectors`)."""
    cols = [c for c in df.columns if c in columns()]
    if not cols or "condition" in df.columns:
        return df
    if "intervention" in df.columns and not any(map(_is_intervention, df["intervention"].unique())):
        return df  # no row is a condition of a model (a trained scheme's run)
    values = [label(dict(zip(cols, row, strict=True))) for row in df[cols].itertuples(index=False)]
    df = df.copy()
    df.insert(df.columns.get_loc(cols[0]), "condition", values)
    return df


def _is_intervention(value) -> bool:
    return str(value) in OLD_INTACT or intervention(value) is not None


@lru_cache(maxsize=4096)
def _parsed(text: str) -> names.Choice | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # a deprecated name still reads
            return names.parse(names.INTERVENTIONS, text)
    except PecliError:
        return None


def intervention(value) -> names.Choice | None:
    """An intervention column's value read by the one parser (None: it names none, e.g. a
    trained scheme's words)."""
    return _parsed(str(value))


def remedy_method(value) -> str | None:
    """The method of a remedy given with its parameters in every layer (`selfextend` of
    `selfextend:4:1024`; `window` of `sinks:0:W`, window attention), else None (a layered
    one, a name without parameters, words): figures give a method one colour."""
    choice = intervention(value)
    if choice is None or not choice.argument or choice.layers is not None:
        return None
    if choice.name == "sinks" and choice.argument.partition(":")[0] == "0":  # no sinks: a window
        return "window"
    return choice.name


def fitted_mask(row: Mapping) -> bool:
    """Whether a row's mask is a file that `pecli mask fit` wrote."""
    return _text(row, "mask", "default").startswith(f"{names.MASK_FILE.name}:")  # as str(Choice) writes it


def upgraded(df):
    """A table written before 0.2 read as one written now: the intact model's old name
    (`learned`, in intervention and probe_trained_on) becomes `intact`, and the `condition`
    column is added (`labelled`). A table written now comes back unchanged. `pecli compare`
    reads every table through it; the committed results were migrated with it."""
    renamed = {old: INTACT for old in OLD_INTACT}
    cols = [c for c in ("intervention", "probe_trained_on") if c in df.columns
            and df[c].isin(list(renamed)).any()]
    if cols:
        df = df.assign(**{c: df[c].replace(renamed) for c in cols})
    return labelled(df)
