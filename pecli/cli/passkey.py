"""`pecli passkey`: passkey retrieval by prompt length and depth (rope scaling, interventions)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from pecli.cli.flags import (
    BatchSizeOpt,
    DeviceOpt,
    DtypeOpt,
    ForceOpt,
    OutOpt,
    RopeScalingOpt,
    SeedOpt,
    build,
    intervention_option,
)
from pecli.cli.shared import console as wide_console
from pecli.cli.shared import run_and_write
from pecli.runs import parallel
from pecli.runs.options import PasskeyOptions

ModelsArg = Annotated[list[str], typer.Argument(
    help="One or more causal LMs: smollm2, random:llama, random:gpt2, a checkpoint directory "
         "(e.g. from pecli train lm), a hub id.")]
InterventionOpt = intervention_option("intact (the model unchanged; default), zero, ...; the intact model always runs first")


def passkey(
    models: ModelsArg,
    lengths: Annotated[str | None, typer.Option(
        help="Prompt lengths in tokens (special tokens included), e.g. 1024,4096,16384.")] = None,
    depths: Annotated[str | None, typer.Option(
        help="Fractions of the filler before the key, e.g. 0,0.5,1 (default).")] = None,
    trials: Annotated[int | None, typer.Option(
        min=1, help="Trials per (length, depth), each with its own seeded key (default 5).")] = None,
    rope_scaling: RopeScalingOpt = None,
    intervention: InterventionOpt = None,
    batch_size: BatchSizeOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    out: OutOpt = None,
    force: ForceOpt = False,
) -> None:
    """Passkey retrieval: a number hidden in filler text, read back by greedy decoding.

    The template is Mohtashami & Jaggi's (as YaRN's evaluation uses it; docs/length.md). The
    key k is drawn uniformly from 1..50000 (seeded; the same keys under every condition);
    the model decodes at most 10 tokens greedily, with the KV cache; a trial is right when
    the first integer in its output is k. passkey.csv: accuracy with a 95 % Wilson interval
    per (model, condition, length, depth) and per length over all depths; passkey_trials.csv:
    every trial. The intact model comes first; every --intervention is crossed with every
    --rope-scaling.

    Examples:
        pecli passkey smollm2 --lengths 1024,4096 --depths 0,0.5,1 --trials 5
        pecli passkey smollm2 --lengths 16384 --rope-scaling yarn:2,linear:2
        pecli passkey random:llama --lengths 128,256 --intervention zero
    """
    options = build(PasskeyOptions, "pecli passkey", model=models, lengths=lengths, depths=depths,
                    trials=trials, rope_scaling=rope_scaling, intervention=intervention,
                    batch_size=batch_size, seed=seed, device=device, dtype=dtype)
    from rich.progress import BarColumn, MofNCompleteColumn, TimeElapsedColumn

    from pecli.experiments.passkey import run
    from pecli.positions.labels import label as condition_label
    from pecli.runs.progress import progress_bar

    with progress_bar("decoding", BarColumn(), MofNCompleteColumn(), "trials", TimeElapsedColumn(),
                      transient=True, disable=not parallel.is_main()) as bar:
        task = bar.add_task("decoding", total=None)

        def advance(n: int, total: int) -> None:
            bar.update(task, advance=n, total=total)

        tables, paths, pngs, _ = run_and_write(
            "passkey", run, options, out, progress=advance, force=force,
            notes={"intervals": "95 % Wilson score interval over trials"})
    if not parallel.is_main():
        return
    console = wide_console()
    df = tables["passkey"]
    depths = [d for d in dict.fromkeys(df["depth"].astype(str)) if d != "all"]
    summary = Table(title=f"passkey: right/trials per length and depth of the key (0 = start "
                          f"of the filler, 1 = end); {options.trials} trials per cell")
    for col in ("model", "condition", "length", *(f"depth {d}" for d in depths), "all depths [95 % CI]"):
        summary.add_column(col, justify="left" if col in ("model", "condition") else "right")
    for (model, *_, length), cells in df.groupby(["model", "intervention", "rope_scaling", "length"],
                                                 sort=False, dropna=False):
        by_depth = cells.set_index(cells["depth"].astype(str))
        row = by_depth.loc["all"]
        shown = [f"{by_depth.loc[d, 'correct']}/{by_depth.loc[d, 'trials']}" if d in by_depth.index
                 else "-" for d in depths]
        whole = row["note"] if isinstance(row["note"], str) and row["note"] else (
            f"{row['correct']}/{row['trials']} = {row['value']:.0%} [{row['ci_low']:.0%}, {row['ci_high']:.0%}]")
        summary.add_row(str(model), condition_label(row), f"{length:,}", *shown, whole)
    console.print(summary)
    for p in [*paths.values(), *pngs]:
        console.print(f"wrote {p}")


def register(app: typer.Typer) -> None:
    app.command()(passkey)
