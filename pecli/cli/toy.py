"""`pecli toy arithmetic`: tiny Transformers learn i+j=k / i-j=k with each position scheme."""

from __future__ import annotations

from typing import Annotated

import typer

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, derived
from pecli.experiments.options.toy import ToyOptions
from pecli.experiments.options.toy_length import ToyLengthOptions

SaveOpt = Annotated[bool, typer.Option(help="Save each checkpoint under OUT/models/<pe> "
                                                  "(<pe>-seed<k> with --seeds above 1).")]
SaveLengthOpt = Annotated[bool, typer.Option(
    help="Save each checkpoint under OUT/models/<task>-<pe>-seed<k>.")]

toy_app = typer.Typer(help="Toy tasks that show what position information is for.",
                      no_args_is_help=True)


@toy_app.command()
@derived(ToyOptions, "pecli toy arithmetic")
def arithmetic(options: ToyOptions, *, save_models: SaveOpt = True, out: OutOpt = None, force: ForceOpt = False) -> None:
    """Train tiny Transformers per position scheme on "i+j=k" / "i-j=k"; exact match and attention.

    Strings are character-level; the split (80/20) is a seeded permutation (--seed's), the
    same for every training seed. Writes by_seed.csv (each model's exact match, item by item,
    and training numbers), accuracy.csv (with --seeds N, their means over seeds: exact match
    with a bootstrap over seeds and test sums together; one seed: Wilson's interval over the
    sums), attention.csv (+ .json sidecars), figures/toy_accuracy.png, toy_attention.png.
    One seed says little about a scheme: the same code and seed trained alibi to 0.87 on one
    machine and 0.64 on another (training this small amplifies float rounding, and CPU kernels
    round differently; rows record theirs: cpu_kernels). The committed offline run (results/
    offline/toy, --seeds 5, 2 workers, about 40 minutes on 2 shared cores): rope 0.95 [0.92,
    0.97], the other four 0.55 to 0.66 with overlapping intervals.

    Examples:
        pecli toy arithmetic
        pecli toy arithmetic --pe none --pe learned --steps 300
        pecli toy arithmetic --seeds 5 --workers 2
        pecli toy arithmetic --max 300 --probe 21+211= --out runs/toy-300
    """
    from pecli.cli.train import run_with_progress

    run_with_progress("toy", options, out, save_models=save_models, force=force)


@toy_app.command()
@derived(ToyLengthOptions, "pecli toy length")
def length(options: ToyLengthOptions, *, save_models: SaveLengthOpt = False, out: OutOpt = None, force: ForceOpt = False) -> None:
    """Train short, test long: per task, scheme and training seed, exact match by test length.

    Kazemnejad et al. (2023)'s protocol at toy size: train on instances of length 1..N, test
    on fresh ones up to 3N, greedy decoding; every exact match is a mean over training seeds,
    its 95 % interval a two-level bootstrap over seeds and test items together (the table's
    `seeds` and `interval` columns say how many and which; times and losses: a t interval
    over seeds). Writes
    by_seed.csv, accuracy.csv, ranking.csv (mean reciprocal rank over tasks), and
    figures/toy_length.png (exact match against test length, bands over seeds).

    Examples:
        pecli toy length
        pecli toy length --task copy --pe none,rope,alibi --seeds 5
        pecli toy length --task addition,sort --train-length 10 --test-lengths 10,20,30 --steps 3000
    """
    from pecli.cli.train import run_with_progress

    run_with_progress("toy-length", options, out, save_models=save_models, force=force)


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli toy arithmetic", "toy length"), "tiny Transformers trained with each position scheme",
             "accuracy.csv", "40 min (toy: arithmetic, 5 seeds a scheme); 93 s (toy-length)")


def register(app: typer.Typer) -> None:
    app.add_typer(toy_app, name="toy")
