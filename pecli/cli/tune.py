"""`pecli tune`: a condition's parameters chosen on one split, reported on another."""

from __future__ import annotations

import typer
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, derived
from pecli.cli.shared import console as wide_console
from pecli.cli.shared import counter, run_and_write
from pecli.experiments.tune import TuneOptions
from pecli.runs import parallel
from pecli.runs.numbers import decimals, number


@derived(TuneOptions, "pecli tune")
def tune(options: TuneOptions, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """Choose a condition's parameters on held-out data, and report the choice on other data.

    Every setting of --grid (the parameters crossed) is scored on the choice split; the best
    (lowest perplexity, highest passkey accuracy; the first in grid order on a tie) is scored
    again on the report split, which shares no document (or trial) with the choice split,
    beside the papers' recommended setting (or --default) and the intact model.
    tune_curve.csv: one row per setting on the choice split (the chosen one marked);
    tune_report.csv: intact, default and best on the report split, each with its 95 %
    interval over the split's windows or trials and the best's paired difference from
    intact and from the default. One figure per parameter. The splits' texts and tokens are
    hashed into every row (choice_split, report_split) and the sidecars.

    Examples:
        pecli tune smollm2 --condition selfextend --grid G=2,4,8 W=512,1024 --length 4096
        pecli tune smollm2 --condition yarn --grid factor=2,3,4 --objective passkey --length 4096
        pecli tune random:llama --condition rerope --grid W=16,32 --length 64 --choice 2 --limit 40
    """
    from pecli.experiments.tune import run
    from pecli.measures.intervals import DEFAULT_DIFF_COLUMNS, DIFF_COLUMNS
    with counter("tuning", "tokens" if options.objective == "length" else "trials") as advance:
        tables, paths, pngs, _ = run_and_write("tune", run, options, out, progress=advance, force=force)
    if not parallel.is_main():
        return
    console = wide_console()
    curve, report = tables["tune_curve"], tables["tune_report"]
    first = report.iloc[0]
    metric = first["metric"]
    digits = decimals(curve["value"], report["ci_low"], report["ci_high"])

    def fmt(x) -> str:
        return "" if x != x else number(x, digits)

    def interval(row, value: str, low: str, high: str) -> str:
        if row[value] != row[value]:
            return ""
        bounds = "" if row[low] != row[low] else f" [{fmt(row[low])}, {fmt(row[high])}]"
        return fmt(row[value]) + bounds

    def table(title: str, rows, first_columns: tuple[str, str], last: str, cells) -> None:
        shown = Table(title=title)
        for col in (*first_columns, metric, "vs intact", last):
            shown.add_column(col, justify="left" if col in first_columns else "right")
        for _, row in rows.iterrows():
            shown.add_row(*(str(row[c]) for c in first_columns), interval(row, "value", "ci_low", "ci_high"),
                          interval(row, *DIFF_COLUMNS), cells(row))
        console.print(shown)

    table(f"tune {first['tuned']}: {metric} on the choice split ({int(curve['units'].iloc[0])} "
          f"{first['unit']}s of {first['length']} tokens)", curve, ("setting", "condition"), "chosen",
          lambda row: "best" if row["chosen"] else "")
    table(f"reported on the report split ({int(first['units'])} {first['unit']}s, no text shared "
          f"with the choice split): {metric} [95 % CI]", report, ("role", "setting"), "vs default",
          lambda row: interval(row, *DEFAULT_DIFF_COLUMNS) if DEFAULT_DIFF_COLUMNS[0] in row else "")
    if first["default_rule"]:
        console.print(f"default: {first['default_rule']}", soft_wrap=True)
    for p in [*paths.values(), *pngs]:
        console.print(f"wrote {p}")


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli tune smollm2 --condition selfextend --grid G=2,4,8 W=512,1024",),
             "which parameters of a remedy or rope scaling, chosen on one split and reported on "
             "another?", "tune_curve.csv, tune_report.csv, a figure per parameter",
             "—", "data, causal")


def register(app: typer.Typer) -> None:
    app.command()(tune)
