"""A command's flags, derived from its options class (pecli.runs.fields: each option declared
once, with its help text, on its field), and the flags of the command line alone (--out,
--force, --format, --short-titles)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from pathlib import Path
from typing import Annotated

import typer

from pecli.runs.options import OnData, Running

KEYWORD = inspect.Parameter.KEYWORD_ONLY


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


# Every command that draws gets these three (pecli.cli.app.with_figure_options).
FormatOpt = Annotated[str | None, typer.Option(
    "--format", help="Figure format(s): png, pdf, svg (a,b for several, e.g. png,pdf; default "
                     "png; a preset's `format` key otherwise).")]
ShortTitlesOpt = Annotated[bool | None, typer.Option(
    "--short-titles/--full-titles", help="One-line figure titles (what is plotted), for a "
                                         "paper; the full titles, with model and data, go to "
                                         "figures/<name>.json. Default: full titles.")]
AllPanelsOpt = Annotated[bool | None, typer.Option(
    "--all-panels/--summary-panels", help="Figures of a panel per model and condition (attn's "
                                          "heads, positional vectors, norms) draw every one; "
                                          "default: the first, readable at a column's width.")]


def flag(cls, name: str) -> inspect.Parameter:
    """The Typer parameter of option `name` of the options class `cls`: its help, type and
    default from the field's metadata (pecli.runs.fields.option); a deprecated spelling
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
    elif argument is True:  # "optional": an argument that defaults to the options' default
        default = inspect.Parameter.empty
    else:
        default = None if field.default is dataclasses.MISSING else field.default
    shown = meta.pop("help") if "help" in meta else _help(cls, name)
    info = (typer.Argument(**meta) if argument else typer.Option(*decls, **meta))
    info.help = shown
    return inspect.Parameter(named, KEYWORD, default=default,
                             annotation=Annotated[kind, info])


def _help(cls, name: str) -> str | None:
    """The field's help text, or, where a subclass redeclares the field (another default),
    the nearest base class's."""
    for base in cls.__mro__:
        for f in dataclasses.fields(base) if dataclasses.is_dataclass(base) else ():
            if f.name == name and f.metadata.get("help"):
                return f.metadata["help"]
    return None


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
            p = own.pop(name, None)
            if p is None:  # an option of the class (or its deprecated spelling)
                p = flag(cls, name)
                fields[p.name] = name
            params.append(p)
        params += own.values()

        @functools.wraps(command)
        def run(**kwargs):
            flags = {fields[k]: kwargs.pop(k) for k in list(kwargs) if k in fields}
            return command(flags if first == "flags" else build(cls, where, **flags), **kwargs)

        run.__signature__ = inspect.Signature(params, return_annotation=None)
        run.options_class = cls  # docs/cli.md's names, in --help order (pecli.cli.docs)
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return wrap


def build(cls, where: str, **flags):
    """The command's options object from its flags: unset flags (None) take the options'
    defaults; paths become strings. Every check of the options runs here, before loading."""
    given = {k: str(v) if isinstance(v, Path) else v for k, v in flags.items() if v is not None}
    return cls.build(given, where)


# Flags of commands without an options class of their own (pecli reproduce, pecli datasets)
DataDirOpt = flag(Running, "data_dir").annotation
DeviceOpt = flag(Running, "device").annotation
LimitOpt = flag(OnData, "limit").annotation
