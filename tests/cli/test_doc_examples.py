"""Every shell example in README.md and docs/*.md runs, at small sizes, or is marked
illustrative (`<!-- illustrative -->` on the line before its block, or before the blank line
above it).

A block is a fenced one or one indented by four spaces; its `pecli ...` lines (a trailing
`# comment` dropped, `\\` continuations joined) are its examples. Other lines of a block that
has examples (`make setup`, `. .venv/bin/activate`) are the setup this suite itself runs in; a
block of shell commands without any `pecli` line (pip, torchrun, srun, lm-eval's command line)
must be marked. docs/cli.md is generated from `--help`: its synopses are not commands and its
examples are the commands' help examples, which tests/cli/test_help_examples.py parses.

Each example runs in this process (Typer's runner) after an explicit rewrite: the sizes of
SMALL (the flag set, or added, per command), the stand-ins of STAND_INS for names a reader
replaces (a hub checkpoint, your own documents, a run folder of yours), and `--out` in a
temporary folder. The rewrite keeps every name, condition and option the example shows, so
each still checks its own text. Slow (real models, a few seconds each): `-m slow`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pecli.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "cli.md")]
MARK = "<!-- illustrative -->"
SHELL = re.compile(r"\s*(\$ )?(make|pip|python3?|torchrun|accelerate|srun|lm_eval|pecli)\b")
OFFLINE = ROOT / "results" / "offline"

# Small sizes per command: each flag's value set (or the flag added)
SMALL: dict[str, dict[str, str]] = {
    "ablate": {"--limit": "8"},
    "perplexity": {"--limit": "2"},
    "mc": {"--limit": "2"},
    "length": {"--lengths": "64", "--limit": "2"},
    "passkey": {"--lengths": "256", "--trials": "1"},
    "ruler": {"--lengths": "1024", "--samples": "2"},  # cwe's template needs 1,024
    "attn": {"--length": "64", "--limit": "4"},  # --length 32 --limit 2: a traceback (issue 46)
    "lm-eval": {"--limit": "2"},
    "mask fit": {"--train-limit": "2", "--limit": "2", "--steps": "1", "--batch": "2",
                 "--max-length": "32"},
    "finetune": {"--train-limit": "4", "--limit": "4", "--seeds": "2", "--batch": "2",
                 "--max-length": "32"},
    "pe probe": {"--limit": "8", "--max-length": "32"},
    "pe recover": {"--limit": "8", "--max-length": "32", "--tokens": "8"},
    "toy arithmetic": {"--steps": "2", "--max": "5"},
    "train lm": {"--steps": "2", "--limit": "20", "--eval-limit": "4", "--eval-every": "1",
                 "--seeds": "1", "--vocab": "300", "--context": "16", "--layers": "1",
                 "--width": "16", "--heads": "2", "--test-lengths": "16,32"},
}
IF_GIVEN = {"--steps": "1"}  # finetune: a causal LM's steps, set where the example gives them
# Names a reader replaces with their own: a hub checkpoint by its offline stand-in
# (pecli.models.sources.STAND_INS), your documents, your run folders
STAND_INS = {
    "gpt2": "models/tiny-gpt2-imdb", "bert": "minilm",
    "swap:bert-base-uncased": "swap:models/tiny-gpt2-imdb",  # tiny GPT-2's own rows: same width
    "docs.csv": "imdb",
    "runs/ablate/A": str(OFFLINE / "passkey-smollm2"),
    "runs/ablate/B": str(OFFLINE / "remedies-passkey-smollm2"),
}
FITTED = "runs/mask-fit/<run>/mask/mask.json"  # the block's last `mask fit`, else the committed one
COMMITTED_MASK = str(OFFLINE / "mask-fit-tiny-gpt2" / "mask" / "mask.json")


def blocks(text: str) -> list[tuple[int, list[str], bool]]:
    """(first line, lines, marked illustrative) of each fenced or indented code block."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        above = [ln for ln in lines[max(0, i - 2):i] if ln.strip()][-1:]
        marked = bool(above) and MARK in above[0]
        if lines[i].startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append((i + 1, lines[i + 1:j], marked))
            i = j + 1
        elif lines[i].startswith("    ") and lines[i].strip() and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            out.append((i + 1, [ln[4:] for ln in lines[i:j]], marked))
            i = j
        else:
            i += 1
    return out


def examples(body: list[str]) -> list[str]:
    joined = "\n".join(body).replace("\\\n", " ")
    return [re.sub(r"\s+#.*$", "", ln.strip().removeprefix("$ ")) for ln in joined.splitlines()
            if re.match(r"\s*(\$ )?pecli ", ln)]


def _all() -> tuple[list, list]:
    """(runnable examples as (where, block id, command), unmarked blocks without examples)."""
    runnable, unmarked = [], []
    for doc in DOCS:
        for line, body, marked in blocks(doc.read_text()):
            where = f"{doc.relative_to(ROOT)}:{line}"
            found = examples(body)
            if marked:
                continue
            if found:
                runnable += [(where, c) for c in found]
            elif any(SHELL.match(ln) for ln in body):
                unmarked.append(where)
    return runnable, unmarked


def rewritten(command: str, out: Path, fitted: str | None) -> list[str]:
    """The example's arguments at small sizes, with stand-ins and --out in `out`."""
    args = [",".join(STAND_INS.get(p, p) for p in a.split(",")) for a in shlex.split(command)[1:]]
    args = [a.replace(FITTED, fitted or COMMITTED_MASK) for a in args]
    name = " ".join(args[:2]) if " ".join(args[:2]) in SMALL else args[0]
    for flag, value in IF_GIVEN.items():  # options of one kind of model only
        if flag in args and name in ("finetune",):
            args[args.index(flag) + 1] = value
    for flag, value in SMALL.get(name, {}).items():
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    if "--out" in args:
        del args[args.index("--out"):args.index("--out") + 2]
    if name not in ("interventions", "masks"):
        args += ["--out", str(out)]
    return args


def test_every_shell_block_has_examples_or_is_marked_illustrative():
    runnable, unmarked = _all()
    assert not unmarked, f"shell blocks with no pecli example, not marked {MARK}: {unmarked}"
    assert len(runnable) > 30


def _grouped() -> list[tuple[str, list[str]]]:
    """The examples by block, each command once (usage.md repeats the other pages')."""
    by: dict[str, list[str]] = {}
    seen: set[tuple] = set()
    for where, command in _all()[0]:
        key = tuple(rewritten(command, Path("out"), None))
        if key not in seen or FITTED in command:
            seen.add(key)
            by.setdefault(where, []).append(command)
    return list(by.items())


@pytest.mark.slow
@pytest.mark.parametrize("where, commands", _grouped(), ids=[w for w, _ in _grouped()])
def test_the_examples_of_a_block_run(where, commands, tmp_path, shared_data, monkeypatch):
    monkeypatch.chdir(ROOT)
    runner, fitted = CliRunner(), None
    for i, command in enumerate(commands):
        out = tmp_path / str(i)
        args = rewritten(command, out, fitted)
        result = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert result.exit_code == 0, f"{where}: {command}\nran as: pecli {shlex.join(args)}\n{result.output}"
        if args[:2] == ["mask", "fit"]:
            fitted = str(out / "mask" / "mask.json")
