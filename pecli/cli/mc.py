"""`pecli mc`: TruthfulQA multiple choice (MC1, MC2) with and without position information."""

from __future__ import annotations

import typer
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, derived
from pecli.cli.shared import ci_text, run_and_write
from pecli.cli.shared import console as wide_console
from pecli.experiments.options.mc import McOptions
from pecli.runs import parallel


@derived(McOptions, "pecli mc")
def mc(options: McOptions, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """TruthfulQA MC1 / MC2 as lm-evaluation-harness scores them, with positions intervened on
    and graded attention masks.

    The context is the harness's six-question QA primer then "Q: {question}\\nA:"; each choice
    " {choice}" is scored by the sum of its tokens' log-likelihoods. MC1: the true (first)
    choice scores highest; MC2: the normalised probability mass of the true choices;
    mc1_norm: MC1 on log-likelihood per character (the harness's acc_norm). The intact
    condition (own positions, default mask) is always the first row.

    Examples:
        pecli mc smollm2 --intervention zero --limit 100
        pecli mc smollm2 --intervention zero --mask linear --mask-semantics log-bias --limit 50
        pecli mc gpt2 --intervention zero,shuffle --dataset my_items.jsonl
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from pecli.experiments.mc import run
    from pecli.measures.intervals import METHOD, PAIRED_MEAN_METHOD
    from pecli.positions.labels import columns
    from pecli.positions.labels import label as condition_label

    console = wide_console()
    with Progress("scoring", BarColumn(), MofNCompleteColumn(), "items x conditions",
                  TimeElapsedColumn(), console=console, transient=True,
                  disable=not console.is_terminal or not parallel.is_main()) as bar:
        task = bar.add_task("scoring", total=None)
        tables, paths, pngs, _ = run_and_write(
            "mc", run, options, out, force=force,
            notes={"interval_unit": "item", "paired_intervals": PAIRED_MEAN_METHOD.replace("texts", "items"),
                   "interval_method": f"per row (column interval_method): Wilson score interval "
                                      f"for right-or-wrong metrics (mc1, mc1_norm); {METHOD} otherwise"},
            progress=lambda n, total: bar.update(task, advance=n, total=total))
    if not parallel.is_main():  # launched on N processes: the main one writes and prints
        return

    df = tables["mc"]
    first = df.iloc[0]
    summary = Table(title=f"TruthfulQA MC: {first['model']} on {first['dataset']} ({first['items']} items, "
                          f"{first['choices_scored']} choices, {first['truncated_pairs']} cut to the "
                          "model's positions)")
    summary.add_column("condition")
    for metric in ("mc1", "mc2", "mc1_norm"):
        summary.add_column(f"{metric} [95 % CI]", justify="right")
    summary.add_column("computed as")
    shown = set()
    for _, group in df.groupby([c for c in columns() if c in df], sort=False, dropna=False):
        row = group.iloc[0]
        if condition_label(row) in shown:  # the default mask is one model under every semantics
            continue
        shown.add(condition_label(row))
        cells = {r["metric"]: f"{r['value']:.3f}{ci_text(r, '.3f')}" + ("~" if r["chance_in_interval"] else "")
                 + ("" if r["diff_vs_intact"] != r["diff_vs_intact"] else
                    f"\nvs intact {r['diff_vs_intact']:+.3f}"
                    + ci_text({"ci_low": r["diff_ci_low"], "ci_high": r["diff_ci_high"]}, "+.3f"))
                 for _, r in group.iterrows()}
        summary.add_row(condition_label(row), cells["mc1"], cells["mc2"], cells["mc1_norm"],
                        f"{row['computation']}, {row['passes']}")
    console.print(summary)
    chance = df.drop_duplicates("metric").set_index("metric")["chance"]
    console.print(f"chance (uniform choice): mc1 {chance['mc1']:.3f}, mc2 {chance['mc2']:.3f}, "
                  f"mc1_norm {chance['mc1_norm']:.3f}; ~: the 95 % interval contains chance (no "
                  "evidence of better than chance); vs intact: paired over items (the same items, "
                  "resampled together)")
    for p in [*paths.values(), *pngs]:
        console.print(f"wrote {p}")


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli mc smollm2 --intervention zero",), "TruthfulQA MC1/MC2 as lm-eval scores them, with and "
             "without positions", "mc.csv, mc_items.csv", "82 s (mc-smollm2: 100 items, 2 conditions)", "data, causal")


def register(app: typer.Typer) -> None:
    app.command()(mc)
