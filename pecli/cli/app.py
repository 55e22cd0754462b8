"""pecli command line. Each command module registers itself; this file assembles the app.

    pecli models
    pecli ablate minilm --limit 200
    pecli perplexity smollm2 --mask linear --mask-semantics log-bias --limit 100
    pecli reproduce --preset offline
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import signal
import warnings

import typer

# typer vendors click and exports only BadParameter of its errors: the usage error base
# class has no public name (tests/cli/test_early_validation.py checks the one-line form).
from typer._click.exceptions import NoArgsIsHelpError, UsageError
from typer.core import TyperGroup

from pecli.experiments import REGISTERED
from pecli.runs.errors import PecliError

# What survives Ctrl-C; tables themselves are written only once a run completes, atomically.
ON_INTERRUPT = {
    "reproduce": "finished experiments are saved; rerun the same command to resume",
    "ablate": "no tables were written; the same command resumes from the last checkpoint "
              "(saved every minute)",
    "perplexity": "no tables were written; the same command resumes after the last finished "
                  "condition",
    "length": "no tables were written; the same command resumes after the last finished "
              "condition and length",
}


def _kept(command: str | None) -> str:
    """What the Ctrl-C message may promise: a resume only if progress was saved."""
    if command in ("ablate", "perplexity", "length"):
        from pecli.runs.io import Checkpoint

        if not Checkpoint.resumable():
            return "no tables were written and no progress had been saved yet; a rerun starts afresh"
    return ON_INTERRUPT.get(command, "nothing was written (no partial tables)")


class _PecliGroup(TyperGroup):
    """Turns a PecliError anywhere below into one line on stderr and exit code 1, and a
    command's usage error (unknown flag, value out of range) into one line and exit code 2.

    PECLI_DEBUG=1 shows the traceback instead.
    """

    def invoke(self, ctx):
        warnings.formatwarning = _one_line
        fault = _command_line_fault(self, [*ctx._protected_args, *ctx.args])
        if fault:
            typer.echo(f"error: {fault}", err=True)
            raise typer.Exit(2)
        try:
            return super().invoke(ctx)
        except PecliError as err:
            if os.environ.get("PECLI_DEBUG"):
                raise
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(1) from None
        except UsageError as err:
            if isinstance(err, NoArgsIsHelpError) or err.ctx is None or err.ctx.parent is None:
                raise
            path = err.ctx.command_path
            typer.echo(f"error: {path}: {err.format_message()} (see {path} --help)", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            typer.echo(f"interrupted{_SIGNALLED[0]}: {_kept(ctx.invoked_subcommand)}", err=True)
            raise typer.Exit(_SIGNALLED[1]) from None


def _command_line_fault(group, args: list[str]) -> str | None:
    """What click would read silently wrong, or None: a one-value option given twice
    (`--limit 4 --limit 5`: click keeps the last; list options do repeat) or a path option
    given empty text (`--out ""`: read as the current folder)."""
    command, path = group, ["pecli"]
    while args and args[0] in getattr(command, "commands", {}):
        command, path, args = command.commands[args[0]], [*path, args[0]], args[1:]
    where = " ".join(path)
    options = {name: p for p in getattr(command, "params", ()) if p.param_type_name == "option"
               and not p.is_flag for name in p.opts}
    args = args[:args.index("--")] if "--" in args else args
    given: dict[str, list[str]] = {}
    for i, a in enumerate(args):
        name, eq, inline = a.partition("=")
        p = options.get(name)
        if p is None:
            continue
        value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
        if value is not None and not value.strip() and "Path" in str(_annotation(p)):
            return f"{where}: {p.opts[0]} is empty; give a path or leave the option out"
        if not p.multiple:
            given.setdefault(p.opts[0], []).append(name)
    twice = next((name for name, seen in given.items() if len(seen) > 1), None)
    if twice is None:
        return None
    times = "twice" if len(given[twice]) == 2 else f"{len(given[twice])} times"
    return f"{where}: {twice} given {times}; give it once"


def _annotation(param):
    """The Python type a Typer parameter was declared with (None where click's own)."""
    descriptor = getattr(param, "type_descriptor", None)
    return getattr(descriptor, "annotation", None)


def _one_line(message, category, *args, **kwargs) -> str:
    """Warnings meant for the user (a deprecated option) as `warning: ...` lines."""
    return f"warning: {message}\n"


app = typer.Typer(
    name="pecli",
    cls=_PecliGroup,
    help="Position information in pretrained Transformers: ablate, mask, measure.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

def _version(show: bool) -> None:
    if show:
        from pecli.runs.provenance import git_state, library_versions

        v = library_versions()
        typer.echo(f"pecli {v['pecli_version']} (git {git_state()['git_commit']}; torch "
                   f"{v['torch_version']}, transformers {v['transformers_version']})")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                       help="Show pecli's version and exit.")) -> None:
    """Position information in pretrained Transformers: ablate, mask, measure."""
    from pecli.runs.provenance import git_state

    git_state()  # rows name the commit this process started from, not one made while it ran


