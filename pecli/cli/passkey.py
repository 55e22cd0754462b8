"""`pecli passkey`: passkey retrieval by prompt length and depth (rope scaling, interventions)."""

from __future__ import annotations

import typer
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, derived
from pecli.cli.shared import ci_text, counter, run_and_write
from pecli.cli.shared import console as wide_console
from pecli.experiments.options.passkey import PasskeyOptions
from pecli.runs import parallel


@derived(PasskeyOptions, "pecli passkey")
def passkey(options: PasskeyOptions, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """Passkey retrieval: a number hidden in filler text, read back by greedy decoding.

    The template is Mohtashami & Jaggi's (as YaRN's evaluation uses it; docs/length.md). The
    key k is drawn uniformly from 1..50000 (seeded; the same keys under every condition);
    the model decodes at most 10 tokens greedily, with the KV cache; a trial is right when
    the first integer in its output is k. passkey.csv: accuracy per (model, condition, length,
    depth) and per length over all depths, with a 95 % Wilson interval where trials are
    independent draws (the default; --draws fixed shares one filler per cell and gives
    counts without intervals), and each condition's difference from intact on
    the same trials with Newcombe's paired interval; passkey_trials.csv: every trial. The
    intact model comes first; every --intervention is crossed with every --rope-scaling.

    Examples:
        pecli passkey smollm2 --lengths 1024,4096 --depths 0,0.5,1 --trials 5
        pecli passkey smollm2 --lengths 16384 --rope-scaling yarn:2,linear:2
        pecli passkey random:llama --lengths 128,256 --intervention zero
    """
    from pecli.experiments.passkey import run
    from pecli.measures.intervals import PAIRED_PROPORTION_METHOD
    from pecli.positions.labels import columns
    from pecli.positions.labels import label as condition_label
    with counter("decoding", "trials") as advance:
        tables, paths, pngs, _ = run_and_write(
            "passkey", run, options, out, progress=advance, force=force,
            notes={"intervals": (f"95 % Wilson score interval over trials; the difference from intact: "
                                 f"{PAIRED_PROPORTION_METHOD}"
                                 if options.independent else
                                 "none: the trials of a cell share their filler and depth (--draws fixed)"),
                   "interval_unit": ("trial (its own key, depth jitter, filler order and offset)"
                                     if options.independent else "depth cell")})
    if not parallel.is_main():
        return
    console = wide_console()
    df = tables["passkey"]
    depths = [d for d in dict.fromkeys(df["depth"].astype(str)) if d != "all"]
    summary = Table(title=f"passkey: right/trials per length and depth of the key (0 = start "
                          f"of the filler, 1 = end); {options.trials} trials per cell")
    for col in ("model", "condition", "length", *(f"depth {d}" for d in depths), "all depths [95 % CI]"):
        summary.add_column(col, justify="left" if col in ("model", "condition") else "right")
    for (model, *_, length), cells in df.groupby(["model", *(c for c in columns() if c in df), "length"],
                                                 sort=False, dropna=False):
        by_depth = cells.set_index(cells["depth"].astype(str))
        row = by_depth.loc["all"]
        shown = [f"{by_depth.loc[d, 'correct']}/{by_depth.loc[d, 'trials']}" if d in by_depth.index
                 else "-" for d in depths]
        whole = row["note"] if isinstance(row["note"], str) and row["note"] else (
            f"{row['correct']}/{row['trials']} = {row['value']:.0%}{ci_text(row, '.0%')}")
        summary.add_row(str(model), condition_label(row), f"{length:,}", *shown, whole)
    console.print(summary)
    for p in [*paths.values(), *pngs]:
        console.print(f"wrote {p}")


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli passkey smollm2 --lengths 4096,10240",), "can the model retrieve a number hidden at each "
             "depth?", "passkey.csv, passkey_trials.csv", "46 min (passkey-smollm2: 2 lengths, 2 conditions, 20 trials each)", "causal")


def register(app: typer.Typer) -> None:
    app.command()(passkey)
