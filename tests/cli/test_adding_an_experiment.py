"""Adding an experiment touches four files (CONTRIBUTING.md, "Worked example: adding an
experiment"): its module (options class, run, `register` with its headlines), its row of
`REGISTERED`, its command module (with its README row) and its figures module.

The test writes exactly those four for a throwaway `drift` (three modules in a temporary
folder added to the paths of pecli.experiments, pecli.cli and pecli.plots; its REGISTERED row
appended before the app is assembled) and uses it, in a fresh interpreter, as a user would:
`pecli --help` still imports neither pandas nor torch, its flags come from its options class,
the command writes its table and figure, a preset entry builds and runs it, `pecli compare`
reads its folder (through its registered headline: a folder without one is refused), and
`make docs` gives it its README row. Nothing else is edited; if any of these needed a fifth
file (a table of headlines in compare.py, a hand-written README row, the options in
pecli/runs/options.py), this fails.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

EXPERIMENT = '''
"""How far a walk drifts: a throwaway experiment (tests/cli/test_adding_an_experiment.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pecli.experiments import Headline, register
from pecli.runs.fields import Options, option


@dataclass(frozen=True)
class DriftOptions(Options):
    """`pecli drift` and the `drift` experiment."""

    FLAGS: ClassVar[str] = "steps seed out force"

    steps: int = option(3, low=1, help="Steps of the walk.")
    seed: int = option(0, low=0, help="Seed of the walk.")


def run(options: DriftOptions, progress=None):
    import pandas as pd  # heavy imports inside run(): `pecli --help` stays light

    from pecli.runs.provenance import row_provenance
    from pecli.runs.tables import validate

    rows = [{"experiment": "drift", "model": "walk", "intervention": name, "metric": "distance",
             "value": float(sum(range(options.steps))) * keep, "ci_low": 0.0, "ci_high": 99.0,
             "seed": options.seed} for name, keep in (("intact", 1), ("zero", 0))]
    return {"drift": validate(pd.DataFrame(rows).assign(**row_provenance()), model_rows=False)}


register("drift", 1, run, DriftOptions, "pecli.plots.drift:figures", "how far a walk drifts",
         headlines=(Headline("distance", "distance walked", name="drift_distance",
                             interval="95 % interval of the walk"),))
'''

COMMAND = '''
"""`pecli drift`: how far a walk drifts."""

from __future__ import annotations

import typer

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, derived
from pecli.cli.shared import run_and_write
from pecli.experiments.drift import DriftOptions


@derived(DriftOptions, "pecli drift")
def drift(options: DriftOptions, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """How far a walk drifts.

    Examples:
        pecli drift --steps 4
    """
    from pecli.experiments.drift import run

    tables, paths, pngs, _ = run_and_write("drift", run, options, out, force=force)
    typer.echo(f"drift: {tables['drift']['value'].max():g} after {options.steps} steps")


README = Row(("pecli drift --steps 4",), "how far does a walk drift?", "drift.csv, a figure", "seconds")


def register(app: typer.Typer) -> None:
    app.command()(drift)
'''

FIGURES = '''
"""The drift figure, from the written drift.csv."""

import matplotlib.pyplot as plt

from pecli.plots.style import drawn, save


def _bars(df, path):
    fig, ax = plt.subplots()
    ax.bar(df["intervention"], df["value"])
    return save(fig, path)


def figures(csv_paths, fig_dir):
    return drawn(csv_paths, fig_dir, {"drift": (_bars, "drift.png")})
'''

SCRIPT = '''
import json, sys
from pathlib import Path

import pecli.cli, pecli.experiments, pecli.plots

tmp = Path(sys.argv[1])
for package in (pecli.experiments, pecli.cli, pecli.plots):
    package.__path__.append(str(tmp / package.__name__.split(".")[1]))
pecli.experiments.REGISTERED += (("drift", ("drift",)),)  # its row

from typer.testing import CliRunner

from pecli.cli.app import app

seen = {"heavy_at_start": sorted(m for m in ("pandas", "torch", "transformers") if m in sys.modules)}
runner = CliRunner()
invoke = lambda *args: runner.invoke(app, list(args))
seen["help"] = invoke("--help").output
seen["drift_help"] = invoke("drift", "--help").output
bad = invoke("drift", "--steps", "0")
seen["bad"] = [bad.exit_code, bad.output]
ran = invoke("drift", "--steps", "4", "--out", str(tmp / "run"))
seen["ran"] = [ran.exit_code, ran.output]
compared = invoke("compare", str(tmp / "run"), "--out", str(tmp / "compare"))
seen["compared"] = [compared.exit_code, compared.output]

from pecli.cli.docs import commands_markdown
from pecli.experiments import EXPERIMENTS

seen["readme"] = commands_markdown()
seen["preset"] = EXPERIMENTS.get("drift").run_with({"steps": 2}, "a preset")["drift"]["value"].tolist()
print(json.dumps(seen))
'''


def test_an_experiment_in_four_files_works_end_to_end(tmp_path):
    for folder, text in (("experiments", EXPERIMENT), ("cli", COMMAND), ("plots", FIGURES)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "drift.py").write_text(textwrap.dedent(text), encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])

    assert seen["heavy_at_start"] == []  # its options class came with its module, light
    assert "drift" in seen["help"] and "How far a walk drifts." in seen["help"]
    assert "--steps" in seen["drift_help"] and "Steps of the walk." in seen["drift_help"]
    assert seen["bad"][0] != 0 and "steps (--steps): 0 is out of range" in seen["bad"][1]
    assert seen["ran"][0] == 0, seen["ran"][1]
    assert "drift: 6 after 4 steps" in seen["ran"][1]  # 0 + 1 + 2 + 3
    assert (tmp_path / "run" / "drift.csv").is_file()
    assert (tmp_path / "run" / "figures" / "drift.png").stat().st_size > 0
    assert seen["preset"] == [1.0, 0.0]

    assert seen["compared"][0] == 0, seen["compared"][1]
    rows = (tmp_path / "compare" / "compare.csv").read_text(encoding="utf-8").splitlines()
    header = rows[0].split(",")
    got = [dict(zip(header, r.split(","), strict=False)) for r in rows[1:]]
    assert [(r["metric"], r["condition"], float(r["value"]), r["interval"]) for r in got] == [
        ("drift_distance", "intact", 6.0, "95 % interval of the walk"),
        ("drift_distance", "zero", 0.0, "95 % interval of the walk")]
    assert (tmp_path / "compare" / "figures" / "compare_drift_distance.png").is_file()

    assert ("| `pecli drift --steps 4` | how far does a walk drift? | drift.csv, a figure | seconds | — |"
            in seen["readme"].splitlines())
