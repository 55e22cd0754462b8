"""`pecli perplexity` (study E2, E3) and `pecli masks` (the mask shapes and semantics)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pecli.cli_options import (
    BatchSizeOpt,
    DataDirOpt,
    DeviceOpt,
    DtypeOpt,
    LimitOpt,
    ModelArg,
    OutOpt,
    SeedOpt,
    SplitOpt,
    TextOpt,
)
from pecli.commands import console as wide_console

PeOpt = Annotated[list[str] | None, typer.Option(
    "--pe", help="Position intervention(s): learned (none), zero, ... (repeat or a,b; see pecli interventions). Default: learned.")]
MaskOpt = Annotated[list[str] | None, typer.Option(
    "--mask", help="Mask shape(s): default, linear, exponential, alibi, self (repeat or a,b; see pecli masks). Default: default.")]
SemanticsOpt = Annotated[list[str] | None, typer.Option(
    "--mask-semantics", help="What a mask weight does: legacy (transformers 4.x), boolean (5.x), "
                             "log-bias, scale (repeat or a,b; docs/masks.md). Default: legacy.")]
ProtocolOpt = Annotated[list[str] | None, typer.Option(
    "--protocol", help="relative (each query weighs its own prefix, one pass) or study "
                       "(one pass per predicted token, one 1-D key mask) (repeat or a,b). Default: relative.")]


def perplexity(
    model: ModelArg,
    pe: PeOpt = None,
    mask: MaskOpt = None,
    mask_semantics: SemanticsOpt = None,
    protocol: ProtocolOpt = None,
    dataset: Annotated[str, typer.Option(help="truthfulqa, imdb, or a CSV/JSONL/parquet file.")] = "truthfulqa",
    split: SplitOpt = None,
    text: TextOpt = None,
    limit: LimitOpt = None,
    start_token: Annotated[bool, typer.Option(
        help="Prepend the tokenizer's start token and score the first token too (evaluate's "
             "add_start_token).")] = True,
    long_text: Annotated[str, typer.Option(
        help="Texts longer than the model's positions: truncate, or window (sliding, see --stride).")] = "truncate",
    stride: Annotated[int | None, typer.Option(help="Window step for --long-text window (default: half the positions).")] = None,
    batch_size: BatchSizeOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    data_dir: DataDirOpt = None,
    out: OutOpt = None,
) -> None:
    """Perplexity of a causal LM with its positions intervened on and graded attention masks.

    Every aggregation (corpus, mean/median per text as `evaluate` does, mean per token) is a
    named row; every row names its intervention, mask, semantics and protocol. The grid is
    the product of the --pe, --mask, --mask-semantics and --protocol values.

    Examples:
        pecli perplexity smollm2 --mask linear --mask-semantics log-bias --limit 100
        pecli perplexity smollm2 --pe learned --pe zero --mask default --mask linear --protocol relative,study --limit 50
        pecli perplexity gpt2 --pe zero --mask linear --mask-semantics legacy
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from pecli.experiments.perplexity import HEADLINE, as_list, run
    from pecli.io import default_out_dir, write_table
    from pecli.plots.perplexity import condition_label, figures

    options = dict(model=model, pe=as_list(pe or "learned", "intervention"),
                   masks=as_list(mask or "default", "mask"),
                   semantics=as_list(mask_semantics or "legacy", "mask semantics"),
                   protocol=as_list(protocol or "relative", "protocol"),
                   dataset=dataset, split=split, text_field=text, limit=limit, seed=seed,
                   device=device, dtype=dtype, data_dir=str(data_dir) if data_dir else None,
                   batch_size=batch_size, add_start_token=start_token, long_text=long_text,
                   stride=stride)
    console = wide_console()
    with Progress("scoring", BarColumn(), MofNCompleteColumn(), "tokens", TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("scoring", total=None)

        def advance(n: int, total: int) -> None:
            bar.update(task, advance=n, total=total)

        tables = run(**options, progress=advance)

    out_dir = Path(out) if out else default_out_dir("perplexity")
    paths = {name: write_table(df, out_dir, name, {"command": "perplexity", **options})
             for name, df in tables.items()}
    pngs = figures(paths, out_dir / "figures")

    df = tables["perplexity"]
    first = df.iloc[0]
    summary = Table(title=f"perplexity: {first['model']} on {first['dataset']}/{first['split']} "
                          f"({first['rows']} texts, {first['tokens']} scored tokens, start token "
                          f"{first['start_token']}, {first['truncated']} truncated)")
    summary.add_column("condition")
    for col in ("corpus", "mean_per_text", "median_per_text", "mean_per_token"):
        summary.add_column(col + (" *" if col == HEADLINE else ""), justify="right")
    summary.add_column("computed as")
    shown = set()
    for _, group in df.groupby(["intervention", "mask", "mask_semantics", "protocol"], sort=False):
        values = dict(zip(group["aggregation"], group["value"], strict=True))
        row = group.iloc[0]
        if condition_label(row) in shown:  # the default mask is one model under every semantics
            continue
        shown.add(condition_label(row))
        summary.add_row(condition_label(row), *(f"{values[a]:,.4f}" for a in
                        ("corpus", "mean_per_text", "median_per_text", "mean_per_token")),
                        f"{row['computation']}, {row['passes']}")
    console.print(summary)
    console.print(f"* headline: {HEADLINE} = exp(token-weighted mean NLL); mean_per_text is "
                  "evaluate's mean_perplexity")
    for p in [*paths.values(), *pngs]:
        console.print(f"wrote {p}")


def masks() -> None:
    """List mask shapes (with their weights for q = 5), semantics and protocols.

    Examples:
        pecli masks
        pecli perplexity smollm2 --mask linear --mask-semantics log-bias --limit 20
    """
    from pecli.lm_scoring import PROTOCOLS
    from pecli.masks import SEMANTICS, SHAPES, key_weights

    console = wide_console()
    shapes = Table(title="mask shapes: m(q, k), newest key last")
    for col in ("name", "m(5, k), k = 1..5", "description"):
        shapes.add_column(col)
    for name, shape in SHAPES.items():
        w = key_weights(name, 5, heads=1)[0]
        shapes.add_row(name, " ".join(f"{v:.2f}" for v in w.tolist()), shape.description
                       + (" (alibi: head 1 of 1 shown)" if name == "alibi" else ""))
    console.print(shapes)
    sems = Table(title="mask semantics (--mask-semantics)")
    for col in ("name", "what a weight m does", "reproduces"):
        sems.add_column(col)
    for name, sem in SEMANTICS.items():
        sems.add_row(name, sem.description, sem.transformers)
    console.print(sems)
    console.print("protocols (--protocol): " + ", ".join(PROTOCOLS)
                  + "; see docs/masks.md")


def register(app: typer.Typer) -> None:
    app.command()(perplexity)
    app.command()(masks)
