"""`pecli finetune`: what training makes of a model without positions."""

from __future__ import annotations

import typer
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, derived
from pecli.cli.shared import ci_text, run_and_write
from pecli.cli.shared import console as wide_console
from pecli.experiments.options.finetune import FinetuneOptions
from pecli.runs import parallel


@derived(FinetuneOptions, "pecli finetune")
def finetune(options: FinetuneOptions, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """Fine-tune a model with its positions removed: an encoder on IMDB sentiment, or a
    causal LM's recovery of held-out perplexity. The model's config decides which.

    Encoder (minilm, any BERT family): a linear head on the mean-pooled final hidden state,
    full fine-tuning (or --train-layers N), the position table frozen in every condition;
    test accuracy per seed and the mean over seeds (interval: seeds and texts resampled), beside the
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
        for line in reliance(frames["recovery"]):
            console.print(line)
    for p in [*tables.values(), *figures]:
        console.print(f"wrote {p}")


def _ci(row) -> str:
    return f"{row['value']:.3f}{ci_text(row, '.3f')}"


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


def reliance(df) -> list[str]:
    """What removing positions costs the untrained model on the held-out texts, and a warning
    where it is not detectably worse than intact (its perplexity inside intact's interval over
    texts): a recovery from nothing measures little (issue 44, as `pecli mask fit` warns)."""
    intact = df[df["metric"] == "intact_perplexity"]
    zero = df[(df["metric"] == "perplexity_mean") & (df["step"] == 0) & (df["condition"] == "zero")]
    if intact.empty or zero.empty:
        return []
    intact, zero, model = intact.iloc[0], zero.iloc[0], df.iloc[0]["model"]
    lines = [f"reliance on positions: held-out perplexity {intact['value']:.4g} intact, "
             f"{zero['value']:.4g} without ({zero['value'] / intact['value'] - 1:+.1%})"]
    if intact["ci_high"] != intact["ci_high"]:  # NaN: too few texts for an interval
        lines.append(f"warning: intact has no interval over {intact['rows']} texts, so whether "
                     f"{model} relies on its positions is not known; give more texts (--limit)")
    elif not zero["value"] > intact["ci_high"]:
        lines.append(f"warning: {model} barely relies on its positions (without them, "
                     f"{zero['value']:.4g} lies inside intact's interval{ci_text(intact, '.4g')}): "
                     "its recovery measures little; use a model that needs its positions "
                     "(models/gpt2-imdb)")
    return lines


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli finetune minilm",), "how much fine-tuning recovers without positions",
             "finetune.csv / recovery.csv", needs="data")


def register(app: typer.Typer) -> None:
    app.command()(finetune)
