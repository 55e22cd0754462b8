"""`pecli toy arithmetic`: tiny Transformers learn i+j=k / i-j=k with each position scheme."""

from __future__ import annotations

from typing import Annotated

import typer

from pecli.cli.flags import ForceOpt, OutOpt, SeedOpt, build
from pecli.runs.options import TOY_TASKS, ToyLengthOptions, ToyOptions

PeOpt = Annotated[list[str] | None, typer.Option(
    "--pe", help="Position encoding(s) to train with: learned, sinusoidal, none, rope, alibi "
                 "(repeat the flag or comma-separate; default: all five).")]
D = ToyOptions  # the defaults shown in --help

toy_app = typer.Typer(help="Toy tasks that show what position information is for.",
                      no_args_is_help=True)


@toy_app.command()
def arithmetic(
    pe: PeOpt = None,
    max_n: Annotated[int, typer.Option("--max", help="Operands 0 <= i, j < MAX.")] = D.max_n,
    steps: Annotated[int, typer.Option(help="Optimiser steps per scheme.")] = D.steps,
    probe: Annotated[str | None, typer.Option(
        help="Input whose attention is drawn (default 21+211= if --max > 211, else 21+21=, or 1+1= below 22).")] = None,
    layers: Annotated[int, typer.Option(help="Transformer blocks.")] = D.layers,
    width: Annotated[int, typer.Option(help="Hidden size (a multiple of --heads).")] = D.width,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = D.heads,
    threads: Annotated[int, typer.Option(help="torch threads (1 is fastest at this size).")] = D.threads,
    save_models: Annotated[bool, typer.Option(help="Save each checkpoint under OUT/models/<pe>.")] = True,
    seed: SeedOpt = 0,
    out: OutOpt = None,
    force: ForceOpt = False,
) -> None:
    """Train one tiny Transformer per position scheme on "i+j=k" / "i-j=k"; exact match and attention.

    Strings are character-level; the split (80/20) is a seeded permutation. Writes
    accuracy.csv, attention.csv (+ .json sidecars), figures/toy_accuracy.png,
    figures/toy_attention.png.
    At the defaults (2 x 64, 2,000 steps of 128) the committed offline run (results/offline/
    toy) trained each scheme in 40-46 s on 2 CPU cores (all five: under 4 min); exact match
    0.64 (alibi, none) to 0.97 (rope). One training seed per scheme: the interval is over test
    items, not seeds, and the same code and seed run on another machine trained alibi to 0.87
    (float rounding differs between CPUs, and training a small model amplifies it).

    Examples:
        pecli toy arithmetic
        pecli toy arithmetic --pe none --pe learned --steps 300
        pecli toy arithmetic --max 300 --probe 21+211= --out runs/toy-300
    """
    options = build(ToyOptions, "pecli toy arithmetic", pe=pe, max_n=max_n, steps=steps,
                    probe=probe, layers=layers, width=width, heads=heads, threads=threads, seed=seed)
    from pecli.cli.train import run_with_progress

    run_with_progress("toy", options, out, save_models=save_models, force=force)


L = ToyLengthOptions  # the defaults shown in --help


@toy_app.command()
def length(
    task: Annotated[list[str] | None, typer.Option(
        help=f"Task(s): {', '.join(TOY_TASKS)} (repeat or comma-separate; default: "
             "copy, reverse, sort).")] = None,
    pe: Annotated[list[str] | None, typer.Option(
        "--pe", help="Position encoding(s) to train with: learned, sinusoidal, none, rope, alibi, "
                     "t5, randomized, p-rope (repeat or comma-separate; default: all eight).")] = None,
    train_length: Annotated[int, typer.Option(
        help="N: training instances have lengths 1..N.")] = L.train_length,
    test_lengths: Annotated[str | None, typer.Option(
        help="Test lengths, e.g. 8,16,24 (default: N/2, N, 1.5N, 2N, 2.5N, 3N).")] = None,
    seeds: Annotated[int, typer.Option(
        help="Training seeds per (task, scheme): --seed, --seed + 1, ...")] = L.seeds,
    eval_items: Annotated[int, typer.Option(help="Test instances per length.")] = L.eval_items,
    steps: Annotated[int, typer.Option(help="Optimiser steps per model.")] = L.steps,
    batch: Annotated[int, typer.Option(help="Instances per step.")] = L.batch,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = L.lr,
    layers: Annotated[int, typer.Option(help="Transformer blocks.")] = L.layers,
    width: Annotated[int, typer.Option(help="Hidden size (a multiple of --heads).")] = L.width,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = L.heads,
    threads: Annotated[int, typer.Option(help="torch threads (1 is fastest at this size).")] = L.threads,
    workers: Annotated[int, typer.Option(
        help="Models trained at once, each in its own one-thread process (same numbers).")] = L.workers,
    save_models: Annotated[bool, typer.Option(
        help="Save each checkpoint under OUT/models/<task>-<pe>-seed<k>.")] = False,
    seed: SeedOpt = 0,
    out: OutOpt = None,
    force: ForceOpt = False,
) -> None:
    """Train short, test long: per task, scheme and training seed, exact match by test length.

    Kazemnejad et al. (2023)'s protocol at toy size: train on instances of length 1..N, test
    on fresh ones up to 3N, greedy decoding; every number is a mean over training seeds with
    a 95 % t interval over them (the table's `seeds` column says how many). Writes
    by_seed.csv, accuracy.csv, ranking.csv (mean reciprocal rank over tasks), and
    figures/toy_length.png (exact match against test length, bands over seeds).

    Examples:
        pecli toy length
        pecli toy length --task copy --pe none,rope,alibi --seeds 5
        pecli toy length --task addition,sort --train-length 10 --test-lengths 10,20,30 --steps 3000
    """
    options = build(ToyLengthOptions, "pecli toy length", task=task or L.task, pe=pe,
                    train_length=train_length, test_lengths=test_lengths or (), seeds=seeds,
                    eval_items=eval_items, steps=steps, batch=batch, lr=lr, layers=layers,
                    width=width, heads=heads, threads=threads, workers=workers, seed=seed)
    from pecli.cli.train import run_with_progress

    run_with_progress("toy-length", options, out, save_models=save_models, force=force)


def register(app: typer.Typer) -> None:
    app.add_typer(toy_app, name="toy")
