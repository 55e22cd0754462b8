"""`pecli mask fit`: a mask of a small form fitted to stand in for removed positions."""

from __future__ import annotations

import math

import typer
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, derived
from pecli.cli.shared import ci_text, run_and_write
from pecli.cli.shared import console as wide_console
from pecli.experiments.options.mask_fit import MaskFitOptions
from pecli.runs import parallel

mask_app = typer.Typer(name="mask", no_args_is_help=True,
                       help="Masks that stand in for positions: fit one (see also pecli masks).")


@derived(MaskFitOptions, "pecli mask fit")
def fit(options: MaskFitOptions, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """Fit a mask of a small form to stand in for removed positions; judge it on held-out texts.

    The model is frozen and its positions removed (zero); the mask's few parameters are fitted
    by Adam on IMDB train texts through transformers' attention (read as log-bias: an additive
    bias on the logits). Written to OUT/mask/mask.json, which `pecli perplexity`, `length`,
    `mc` and `lm-eval` take back as `--mask FILE` (the name carries the file's sha256). Judged on
    held-out texts against the intact model, no positions (default mask), the study's linear
    mask under each semantics and ALiBi's fixed slopes: corpus perplexity with a 95 % bootstrap
    interval over texts, and the share of the gap closed, (zero - x) / (zero - intact) in log
    perplexity.

    Examples:
        pecli mask fit models/tiny-gpt2-imdb --form bucket
        pecli mask fit smollm2 --form slope --steps 30 --max-length 128 --limit 32
        pecli perplexity models/tiny-gpt2-imdb --intervention zero --mask runs/fit/mask/mask.json --mask-semantics log-bias
    """
    from pecli.experiments.mask_fit import run

    console = wide_console(log_path=False)
    with console.status("fitting") as bar:
        say = (lambda msg: (bar.update(msg), console.log(msg))) if parallel.is_main() else None
        frames, tables, figures, recorded = run_and_write("mask-fit", run, options, out,
                                                          save_dir="mask", announce=say, force=force)
    if not parallel.is_main():
        return
    df = frames["mask_fit"]
    df = df[df["metric"] == "perplexity"]
    first = df.iloc[0]
    summary = Table(title=f"mask fit: {first['model']}, form {first['form']} "
                          f"({first['fitted_parameters']} fitted parameters, "
                          f"{first['train_rows']} IMDB train texts)")
    for col in ("held-out set", "condition", "perplexity [95 % CI]", "gap closed [95 % CI]"):
        summary.add_column(col, justify="left" if col in ("held-out set", "condition") else "right")
    for _, row in df.iterrows():
        summary.add_row(f"{row['dataset']}/{row['split']}", row["condition"],
                        _num(row["value"]) + ci_text(row, _num),
                        _gap(row))
    console.print(summary)
    for line in reliance(df):
        console.print(line)
    console.print(f"mask file: {recorded.save_dir}/mask.json (give it back as --mask: it runs "
                  "under the log-bias semantics it was fitted with)")
    for p in [*tables.values(), *figures]:
        console.print(f"wrote {p}")


def reliance(df) -> list[str]:
    """Per held-out set, what removing positions costs, and a warning where it is not detectably
    worse than intact (no-positions interval reaching the intact point): no gap worth closing."""
    lines, model = [], str(df.iloc[0]["model"])
    for name, part in df.groupby("dataset", sort=False):
        got = {row["condition"]: row for _, row in part.iterrows()}
        if "intact" not in got or "no positions" not in got:
            continue
        intact, zero = got["intact"], got["no positions"]
        cost = f"{zero['value'] / intact['value'] - 1:+.1%}"
        lines.append(f"reliance on positions, {name}: perplexity {_num(intact['value'])} intact, "
                     f"{_num(zero['value'])} without ({cost})")
        if not zero["ci_low"] > intact["value"]:  # NaN (no interval) warns too
            lines.append(f"warning: {model} barely relies on its positions on {name} (the "
                         "no-positions interval reaches the intact perplexity): the gap closed "
                         "measures little; use a model that needs its positions (models/gpt2-imdb)")
    return lines


def _gap(row) -> str:
    if math.isnan(row["gap_closed"]):  # no positions not worse than intact: no gap to close
        return "undefined (no gap)"
    return f"{row['gap_closed']:+.1%}" + ci_text({"ci_low": row["gap_ci_low"], "ci_high": row["gap_ci_high"]}, "+.1%")


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli mask fit",), "fit a small mask that stands in for removed positions", "mask file, tables",
             needs="data")


def register(app: typer.Typer) -> None:
    mask_app.command()(fit)
    app.add_typer(mask_app, name="mask")
