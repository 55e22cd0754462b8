"""`pecli models`, `pecli datasets`, `pecli cache`: what is known and what is available here."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from pecli.cli.flags import DataDirOpt
from pecli.cli.shared import console as wide_console


def models() -> None:
    """List model families, offline aliases and random models, and whether each is available here.

    Examples:
        pecli models
    """
    from pecli.models.architectures import ARCHITECTURES
    from pecli.models.sources import ALIASES, HUB_ALIASES, model_availability

    table = Table(title="models")
    for col in ("name", "family", "positions", "status", "to get it"):
        table.add_column(col)
    for alias, pkg in ALIASES.items():
        status, fix = model_availability(alias)
        table.add_row(alias, pkg.family, pkg.note, status, fix)
    for family, spec in ARCHITECTURES.items():
        status, fix = model_availability(f"random:{family}")
        table.add_row(f"random:{family}", family, f"{spec.position}; config of {spec.reference}",
                      status, fix)
    aliases = {hub_id: alias for alias, hub_id in HUB_ALIASES.items()}
    for family, spec in ARCHITECTURES.items():
        status, fix = model_availability(spec.reference)
        alias = aliases.get(spec.reference)
        name = f"{alias} (alias of {spec.reference})" if alias and alias != spec.reference else spec.reference
        table.add_row(name, family, f"{spec.position} (hub)", status, fix)
    wide_console().print(table)
    wide_console().print(_families_table())
    wide_console().print(_layouts_table())
    typer.echo("Any hub id or local directory of a supported family also works: "
               + ", ".join(t for s in ARCHITECTURES.values() for t in s.model_types))


def _families_table() -> Table:
    """Family x position kind x the interventions that apply x reference checkpoint (the table
    docs/positions.md holds, from the same rows)."""
    from pecli.models.architectures import family_rows

    rows = family_rows()
    table = Table(title="families: where positions live and what pecli can do to them")
    cols = ("family", "positions", "interventions", "reference", "note")
    for col in cols:
        table.add_column(col)
    for row in rows:
        table.add_row(*(row[c] for c in cols))
    return table


def _layouts_table() -> Table:
    """Each family's position layout, one line per layer type (from its published config)."""
    from pecli.models.architectures import family_rows

    table = Table(title="layouts of random:<family>: per layer type, span, positions, scores")
    for col in ("family", "layout (per layer type)"):
        table.add_column(col)
    for row in family_rows():
        table.add_row(row["family"], row["layout (per layer type)"])
    return table


def datasets(data_dir: DataDirOpt = None) -> None:
    """List datasets, their splits and whether each is available here.

    Examples:
        pecli datasets
        pecli datasets --data-dir ../shared/data
    """
    from pecli.data.datasets import DATASETS, dataset_availability
    from pecli.data.datasets import data_dir as resolve_dir

    root = resolve_dir(data_dir)
    table = Table(title="datasets")
    for col in ("name", "hub id", "splits", "text", "status", "to get it"):
        table.add_column(col)
    for name, spec in DATASETS.items():
        status, fix = dataset_availability(spec, root)
        hub = spec.hub_id + (f" ({spec.hub_config})" if spec.hub_config else "")
        table.add_row(name, hub, ", ".join(spec.splits), spec.text_field, status, fix)
    wide_console().print(table)
    typer.echo(f"data directory: {root} (--data-dir, PECLI_DATA_DIR, else ../shared/data beside the "
               "project)" if root else "data directory: none found, so the HF hub (set "
               "PECLI_DATA_DIR=DIR or pass --data-dir DIR for local files)")
    typer.echo("A CSV/JSONL/parquet file with a text column is also a dataset: pass its path.")


def cache(
    clear_partial: Annotated[bool, typer.Option(
        "--clear-partial", help="Delete the saved progress of interrupted runs (and damaged copies set aside).")] = False,
    clear_models: Annotated[bool, typer.Option(
        "--clear-models", help="Delete the dequantised models (rebuilt on next use, about 30 s each).")] = False,
    clear_all: Annotated[bool, typer.Option("--clear-all", help="Both of the above.")] = False,
) -> None:
    """Show pecli's cache (dequantised models, progress of interrupted runs) and its sizes.

    Cached models carry checksums written with them and are verified on every load; a
    damaged one is rebuilt, and a damaged progress file is set aside (`*.damaged`).

    Examples:
        pecli cache
        pecli cache --clear-partial
        pecli cache --clear-models
    """
    import shutil

    from pecli.models.gguf import checksum_problem
    from pecli.runs.errors import DataError
    from pecli.runs.io import cache_dir

    root = cache_dir()
    if root.exists() and not root.is_dir():
        raise DataError(f"the cache {root} is a file, not a folder; point PECLI_CACHE_DIR at a "
                        "folder (or unset it for the user cache)")
    # dequantised models (folders with their checksums) and GGUFs assembled from chunk packages
    models = sorted(p for p in (root / "models").glob("*") if p.is_dir() or p.suffix == ".gguf")
    partial = sorted((root / "partial").glob("*.npz")) + sorted((root / "partial").glob("*.damaged"))
    if clear_partial or clear_all:
        for path in partial:
            path.unlink(missing_ok=True)
        typer.echo(f"deleted {len(partial)} saved run(s) from {root / 'partial'}")
        partial = []
    if clear_models or clear_all:
        for entry in models:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        typer.echo(f"deleted {len(models)} cached model(s) from {root / 'models'}")
        models = []
    table = Table(title=f"pecli cache: {root} (PECLI_CACHE_DIR)")
    for col in ("what", "entry", "size", "state"):
        table.add_column(col)
    for entry in models:
        if entry.is_file():  # its package's assemble checks its sha256 on every use
            table.add_row("assembled GGUF", entry.name, f"{entry.stat().st_size / 1e6:,.1f} MB",
                          "sha256 checked on every use")
            continue
        size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        problem = checksum_problem(entry)
        table.add_row("model", entry.name, f"{size / 1e6:,.1f} MB",
                      "checksums match" if problem is None else f"rebuilt on next use: {problem}")
    for path in partial:
        damaged = path.suffix == ".damaged"
        table.add_row("interrupted run", path.name, f"{path.stat().st_size / 1e6:,.1f} MB",
                      "damaged, set aside" if damaged else "resumable")
    wide_console().print(table)
    if partial:
        typer.echo("Rerunning the same command resumes an interrupted run; "
                   "`pecli cache --clear-partial` forgets them.")
    if models:
        typer.echo("`pecli cache --clear-models` deletes the cached models; `--clear-all` empties the cache.")


def register(app: typer.Typer) -> None:
    app.command()(models)
    app.command()(datasets)
    app.command()(cache)
