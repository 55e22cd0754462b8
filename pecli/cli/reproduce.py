"""`pecli reproduce`: every experiment of a preset, resumable, with a report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pecli.cli.docs import Row
from pecli.cli.flags import DataDirOpt, DeviceOpt, LimitOpt

PresetOpt = Annotated[str, typer.Option(help="Preset name (configs/<name>.yaml) or a YAML path.")]


def reproduce(
    preset: PresetOpt = "offline",
    out: Annotated[Path | None, typer.Option(help="Output directory (default: results/<preset>).")] = None,
    force: Annotated[bool, typer.Option(help="Redo entries that are already done.")] = False,
    device: DeviceOpt = None,  # every entry on this device (default: each its own, auto)
    limit: LimitOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Run a preset (offline, smoke, study, long) and write CSVs, figures and REPORT.md.

    Finished experiments are skipped on a rerun (their key is a hash of their full
    configuration); an interrupted run loses at most the experiment in flight.

    Examples:
        pecli reproduce --preset offline
        pecli reproduce --preset smoke --out /tmp/smoke
        pecli reproduce --preset study --device cuda
    """
    from pecli.experiments.reproduce import load_preset, run_preset

    overrides = {k: v for k, v in {"device": device, "limit": limit,
                                   "data_dir": str(data_dir) if data_dir else None}.items() if v is not None}
    cfg = load_preset(preset, overrides)
    out_dir = out or Path("results") / cfg.name
    results = run_preset(cfg, out_dir, force=force, announce=typer.echo)
    ran = sum(not r.skipped for r in results)
    typer.echo(f"{ran} run, {len(results) - ran} skipped; report: {out_dir / 'REPORT.md'}")


def presets() -> None:
    """List the presets in configs/.

    Examples:
        pecli presets
    """
    from pecli.experiments.reproduce import load_preset
    from pecli.runs.config import preset_names

    for name in preset_names():
        cfg = load_preset(name)
        typer.echo(f"{name}: {len(cfg.entries)} experiments. {cfg.description.strip().splitlines()[0] if cfg.description else ''}")


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli reproduce --preset offline",), "every experiment of a preset, resumable, with REPORT.md",
             "results/offline", "23 h from scratch (the sum of REPORT.md's section times; skips what is done)", "data")


def register(app: typer.Typer) -> None:
    app.command()(reproduce)
    app.command()(presets)
