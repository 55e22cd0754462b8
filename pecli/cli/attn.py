"""`pecli attn`: how a model uses position (attention and hidden-state diagnostics)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from pecli.cli.flags import (
    BatchSizeOpt,
    BootstrapOpt,
    DataDirOpt,
    DatasetOpt,
    DeviceOpt,
    DtypeOpt,
    ForceOpt,
    MaskOpt,
    MaskSemanticsOpt,
    OutOpt,
    RopeScalingOpt,
    SeedOpt,
    SplitOpt,
    TextFieldOpt,
    build,
    intervention_option,
)
from pecli.cli.shared import ci_text, run_and_write
from pecli.cli.shared import console as wide_console
from pecli.runs.options import AttnOptions

ModelsArg = Annotated[list[str], typer.Argument(
    help="One or more models, causal or encoder: smollm2, minilm, models/tiny-gpt2-imdb, "
         "random:<family> (pecli models), a checkpoint directory, a hub id.")]
InterventionOpt = intervention_option("intact (the unmodified model; default), zero, ..., crossed with --mask")


def attn(
    models: ModelsArg,
    length: Annotated[int | None, typer.Option(
        min=2, help="Tokens per text: the first T of each document, with the tokenizer's default "
                    "special tokens (shorter documents are skipped and counted; default 64, Gu "
                    "et al.'s).")] = None,
    join: Annotated[bool, typer.Option(
        help="Cut windows of --length tokens from the documents joined by EOS (each wrapped in "
             "the tokenizer's special tokens), for lengths no document reaches.")] = False,
    intervention: InterventionOpt = None,
    mask: MaskOpt = None,
    mask_semantics: MaskSemanticsOpt = None,
    rope_scaling: RopeScalingOpt = None,
    epsilon: Annotated[float | None, typer.Option(
        help="Sink threshold: a head is a sink when its mean attention to the first token "
             "exceeds it (default 0.3, Gu et al.'s).")] = None,
    block: Annotated[int | None, typer.Option(
        min=1, help="Query rows whose attention is computed at once (default 256): memory "
                    "grows with block x length per layer, never with the layers.")] = None,
    buckets: Annotated[int | None, typer.Option(
        min=1, help="Position buckets of the by-position tables (default 16; at most --length).")] = None,
    probe_positions: Annotated[int | None, typer.Option(
        min=0, help="Positions per text the position probe reads, evenly spaced (default 32 or "
                    "--length if shorter; 0: no probe).")] = None,
    hidden: Annotated[bool, typer.Option(
        help="Hidden-state diagnostics: norms by position, positional vectors, the probe.")] = True,
    dataset: DatasetOpt = "imdb",
    split: SplitOpt = None,
    text_field: TextFieldOpt = None,
    limit: Annotated[int | None, typer.Option(
        min=2, help="Texts of at least --length tokens, drawn in a seeded order (default 32).")] = None,
    batch_size: BatchSizeOpt = None,
    bootstrap: BootstrapOpt = 1000,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    data_dir: DataDirOpt = None,
    out: OutOpt = None,
    force: ForceOpt = False,
) -> None:
    """How a model uses position: sink rate, attention entropy and distance, rotary frequency
    usage, positional vectors and a position probe, per layer and head, under every condition.

    attn.csv has one row per (model, condition, scope, layer, head, metric) with a 95 %
    bootstrap interval over texts: sink_rate (Gu et al.'s Sink_1^eps: the share of heads whose
    attention to the first token, averaged over queries, exceeds --epsilon), first_token_mass,
    entropy, mean_distance, previous_token_mass, diagonal_mass (heads named in `role`),
    high_frequency_share. attn_positions.csv: entropy and hidden-state norms by position;
    attn_distance.csv, attn_frequency.csv, attn_positional.csv, attn_probe.csv: see docs/attn.md.
    The intact model comes first; every --intervention x --mask x --mask-semantics is crossed
    with every --rope-scaling. Attention is computed layer by layer in blocks of queries.

    Examples:
        pecli attn smollm2 --dataset imdb --length 64 --intervention zero
        pecli attn models/tiny-gpt2-imdb --intervention zero --mask default,linear,alibi --mask-semantics log-bias
        pecli attn smollm2 --length 12288 --join --limit 4 --rope-scaling yarn:2
    """
    options = build(AttnOptions, "pecli attn", model=models, length=length, join=join,
                    intervention=intervention, mask=mask, mask_semantics=mask_semantics,
                    rope_scaling=rope_scaling, epsilon=epsilon, block=block, buckets=buckets,
                    probe_positions=probe_positions, hidden=hidden, dataset=dataset, split=split,
                    text_field=text_field, limit=limit, batch_size=batch_size, bootstrap=bootstrap,
                    seed=seed, device=device, dtype=dtype, data_dir=data_dir)
    from rich.progress import BarColumn, MofNCompleteColumn, TimeElapsedColumn

    from pecli.experiments.attn import run
    from pecli.measures.intervals import METHOD
    from pecli.runs.progress import progress_bar

    with progress_bar("texts", BarColumn(), MofNCompleteColumn(), "texts x conditions",
                      TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("texts", total=None)

        def advance(n: int, total: int) -> None:
            bar.update(task, advance=n, total=total)

        tables, paths, pngs, _ = run_and_write("attn", run, options, out, progress=advance,
                                               force=force, notes={"intervals": METHOD})
    console = wide_console()
    df = tables["attn"]
    first = df.iloc[0]
    summary = Table(title=f"attn: {first['dataset']}/{first['split']}, {first['rows']} texts of "
                          f"{first['length']} tokens")
    for col in ("model", "condition", "sink rate [95 % CI]", "first-token mass", "entropy",
                "mean distance", "named heads"):
        summary.add_column(col)
    for _, group in df.groupby(["model", "intervention", "mask", "mask_semantics", "rope_scaling"],
                               sort=False, dropna=False):
        whole = group[group["scope"] == "model"].set_index("metric")
        row = whole.loc["sink_rate"]
        label = _condition(row)
        if row["note"]:
            summary.add_row(str(row["model"]), label, row["note"], "", "", "", "")
            continue
        roles = group[group["role"].fillna("") != ""]
        named = ", ".join(f"{r['role'].split()[0]} L{r['layer']}H{r['head']}"
                          for _, r in roles[roles["role"] != "sink head"].head(6).iterrows())
        summary.add_row(str(row["model"]), label, f"{row['value']:.3f}{ci_text(row, '.3f')}",
                        f"{whole.loc['first_token_mass', 'value']:.3f}",
                        f"{whole.loc['entropy', 'value']:.3f}",
                        f"{whole.loc['mean_distance', 'value']:.2f}", named or "-")
    console.print(summary)
    for p in [*paths.values(), *pngs]:
        console.print(f"wrote {p}")


def _condition(row) -> str:
    parts = [str(row["intervention"])]
    if row["mask"] != "default":
        parts.append(f"{row['mask']} mask ({row['mask_semantics']})")
    if str(row.get("rope_scaling", "none")) not in ("none", "nan"):
        parts.append(str(row["rope_scaling"]))
    return ", ".join(parts)


def register(app: typer.Typer) -> None:
    app.command()(attn)
