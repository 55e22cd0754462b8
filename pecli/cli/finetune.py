"""`pecli finetune`: what training makes of a model without positions."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pecli.cli.flags import (
    BootstrapOpt,
    DataDirOpt,
    DeviceOpt,
    DtypeOpt,
    ForceOpt,
    ModelArg,
    OutOpt,
    SeedOpt,
    build,
)
from pecli.cli.shared import console as wide_console
from pecli.cli.shared import run_and_write
from pecli.runs import parallel
from pecli.runs.options import FinetuneOptions


def finetune(
    model: ModelArg = FinetuneOptions.model,
    intervention: Annotated[list[str] | None, typer.Option(
        "--intervention", help="Conditions trained (repeat or a,b). Default: intact, zero, shuffle "
                               "(encoder); intact (the control) and zero (causal LM).")] = None,
    mask: Annotated[str | None, typer.Option(
        help="Causal LM: also start from zero + this mask (a file of pecli mask fit, log-bias), "
             "held while training.")] = None,
    seeds: Annotated[int, typer.Option(min=1, help="Training seeds: --seed, --seed + 1, ...")] = FinetuneOptions.seeds,
    train_limit: Annotated[int, typer.Option(min=4, help="IMDB train texts.")] = FinetuneOptions.train_limit,
    limit: Annotated[int | None, typer.Option(
        min=4, help="IMDB test texts (default 400 for an encoder, 48 for a causal LM).")] = None,
    max_length: Annotated[int, typer.Option(min=2, help="Tokens per text.")] = FinetuneOptions.max_length,
    batch: Annotated[int | None, typer.Option(
        min=1, help="Texts per step (default 16 for an encoder, 8 for a causal LM).")] = None,
    lr: Annotated[float, typer.Option(help="AdamW's learning rate for the model.")] = FinetuneOptions.lr,
    head_lr: Annotated[float, typer.Option(help="Encoder: the head's learning rate.")] = FinetuneOptions.head_lr,
    epochs: Annotated[int, typer.Option(min=1, help="Encoder: passes over the train texts.")] = FinetuneOptions.epochs,
    train_layers: Annotated[int | None, typer.Option(
        min=1, help="Encoder: train only the last N layers and the head (default: every layer).")] = None,
    steps: Annotated[int, typer.Option(min=1, help="Causal LM: training steps.")] = FinetuneOptions.steps,
    eval_every: Annotated[int, typer.Option(
        min=1, help="Causal LM: held-out perplexity every N steps.")] = FinetuneOptions.eval_every,
    model_out: Annotated[Path | None, typer.Option(
        help="Save the first seed's model of each condition as MODEL_OUT/<condition> (loadable by "
             "every pecli command; its revision is the weights' sha256).")] = None,
    bootstrap: BootstrapOpt = 1000,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    data_dir: DataDirOpt = None,
    out: OutOpt = None,
    force: ForceOpt = False,
) -> None:
    """Fine-tune a model with its positions removed: an encoder on IMDB sentiment, or a
    causal LM's recovery of held-out perplexity. The model's config decides which.

    Encoder (minilm, any BERT family): a linear head on the mean-pooled final hidden state,
    full fine-tuning (or --train-layers N), the position table frozen in every condition;
    test accuracy per seed and the mean with a Student-t interval over seeds, beside the
    frozen-feature probe (logistic regression on the untrained encoder's features of the same
    texts). Causal LM (models/tiny-gpt2-imdb, smollm2): full fine-tuning on IMDB train texts
    from zero, from the intact model (the control) and from zero + --mask FILE; held-out
    perplexity every --eval-every steps and the steps until within 10 % of the untrained
    intact model. Deterministic for a seed on CPU.

    Examples:
        pecli finetune minilm
        pecli finetune models/tiny-gpt2-imdb --steps 60 --seeds 3
        pecli finetune smollm2 --steps 20 --seeds 2 --batch 4 --mask runs/fit/mask/mask.json
        pecli finetune minilm --intervention zero --seeds 1 --model-out runs/ft-models
    """
    options = build(FinetuneOptions, "pecli finetune", model=model, intervention=intervention,
                    mask=mask, seeds=seeds, train_limit=train_limit, limit=limit,
                    max_length=max_length, batch=batch, lr=lr, head_lr=head_lr, epochs=epochs,
                    train_layers=train_layers, steps=steps, eval_every=eval_every,
                    model_out=model_out, bootstrap=bootstrap, seed=seed, device=device,
                    dtype=dtype, data_dir=data_dir)
    from pecli.experiments.finetune import run

    console = wide_console(log_path=False)
    with console.status("fine-tuning") as bar:
        say = (lambda msg: (bar.update(msg), console.log(msg))) if parallel.is_main() else None
        frames, tables, figures, _ = run_and_write("finetune", run, options, out, announce=say,
                                                   force=force)
    if not parallel.is_main():
        return
    if "finetune" in frames:
        console.print(_accuracy_table(frames["finetune"]))
    if "recovery" in frames:
        console.print(_recovery_table(frames["recovery"]))
    for p in [*tables.values(), *figures]:
        console.print(f"wrote {p}")


def _ci(row) -> str:
    return f"{row['value']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"


def _accuracy_table(df) -> Table:
    first = df.iloc[0]
    t = Table(title=f"IMDB sentiment: {first['model']} ({first['fine_tuning']}, {first['train_rows']} "
                    f"train / {first['test_rows']} test texts, {first['seeds']} seeds)")
    for col in ("condition", "frozen-feature probe [Wilson]", "fine-tuned, mean [t over seeds]",
                "per seed"):
        t.add_column(col)
    for cond, part in df.groupby("intervention", sort=False):
        by = part.set_index("metric")
        seeds = part[part["metric"] == "finetune_accuracy"]["value"]
        t.add_row(cond, _ci(by.loc["probe_accuracy"]), _ci(by.loc["finetune_accuracy_mean"]),
                  " ".join(f"{v:.3f}" for v in seeds))
    return t


def _recovery_table(df) -> Table:
    intact = df[df["metric"] == "intact_perplexity"].iloc[0]
    t = Table(title=f"recovery: {intact['model']}, held-out perplexity on {intact['rows']} IMDB test "
                    f"texts; intact (untrained) {_ci(intact)}")
    for col in ("start", "step 0", "last step [t over seeds]", "seeds within 10 %", "mean steps"):
        t.add_column(col)
    for cond, part in df[df["metric"] != "intact_perplexity"].groupby("condition", sort=False):
        mean = part[part["metric"] == "perplexity_mean"].sort_values("step")
        within = part[part["metric"] == "seeds_within_10pct"].iloc[0]
        t.add_row(cond, f"{mean['value'].iloc[0]:.4g}", f"{_ci(mean.iloc[-1])} at {int(mean['step'].iloc[-1])}",
                  f"{int(within['value'])} {within['interval']}",
                  "" if within["steps_mean"] != within["steps_mean"] else f"{within['steps_mean']:.0f}")
    return t


def register(app: typer.Typer) -> None:
    app.command()(finetune)
