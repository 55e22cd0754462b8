"""`pecli length`: loss by position and window length (rope scaling, learned tables)."""

from __future__ import annotations

import typer
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, derived
from pecli.cli.shared import ci_text, counter, run_and_write
from pecli.cli.shared import console as wide_console
from pecli.experiments.options.length import LengthOptions
from pecli.runs import parallel
from pecli.runs.numbers import decimals, number


@derived(LengthOptions, "pecli length")
def length(options: LengthOptions, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """Loss by position and by window length: how far each position scheme reaches.

    The dataset's documents, joined by the tokenizer's EOS in source order, make one token
    stream, cut into windows of each --lengths. length.csv has one row per (model,
    condition, length, position bucket) and an all-positions row: nll_mean, perplexity,
    tokens, windows, dropped_tokens and a 95 % bootstrap interval over windows. The intact
    model comes first; every --intervention x --mask x --mask-semantics is crossed with every
    --rope-scaling. Learned positions past their rows give a "not applicable" row.

    Examples:
        pecli length smollm2 --dataset docs.csv --lengths 2048,16384 --rope-scaling yarn:2,dynamic:2,linear:2
        pecli length random:llama --lengths 64,128 --windows sliding --stride 16 --limit 8
        pecli length models/sinusoidal models/learned --lengths 128,256,512,1024
    """
    from pecli.experiments.length import run
    from pecli.measures.intervals import METHOD
    from pecli.positions.labels import label as condition_label
    with counter("scoring", "tokens") as advance:
        tables, paths, pngs, _ = run_and_write("length", run, options, out, progress=advance, force=force,
                                               notes={"intervals": METHOD.replace("texts", "windows"),
                                                      "interval_unit": "window (no interval from fewer than 10)"})
    if not parallel.is_main():
        return
    console = wide_console()
    df = tables["length"]
    whole = df[df["all_positions"]]
    first = df.iloc[0]
    summary = Table(title=f"length: {first['dataset']}/{first['split']} ({first['rows']} documents, "
                          f"{first['stream_tokens']} stream tokens, {first['window_protocol']} windows)")
    for col in ("model", "condition", "length", "perplexity [95 % CI]", "tokens", "windows", "dropped"):
        summary.add_column(col, justify="right" if col in ("length", "tokens", "windows", "dropped") else "left")
    digits = decimals(whole["perplexity"], whole["ci_low"], whole["ci_high"])
    for _, row in whole.iterrows():
        condition = condition_label(row)
        value = row["note"] or (number(row["perplexity"], digits) + ("" if row["ci_low"] != row["ci_low"] else
                                ci_text(row, lambda x: number(x, digits))))
        summary.add_row(str(row["model"]), condition, str(row["length"]), value, str(row["tokens"]),
                        str(row["windows"]), str(row["dropped_tokens"]))
    console.print(summary)
    for p in [*paths.values(), *pngs]:
        console.print(f"wrote {p}")


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli length smollm2 --lengths 2048,16384 --rope-scaling yarn:2",), "loss by position past the "
             "context, with rope scaling", "length.csv", "15 min (length-smollm2: 3 windows of 16,384 tokens, 4 conditions)", "data, causal")


def register(app: typer.Typer) -> None:
    app.command()(length)
