"""The docs match the code: docs/cli.md is generated from the app (`make docs`), links resolve."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cli_reference_is_current(tmp_path):
    out = tmp_path / "cli.md"
    subprocess.run([sys.executable, "-m", "typer", "pecli.cli.app", "utils", "docs", "--name", "pecli",
                    "--output", str(out)], check=True, capture_output=True, cwd=ROOT)
    names = subprocess.run([sys.executable, "-m", "pecli.cli.docs", "names"], check=True,
                           capture_output=True, text=True, cwd=ROOT).stdout
    from pecli.cli.docs import with_fenced_examples

    page = (ROOT / "docs" / "cli.md").read_text()
    assert with_fenced_examples(out.read_text() + names) == page, "run `make docs`"
    assert "Examples:\n    pecli" not in page  # Markdown would run the examples into one line
    assert "```console\npecli ablate minilm\n" in page


def test_families_table_is_current():
    from pecli.models.architectures import ARCHITECTURES, with_families_table

    page = (ROOT / "docs" / "positions.md").read_text(encoding="utf-8")
    assert with_families_table(page) == page, "run `make docs`"
    for family, spec in ARCHITECTURES.items():
        assert f"| {family} | {spec.position} |" in page


def test_local_links_resolve():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             ROOT / "results" / "offline" / "REPORT.md"]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)", page.read_text(encoding="utf-8")):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_readme_is_a_front_page():
    """Under 12 k characters; the one-minute offline command with its figure (committed);
    a table of commands naming every command of the app, generated from the command modules."""
    from pecli.cli.app import app
    from pecli.cli.docs import with_commands_table

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text) < 12_000, len(text)
    assert "pecli ablate minilm --limit 20 --out runs/first" in text
    assert (ROOT / "docs" / "figures" / "first-run-ablate-layers.png").stat().st_size > 10_000
    table = text[text.index("## Commands"):text.index("## What a run writes")]
    assert with_commands_table(text) == text, "run `make docs` (README's table of commands)"
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    names += [g.name for g in app.registered_groups]
    listed = {"models", "datasets", "cache", "presets", "interventions", "masks"}
    missing = [n for n in names if f"pecli {n}" not in table and n not in listed]
    assert not missing, f"commands missing from the README's table: {missing}"
