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
    names = subprocess.run([sys.executable, "-m", "pecli.runs.options"], check=True, capture_output=True,
                           text=True, cwd=ROOT).stdout
    assert out.read_text() + names == (ROOT / "docs" / "cli.md").read_text(), "run `make docs`"


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
