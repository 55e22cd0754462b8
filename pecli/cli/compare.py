"""`pecli compare`: the headline numbers of several runs in one table and one figure per metric."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pecli.cli.flags import ForceOpt, OutOpt
from pecli.cli.shared import console as wide_console


def compare(
    runs: Annotated[list[Path], typer.Argument(
        help="Run folders written by pecli (ablate, perplexity, pe probe, toy --out, or a "
             "reproduce folder).")],
    allow_mixed: Annotated[bool, typer.Option(
        "--allow-mixed", help="Gather rows measured on different data (dataset, split, data "
                              "revision or row count) instead of refusing.")] = False,
    out: OutOpt = None,
    force: ForceOpt = False,
) -> None:
    """Gather several runs' headline numbers (models x conditions, with intervals) into one
    tidy table, compare.csv, and one figure per metric.

    Numbers of one metric are compared only when measured on the same texts (dataset,
    split, data revision and row count); otherwise the command says which runs differ.

    Examples:
        pecli compare results/offline
        pecli compare runs/ablate/A runs/ablate/B --out runs/compare/AB
    """
    from pecli.experiments.compare import figures, gather
    from pecli.runs.errors import DataError
    from pecli.runs.io import RunOutput, default_out_dir

    target = Path(out or default_out_dir("compare"))
    read = [r for r in runs if r.is_dir() and
            (target.resolve() == r.resolve() or target.resolve().is_relative_to(r.resolve()))]
    if read:
        raise DataError(f"--out {target} is inside {read[0]}, a folder compare reads; "
                        "write the comparison elsewhere (e.g. --out runs/compare/NAME)")
    key = {"command": "compare", "runs": [str(r) for r in runs], "allow_mixed": allow_mixed}
    with RunOutput(target, key, force=force) as output:
        table = gather(runs, allow_mixed=allow_mixed)
        paths, pngs = output.write({"compare": table}, key, figures)
    console = wide_console()
    summary = Table(title=f"compare: {table['run'].nunique()} run folder(s), "
                          f"{table['metric'].nunique()} metric(s)")
    for col in ("metric", "model", "condition", "value [95 % CI]", "data", "run"):
        summary.add_column(col, justify="right" if col.startswith("value") else "left")
    for r in table.itertuples():
        ci = "" if r.ci_low != r.ci_low else f" [{r.ci_low:.4g}, {r.ci_high:.4g}]"
        data = f"{r.dataset}/{r.split}, {int(r.rows)} rows" if "rows" in table and r.rows == r.rows else ""
        summary.add_row(r.metric, str(r.model), r.condition, f"{r.value:.4g}{ci}", data, r.run)
    console.print(summary)
    if table["mixed"].any():
        console.print("MIXED: some metrics gather rows of different data (--allow-mixed)")
    for p in [*paths.values(), *pngs]:
        console.print(f"wrote {p}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command()(compare)
