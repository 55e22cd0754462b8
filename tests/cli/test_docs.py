"""docs/cli.md is generated from the app (`make docs`): it must match the code."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cli_reference_is_current(tmp_path):
    out = tmp_path / "cli.md"
    subprocess.run([sys.executable, "-m", "typer", "pecli.cli", "utils", "docs", "--name", "pecli",
                    "--output", str(out)], check=True, capture_output=True, cwd=ROOT)
    assert out.read_text() == (ROOT / "docs" / "cli.md").read_text(), "run `make docs`"
