"""`pecli train lm`: a small causal LM on IMDB with a chosen position scheme."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, derived
from pecli.cli.shared import ci_text, run_and_write
from pecli.cli.shared import console as wide_console
from pecli.experiments.options.train_lm import TrainLmOptions

train_app = typer.Typer(help="Train small Transformers from scratch with a chosen position scheme.",
                        no_args_is_help=True)


def run_with_progress(experiment: str, options, out: Path | None, force: bool = False,
                      save_models: bool = True) -> dict[str, Path]:
    """Run a registered training experiment on its checked options with a rich progress bar;
    write tables and figures (figures/ under the output folder) and the checkpoints."""
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from pecli.experiments import load_all
    from pecli.runs.progress import progress_bar

    console = wide_console()
    with progress_bar(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.fields[loss]}"), TimeElapsedColumn(),
                      TimeRemainingColumn(), console=console) as bar:
        tasks: dict[str, int] = {}

        def progress(scheme: str, step: int, steps: int, loss: float) -> None:
            if scheme not in tasks:
                tasks[scheme] = bar.add_task(f"{experiment} {scheme}", total=steps, loss="")
            bar.update(tasks[scheme], completed=step + 1, loss=f"loss {loss:.3f}")

        tables, csvs, figs, recorded = run_and_write(
            experiment, load_all().get(experiment).run, options, out, progress=progress, force=force,
            save_dir=save_models and getattr(options, "model_out", None) is None)
    _summary(console, experiment, tables)
    for path in [*csvs.values(), *figs]:
        console.print(f"wrote {path}")
    where = getattr(recorded, "model_out", None) or recorded.save_dir
    if where:
        console.print(f"checkpoints in {where}")
    return csvs


def _toy_length_summary(console: Console, tables: dict) -> None:
    acc = tables["accuracy"]
    acc = acc[acc.metric == "exact_match"]
    lengths = sorted(acc.test_length.unique())
    first = acc.iloc[0]
    for task, sub in acc.groupby("task", sort=False):
        table = Table(title=f"toy-length {task}: exact match by test length (trained on 1-"
                            f"{int(first['train_length'])}); mean of {int(first['seeds'])} "
                            "training seeds +- half the 95 % t interval")
        table.add_column("pe")
        for n in lengths:
            table.add_column(str(n) + ("*" if n <= first["train_length"] else ""), justify="right")
        for pe, rows in sub.groupby("pe", sort=False):
            cells = rows.set_index("test_length")
            table.add_row(pe, *(_pm(cells.loc[n])
                                if n in cells.index else "" for n in lengths))
        console.print(table)
    rank = tables["ranking"]
    mrr = rank[rank.metric == "mrr"].sort_values("value", ascending=False)
    table = Table(title="mean reciprocal rank over tasks (past the training length) [95 % "
                        "bootstrap over seeds]")
    for col in ("pe", "MRR", "exact match past N"):
        table.add_column(col, justify="right")
    past = rank[rank.metric == "exact_match_past_train_length"].set_index("pe")
    for _, row in mrr.iterrows():
        table.add_row(row["pe"], f"{row['value']:.2f}{ci_text(row, '.2f')}",
                      f"{past.loc[row['pe'], 'value']:.2f}{ci_text(past.loc[row['pe']], '.2f')}")
    console.print(table)


def _summary(console: Console, experiment: str, tables: dict) -> None:
    if experiment == "toy-length":
        _toy_length_summary(console, tables)
        return
    if experiment == "toy":
        df = tables["accuracy"]
        att = tables["attention"]
        first = att[att.layer == 1]  # layer 0 = embedding output
        row_gap = first[first.metric == "shared_key_row_gap"].set_index("pe")["value"]
        key_gap = first[first.metric == "repeat_key_gap"].set_index("pe")["value"]
        table = Table(title=f"toy: exact match on {df['dataset'].iloc[0]} (test); layer-1 "
                            f"attention gaps between repeated tokens of {att['probe'].iloc[0]!r}")
        for col in ("pe", "all [95 % CI]", "add", "sub", "train s", "row gap", "key gap"):
            table.add_column(col, justify="right")
        for pe, sub in df.groupby("pe", sort=False):
            em = sub[sub.metric == "exact_match"].set_index("operation")
            acc, whole = em["value"], em.loc["all"]
            ci = ci_text(whole, ".3f") if "ci_low" in em else ""
            secs = sub[sub.metric == "train_seconds"]["value"].iloc[0]
            table.add_row(pe, f"{acc['all']:.3f}{ci}", f"{acc['add']:.3f}", f"{acc['sub']:.3f}",
                          f"{secs:.0f}", f"{row_gap.get(pe, float('nan')):.2g}",
                          f"{key_gap.get(pe, float('nan')):.2g}")
    else:
        df = tables["perplexity"]
        removed = tables.get("positions")
        zero = {} if removed is None else removed[removed.intervention.astype(str) == "zero"].set_index("model")
        intact = {} if removed is None else removed[removed.intervention.astype(str) != "zero"].set_index("model")
        seeds = int(df["seeds"].max()) if "seeds" in df and df["seeds"].notna().any() else 1
        table = Table(title=f"train-lm: IMDB test perplexity (corpus); mean of {seeds} training "
                            "seeds [95 % t interval over seeds]; pecli perplexity intact vs zero")
        for col in ("model", "params", "test ppl", "intact", "positions removed", "train s",
                    "train tok/s"):
            table.add_column(col, justify="right")
        for model, sub in df.groupby("model", sort=False):
            vals = sub.set_index("metric")
            ppl = vals.loc["test_perplexity"]
            def cell(frame, key=model):
                return "" if key not in getattr(frame, "index", ()) else \
                    f"{frame.loc[key, 'value']:.1f}{ci_text(frame.loc[key], '.1f')}"
            table.add_row(model, f"{int(sub['parameters'].iloc[0]):,}",
                          f"{ppl['value']:.1f}" + (ci_text(ppl, ".1f") if model.startswith("lm-") else ""),
                          cell(intact), cell(zero),
                          f"{vals['value'].get('train_seconds', float('nan')):.0f}",
                          f"{vals['value'].get('train_tokens_per_second', float('nan')):.0f}")
    console.print(table)


@train_app.command()
@derived(TrainLmOptions, "pecli train lm")
def lm(options: TrainLmOptions, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """Train a small causal LM per position scheme on IMDB train; IMDB test perplexity vs unigram.

    Writes perplexity.csv, curve.csv (+ .json sidecars), figures/train_lm_curve.png,
    figures/train_lm_perplexity.png; checkpoints (HF format, loadable by every pecli command) in
    OUT/models/<pe> or --model-out. Speed on 2 CPU cores: models of the defaults' size (4 x
    128, steps of 16 x 128 tokens, 2 threads) trained at 8,600-11,500 tokens/s in an earlier
    offline run (250 steps, since replaced), so the default 400 steps take 70-95 s per scheme
    and seed, longer on a busy machine; the offline preset's train-lm (15 models of 2 x 64,
    800 steps of 16 x 64 tokens, 9 workers sharing the cores) takes about 5 minutes.

    Examples:
        pecli train lm --pe learned --seeds 1 --model-out models/tiny-gpt2-imdb
        pecli train lm --pe learned --pe none --pe rope --pe alibi --pe sinusoidal --steps 150
        pecli train lm --tokenizer gpt2 --steps 20 --limit 500 --eval-limit 50
        pecli train lm --pe learned,sinusoidal,none,rope,alibi --context 128 --test-lengths 128,256,512,1024
    """
    run_with_progress("train-lm", options, out, force=force)


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli train lm --pe learned,none,alibi",), "small causal LMs on IMDB per scheme: train short, "
             "test long", "perplexity.csv, length.csv", "285 s (train-lm: 3 schemes x 5 seeds, smaller models)", "data")


def register(app: typer.Typer) -> None:
    app.add_typer(train_app, name="train")


def _pm(row) -> str:
    """`value+-half` of a cell's 95 % t interval; the value alone where it has none (seeds agree)."""
    half = (row["ci_high"] - row["ci_low"]) / 2
    return f"{row['value']:.2f}" + ("" if half != half else f"+-{half:.2f}")