for _name, _ in REGISTERED:  # the one table of commands and experiments
    importlib.import_module(f"pecli.cli.{_name}").register(app)


def with_figure_options(command):
    """`command` with --format, --short-titles and --all-panels added: every figure it draws
    (through pecli.plots.style.save) is written in those formats, with those titles and
    panels. The format is checked before the command runs, so a bad one fails before
    anything loads."""
    from pecli.cli.flags import AllPanelsOpt, FormatOpt, ShortTitlesOpt

    if getattr(command, "draws", False):  # a group's commands are wrapped once per process
        return command
    sig = inspect.signature(command, eval_str=True)
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
             for name, kind in (("format", FormatOpt), ("short_titles", ShortTitlesOpt),
                                ("all_panels", AllPanelsOpt))]

    @functools.wraps(command)
    def drawing(*args, format=None, short_titles=None, all_panels=None, **kwargs):
        from pecli.plots.style import figure_output

        with figure_output(format, short_titles, all_panels=all_panels):
            return command(*args, **kwargs)

    drawing.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *added])
    drawing.__annotations__ = {**command.__annotations__, "format": FormatOpt,
                               "short_titles": ShortTitlesOpt, "all_panels": AllPanelsOpt}
    drawing.draws = True
    return drawing


def _drawing_commands(typer_app: typer.Typer):
    """Every command of the app and its groups that writes results (it has --out): these draw."""
    for info in typer_app.registered_commands:
        if info.callback is not None and "out" in inspect.signature(info.callback).parameters:
            yield info
    for group in typer_app.registered_groups:
        yield from _drawing_commands(group.typer_instance)


for _info in _drawing_commands(app):
    _info.callback = with_figure_options(_info.callback)


def _summaries(typer_app: typer.Typer):
    """(info, help text) of every command and group below `typer_app`."""
    for info in typer_app.registered_commands:
        yield info, info.help or inspect.getdoc(info.callback)
    for group in typer_app.registered_groups:
        yield group.typer_instance.info, group.typer_instance.info.help
        yield from _summaries(group.typer_instance)


def _reflowed(help_text: str) -> str:
    """`help_text` with each prose paragraph on one line, for rich to wrap to the terminal:
    Typer keeps a docstring's line breaks, which break again in an 80-column terminal.
    An Examples paragraph keeps its lines."""
    paragraphs = inspect.cleandoc(help_text).split("\n\n")
    return "\n\n".join(p if p.startswith("Examples") else " ".join(p.split()) for p in paragraphs)


for _info, _help in _summaries(app):  # a command list shows each first paragraph, whole
    if isinstance(_help, str):
        _info.help = _reflowed(_help)
        if not isinstance(_info.short_help, str):
            _info.short_help = _info.help.split("\n\n")[0]


_SIGNALLED = ["", 130]  # how the run was stopped: (name for the message, exit status)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled everywhere Ctrl-C is. A subclass, so that Python never
    takes it for an unhandled Ctrl-C and re-kills itself with SIGINT on the way out."""


def _stop(signum, frame) -> None:
    """SIGTERM and SIGHUP stop a run as Ctrl-C does: staging folders removed, locks
    released, checkpoints kept; the exit status is 128 + the signal's number."""
    _SIGNALLED[:] = [f" ({signal.Signals(signum).name})", 128 + signum]
    raise Stopped


def main() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    app()
