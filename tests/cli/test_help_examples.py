"""Every command's help examples parse: their options exist and their values are accepted."""

from __future__ import annotations

import inspect
import re
import shlex

import pytest
import typer

from pecli.cli.app import app


def _examples():
    root = typer.main.get_command(app)
    out = []

    def walk(group, prefix):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):  # a group (pe, train, toy)
                walk(cmd, prefix + [name])
                continue
            block = re.search(r"Examples:\n((?:[ \t]+pecli.*\n?)+)", cmd.help or "")
            assert block, f"`pecli {' '.join(prefix + [name])}` has no examples in its help"
            out.extend((cmd, line.strip()) for line in block.group(1).strip().splitlines())

    walk(root, [])
    return out


@pytest.mark.parametrize("cmd, example", _examples(), ids=lambda x: x if isinstance(x, str) else "")
def test_help_example_parses(cmd, example):
    args = shlex.split(example)[1:]
    while args and args[0] != cmd.name:  # drop the group names: `pe probe ...` -> `probe ...`
        args.pop(0)
    ctx = cmd.make_context(cmd.name, args[1:], resilient_parsing=False)
    assert ctx.params is not None


def _commands(group, prefix=()):
    for name, cmd in group.commands.items():
        yield " ".join((*prefix, name)), cmd
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*prefix, name))


@pytest.mark.parametrize("path, cmd", list(_commands(typer.main.get_command(app))),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_a_command_list_shows_the_first_paragraph_whole_on_one_line(path, cmd):
    """Typer's rich command list keeps a docstring's line breaks, and click's cuts a summary
    at 45 characters (docs/cli.md): each row gives the first paragraph, unbroken and whole."""
    first = " ".join(inspect.cleandoc(cmd.help or "").split("\n\n")[0].split())
    assert first, f"`pecli {path}` has no help"
    assert cmd.get_short_help_str() == first


@pytest.mark.parametrize("path, cmd", list(_commands(typer.main.get_command(app))),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_help_prose_fills_an_80_column_terminal(path, cmd):
    """Typer keeps a docstring's line breaks; at 80 columns each ~90-character source line broke
    again into a long and a short one. Rendered at 80 columns, every line of a prose paragraph
    but its last is full: the next line's first word would not have fitted on it (rich pads
    the text by a column each side). Examples keep their lines."""
    from typer.testing import CliRunner

    shown = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "80"}).output
    description = shown.split("╭")[0].splitlines()[3:]  # after the usage line, before the panels
    paragraphs = "\n".join(line.strip() for line in description).split("\n\n")
    for paragraph in (p for p in paragraphs if p.strip() and not p.startswith("Examples")):
        lines = paragraph.strip().splitlines()
        for line, following in zip(lines, lines[1:], strict=False):
            assert len(line) + 1 + len(following.split()[0]) > 78 - 2, (
                f"`pecli {path} --help` breaks a line short at 80 columns: {line!r}")


@pytest.mark.parametrize("path, cmd", [(p, c) for p, c in _commands(typer.main.get_command(app))
                                       if not hasattr(c, "commands")],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_every_option_says_what_it_does(path, cmd):
    """`pecli reproduce --device` showed no help at all (its flag was wrapped as `DeviceOpt |
    None`, which Typer reads without the option's metadata)."""
    silent = [p.opts[0] for p in cmd.params  # Typer's own click: its options, not arguments
              if p.param_type_name == "option" and not p.hidden and not (p.help or "").strip()]
    assert not silent, f"`pecli {path}`: {', '.join(silent)} have no help"
