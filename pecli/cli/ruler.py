"""`pecli ruler`: RULER's synthetic long-context tasks by length, under every condition."""

from __future__ import annotations

import typer
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, derived
from pecli.cli.shared import ci_text, counter, run_and_write
from pecli.cli.shared import console as wide_console
from pecli.experiments.ruler import DIFF_INTERVAL, INTERVAL, SAMPLES_JSONL, RulerOptions
from pecli.runs import parallel


@derived(RulerOptions, "pecli ruler")
def ruler(options: RulerOptions, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """RULER's synthetic tasks (Hsieh et al. 2024): needles in a haystack, variable tracking,
    common and frequent words, read back by greedy decoding.

    RULER's templates, answer prefixes, needle counts and new tokens, with a haystack from the
    data directory (docs/ruler.md says where pecli differs and why). Each sample has its own
    haystack slice, needles and depth (seeded: the same under every condition and run); no
    answer occurs in its haystack by chance. ruler.csv: mean recall of the expected strings
    with a 95 % interval over samples per (model, condition, task, length), and each
    condition's difference from intact on the same samples with its paired interval;
    ruler_samples.csv and ruler_samples.jsonl: every sample, what the model read and answered.
    The intact model comes first; every --intervention (remedies included) and --mask is
    crossed with every --rope-scaling.

    Examples:
        pecli ruler smollm2 --tasks niah_single_1,niah_multikey_1,vt,cwe --lengths 1024,4096
        pecli ruler smollm2 --lengths 8192 --intervention selfextend:4:2048 --rope-scaling yarn:4
        pecli ruler random:llama --tasks vt,fwe --lengths 512 --samples 3
    """
    from pecli.experiments.ruler import run
    from pecli.positions.labels import label as condition_label
    with counter("decoding", "samples") as advance:
        tables, paths, pngs, _ = run_and_write(
            "ruler", run, options, out, progress=advance, force=force,
            notes={"intervals": f"{INTERVAL}; {DIFF_INTERVAL}", "interval_unit": "sample"})
    if not parallel.is_main():
        return
    console = wide_console()
    jsonl = paths["ruler_samples"].with_name(SAMPLES_JSONL)  # written with the tables
    df = tables["ruler"]
    summary = Table(title=f"ruler: mean recall [95 % CI] per task and length; {options.samples} "
                          "samples per cell; under it, the paired difference from intact")
    lengths = list(dict.fromkeys(df["length"]))
    for col in ("model", "condition", "task", *(f"{n:,}" for n in lengths)):
        summary.add_column(col, justify="left" if col in ("model", "condition", "task") else "right")
    for (model, _, task), cells in df.groupby(["model", "condition", "task"], sort=False):
        by = cells.set_index("length")
        shown = [by.loc[n, "note"] or f"{by.loc[n, 'value']:.0%}" + ci_text(by.loc[n], ".0%") + _difference(by.loc[n])
                 for n in lengths]
        summary.add_row(str(model), condition_label(cells.iloc[0]), task, *shown)
    console.print(summary)
    for p in [*paths.values(), jsonl, *pngs]:
        console.print(f"wrote {p}")


def _difference(row) -> str:
    """A cell's paired difference from intact, on a line of its own ('' where there is none)."""
    diff, low, high = (float(row[c]) for c in ("diff_vs_intact", "diff_ci_low", "diff_ci_high"))
    return "" if diff != diff else f"\nvs intact {diff:+.0%}" + ci_text({"ci_low": low, "ci_high": high}, "+.0%")


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli ruler smollm2 --lengths 1024,4096 --samples 2",), "does the model still "
             "retrieve, track and aggregate (RULER's tasks) at each length?",
             "ruler.csv, ruler_samples.csv/.jsonl",
             "34 min (4 tasks, 2 lengths, 1 condition; 9.6 min CPU, a loaded machine); 20 samples "
             "about 10x", "causal, data")


def register(app: typer.Typer) -> None:
    app.command()(ruler)
