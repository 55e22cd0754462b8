"""One module per experiment: options in, tidy tables out; a preset of experiments
(reproduce.py) and the tables across runs (compare.py). Registered experiments are what
`pecli reproduce` runs from a preset.

Each experiment module registers an `Experiment` whose `run(options)` takes its frozen
options object (a `pecli.runs.fields.Options`: the same names as its CLI flags, checked when
built) and returns tidy tables that pass `pecli.runs.tables.validate`; `figures` turns the
written CSVs into PNGs without torch; `headlines` are the numbers `pecli compare` reads from
its tables. Experiments name their figures by a "module:function" string (`lazy`), so that
computing never imports matplotlib.

May import pecli.measures, pecli.plots, pecli.positions, pecli.models, pecli.data, pecli.runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pecli.positions import labels
from pecli.runs.errors import ConfigError
from pecli.runs.fields import Options
from pecli.runs.registry import Registry

if TYPE_CHECKING:  # the command line imports this module (REGISTERED): no pandas at its start
    import pandas as pd


CONDITION = labels.columns()  # a row's condition columns (pecli.positions.labels.PARTS)


@dataclass(frozen=True)
class Units:
    """The table of a headline's units (ruler's samples, passkey's trials), as `pecli compare
    --against` pairs two rows' units: a unit is one right-or-wrong (or recall) answer."""

    suffix: str  # its file beside the headline table: <table><suffix>.csv (ruler_samples.csv)
    cell: tuple[str, ...]  # the columns that place a unit in a headline row (a value 'all' takes every one)
    pair: tuple[str, ...]  # the columns that name a unit within its model and condition
    draw: tuple[str, ...]  # what was drawn for it (its keys): equal in two runs when one draw is read twice
    # the table's rows of one headline row -> one row per unit with its `value`, for the metric
    # (mc's items table keeps a row per choice); None: each row is a unit
    per_unit: Callable[[pd.DataFrame, str], pd.DataFrame] | None = None


@dataclass(frozen=True)
class Headline:
    """One headline number of an experiment's tables, as `pecli compare` reads it: the rows
    that give one number per model x condition (x slot)."""

    metric: str  # the table's metric
    quantity: str  # axis label
    where: dict = field(default_factory=dict)  # column -> required value (the column must exist)
    condition: tuple[str, ...] = CONDITION  # columns that name the condition (those present)
    name: str = ""  # the metric in compare's table (default: `metric`)
    slot: Callable[[pd.Series], str] | None = None  # one number per slot (length, bucket, depth)
    interval: str = "95 % percentile bootstrap over texts"  # where neither rows nor sidecar say
    reference: tuple[tuple[float, str], ...] = ()  # lines on the figure: (value, what it means)
    axis: str = ""  # the y axis in words (default: quantity)
    units: Units | None = None  # its units' table, for differences between runs

    @property
    def label(self) -> str:
        return self.name or self.metric


def length_slot(row) -> str:
    """A headline's slot in a table by length and position bucket (length, train lm):
    `16,384 tokens, positions 2,048-4,096` (a bucket) or `..., all positions`."""
    where = ("all positions" if str(row.get("all_positions")).lower() == "true"
             else f"positions {int(row['window_start']):,}-{int(row['window_end']):,}")
    return f"{int(row['length']):,} tokens, {where}"


@dataclass(frozen=True)
class Experiment:
    name: str
    version: int  # bump when the meaning of a number changes: cached results are then redone
    run: Callable[..., dict[str, pd.DataFrame]]
    figures: Callable[[dict[str, Path], Path], list[Path]]
    description: str
    options: type[Options]  # what run() takes: run(options, progress=...)
    files: str | None = None  # a folder of its own files (save_dir), kept under a preset's entry
    headlines: tuple[Headline, ...] = ()  # what `pecli compare` reads from its tables
    # text files beside its tables, each made from them ({file name: maker}; ruler's samples as JSONL)
    companions: dict[str, Callable[[dict[str, pd.DataFrame]], str]] | None = None

    def run_with(self, values: dict, where: str, **kwargs) -> dict[str, pd.DataFrame]:
        """Build the options from plain values (a preset's, a test's), check them, and run."""
        return self.run(self.options.build(values, where), **kwargs)


def lazy(target: str) -> Callable[[dict[str, Path], Path], list[Path]]:
    """The function named "package.module:function", imported when first called."""
    module, _, name = target.partition(":")

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = call.__name__ = target
    return call


EXPERIMENTS: Registry[Experiment] = Registry("experiment", ConfigError)


def data_of(o, **kwargs):
    """The texts an experiment's options name (dataset, split, data_dir, limit, seed,
    text_field), as `pecli.data.datasets.load_data` reads them; `kwargs` go to it (at_most)."""
    from pecli.data.datasets import load_data

    return load_data(o.dataset, o.split, data_dir_=o.data_dir, limit=o.limit, seed=o.seed,
                     text_field=o.text_field, **kwargs)


def register(name: str, version: int, run: Callable[..., dict[str, pd.DataFrame]],
             options: type[Options], figures: str | Callable, description: str,
             files: str | None = None, headlines: tuple[Headline, ...] = (),
             companions: dict[str, Callable[[dict[str, pd.DataFrame]], str]] | None = None) -> Experiment:
    """Add an experiment to EXPERIMENTS under its name (written once) and return it.
    `figures`: "package.module:function" (imported when first drawn, `lazy`) or the function;
    `headlines`: its numbers `pecli compare` gathers (a run folder with none is refused);
    `companions`: files written beside its tables from them, by every route (command, preset)."""
    experiment = Experiment(name, version, run, lazy(figures) if isinstance(figures, str) else figures,
                            description, options, files, tuple(headlines), companions)
    EXPERIMENTS.add(name, experiment)
    return experiment


# The one table of what pecli registers, in `pecli --help` order: each command module of
# pecli.cli with the experiment modules of pecli.experiments it runs. A module registers
# itself when imported: a command with its register(app) (pecli.cli.app), an experiment with
# `register` (imported on first use, by load_all).
REGISTERED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("listing", ()), ("reproduce", ()), ("ablate", ("ablate",)), ("perplexity", ("perplexity",)),
    ("mc", ("mc",)), ("pe", ("pe", "recover")), ("toy", ("toy", "toy_length")),
    ("train", ("train_lm",)), ("compare", ()), ("length", ("length",)), ("passkey", ("passkey",)),
    ("ruler", ("ruler",)), ("lm_eval", ()), ("mask", ("mask_fit",)), ("attn", ("attn",)), ("finetune", ("finetune",)),
    ("tune", ("tune",)),
)


def check_before_loading(model: str, grid=(), *, causal: bool = False) -> None:
    """What `model`'s config alone decides, checked before data and weights load: each
    condition of `grid` (Conditions, or intervention names for a grid of interventions) by
    `pecli.positions.conditions.check_all`, the one check, which runs again once the model
    has loaded. Nothing is checked where only loading would tell."""
    from pecli.positions.conditions import Condition, check_all, plan

    check_all([c if isinstance(c, Condition) else plan(intervention=c) for c in grid], model,
              causal=causal)


def preflight(models) -> None:
    """Fail before any work when a model cannot be loaded here (not after the first model)."""
    from pathlib import Path

    from pecli.models.sources import missing_models
    from pecli.runs.errors import ModelError

    missing = missing_models([m for m in models if not Path(m).exists()])  # a local folder loads
    if missing:
        raise ModelError("cannot load " + "; ".join(missing))


def load(name: str, options: Options):
    """Model `name` loaded where and as the options say (device, dtype, seed, device map)."""
    from pecli.models.loading import load_model

    return load_model(name, device=options.device, dtype=options.dtype, seed=options.seed,
                      device_map=options.device_map, max_memory=options.max_memory)


def load_all() -> Registry[Experiment]:
    for module in (m for _, modules in REGISTERED for m in modules):
        importlib.import_module(f"pecli.experiments.{module}")
    return EXPERIMENTS
