"""`pecli compare`: the headline numbers of several runs in one table and one figure per metric."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt
from pecli.cli.shared import ci_text, short_method
from pecli.cli.shared import console as wide_console
from pecli.runs.numbers import decimals


def compare(
    runs: Annotated[list[Path], typer.Argument(
        help="Run folders written by pecli (the --out of any command, or a reproduce folder); a "
             "folder without headline numbers is refused.")],
    allow_mixed: Annotated[bool, typer.Option(
        "--allow-mixed", help="Gather rows measured on different data (dataset, split, data "
                              "revision or row count) instead of refusing.")] = False,
    against: Annotated[Path | None, typer.Option(
        "--against", help="One of the run folders: every other row gets its difference from this "
                          "run's row at the same slot (the same model and condition where it has "
                          "them, else its intact row), with a 95 % interval paired by draw where "
                          "the two read the same samples or items (ruler, passkey, mc).")] = None,
    out: OutOpt = None,
    force: ForceOpt = False,
) -> None:
    """Gather several runs' headline numbers (models x conditions, with intervals) into one
    tidy table, compare.csv, and one figure per metric: per length and position bucket for
    length runs, per length and depth for passkey runs, per task and metric for lm-eval.
    Each interval is labelled with the method its rows record.

    Numbers of one metric are compared only when measured on the same texts (dataset,
    split, data revision and row count), slot by slot (a length, a depth, a held-out set);
    otherwise the command says which runs differ.

    With --against RUN, each row gets its difference from RUN's row with its interval:
    Newcombe's paired interval where both rows read the same draws (one seed's samples, or
    the same TruthfulQA items, by two models or conditions), Newcombe's interval for
    independent proportions where they share none (a bootstrap of each side's units for
    partial scores: recalls, MC2); no interval, with the reason, where they share some or the
    metric keeps no units.

    Examples:
        pecli compare results/offline/passkey-smollm2 results/offline/remedies-passkey-smollm2
        pecli compare results/offline --allow-mixed
        pecli compare runs/ablate/A runs/ablate/B --out runs/compare/AB
        pecli compare results/offline/ruler-smollm2-inside results/offline/ruler-gemma3-inside --against results/offline/ruler-smollm2-inside
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
    key = {"command": "compare", "runs": [str(r) for r in runs], "allow_mixed": allow_mixed,
           **({"against": str(against)} if against else {})}
    with RunOutput(target, key, force=force) as output:
        table = gather(runs, allow_mixed=allow_mixed, against=against)
        paths, pngs = output.write({"compare": table}, key, figures)
    console = wide_console()
    summary = Table(title=f"compare: {table['run'].nunique()} run folder(s), "
                          f"{table['metric'].nunique()} metric(s)")
    versus = ["minus reference [95 % CI]"] if against else []
    for col in ("metric", "model", "condition", "where", "value [95 % CI]", *versus, "interval", "data", "run"):
        summary.add_column(col, justify="right" if col.startswith(("value", "minus")) else "left")
    for metric, rows in table.groupby("metric", sort=False):
        digits = decimals(rows["value"], rows["ci_low"], rows["ci_high"])
        for r in rows.itertuples():
            data = f"{r.dataset}/{r.split}, {int(r.rows)} rows" if "rows" in table and r.rows == r.rows else ""
            shown = [_difference(r._asdict(), digits)] if against else []
            summary.add_row(metric, str(r.model), r.condition, r.slot, f"{r.value:.{digits}f}"
                            + ci_text(r._asdict(), f".{digits}f"), *shown, short_method(r.interval), data, r.run)
    console.print(summary)
    if against:
        methods = table.loc[table["diff_vs_against"].notna(), "diff_against_interval"]
        for method in dict.fromkeys(m.rsplit(", ", 1)[0] for m in methods if not m.startswith("no interval")):
            console.print(f"minus reference: {method}", soft_wrap=True)
    for line in table.attrs.get("skipped", []):
        console.print(f"note: no headline numbers in {line}; not compared", soft_wrap=True)
    if table["mixed"].any():
        console.print("MIXED: some metrics gather rows of different data (--allow-mixed)")
    for p in [*paths.values(), *pngs]:
        console.print(f"wrote {p}", soft_wrap=True)


def _difference(row: dict, digits: int) -> str:
    """A row's difference from its reference, with its interval, or why it has none."""
    if row["against"] == "(reference)":
        return "reference"
    if row["diff_vs_against"] != row["diff_vs_against"]:
        return row["diff_against_interval"] or "-"
    shown = f"{row['diff_vs_against']:+.{digits}f}"
    if row["diff_against_ci_low"] != row["diff_against_ci_low"]:
        return f"{shown} ({row['diff_against_interval']})"
    return shown + ci_text({"ci_low": row["diff_against_ci_low"], "ci_high": row["diff_against_ci_high"]},
                           f"+.{digits}f")


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli compare RUN RUN ...",), "several runs' headline numbers side by side, intervals labelled "
             "by method; `--against RUN`: each row's difference from RUN's, paired by draw where "
             "they share samples", "compare.csv, a figure per metric", "seconds")


def register(app: typer.Typer) -> None:
    app.command()(compare)
