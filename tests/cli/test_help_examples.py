"""Every command's help examples parse: their options exist and their values are accepted."""

from __future__ import annotations

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
