"""`pecli models`, `pecli datasets`, `pecli cache`: what is known and what is available here."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from pecli.cli_options import DataDirOpt
from pecli.commands import console as wide_console


def models() -> None:
    """List model families, offline aliases and random models, and whether each is available here.

    Examples:
        pecli models
    """
    from pecli.architectures import ARCHITECTURES
    from pecli.loading import ALIASES, HUB_ALIASES, model_availability

    table = Table(title="models")
    for col in ("name", "family", "positions", "status", "to get it"):
        table.add_column(col)
    for alias, pkg in ALIASES.items():
        status, fix = model_availability(alias)
        family = "bert" if alias == "minilm" else "llama"
        table.add_row(alias, family, pkg.note, status, fix)
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
    typer.echo("Any hub id or local directory of a supported family also works: "
               + ", ".join(t for s in ARCHITECTURES._entries.values() for t in s.model_types))


def datasets(data_dir: DataDirOpt = None) -> None:
    """List datasets, their splits and whether each is available here.

    Examples:
        pecli datasets
        pecli datasets --data-dir ../shared/data
    """
    from pecli.data import DATASETS, dataset_availability
    from pecli.data import data_dir as resolve_dir

    root = resolve_dir(data_dir)
    table = Table(title="datasets")
    for col in ("name", "hub id", "splits", "text", "status", "to get it"):
        table.add_column(col)
    for name, spec in DATASETS.items():
        status, fix = dataset_availability(spec, root)
        hub = spec.hub_id + (f" ({spec.hub_config})" if spec.hub_config else "")
        table.add_row(name, hub, ", ".join(spec.splits), spec.text_field, status, fix)
    wide_console().print(table)
    typer.echo("A CSV/JSONL/parquet file with a text column is also a dataset: pass its path.")


def cache(
    clear_partial: Annotated[bool, typer.Option(
        "--clear-partial", help="Delete the saved progress of interrupted runs.")] = False,
) -> None:
    """Show pecli's cache (dequantised models, progress of interrupted runs) and its sizes.

    Examples:
        pecli cache
        pecli cache --clear-partial
    """
    from pecli.loading import cache_dir

    root = cache_dir()
    partial = sorted((root / "partial").glob("*.npz"))
    if clear_partial:
        for path in partial:
            path.unlink()
        typer.echo(f"deleted {len(partial)} saved run(s) from {root / 'partial'}")
        partial = []
    table = Table(title=f"pecli cache: {root} (PECLI_CACHE_DIR)")
    for col in ("what", "entry", "size"):
        table.add_column(col)
    for folder in sorted(p for p in (root / "models").glob("*") if p.is_dir()):
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        table.add_row("model", folder.name, f"{size / 1e6:,.1f} MB")
    for path in partial:
        table.add_row("interrupted run", path.name, f"{path.stat().st_size / 1e6:,.1f} MB")
    wide_console().print(table)
    if partial:
        typer.echo("Rerunning the same command resumes an interrupted run; "
                   "`pecli cache --clear-partial` forgets them.")


def register(app: typer.Typer) -> None:
    app.command()(models)
    app.command()(datasets)
    app.command()(cache)
