"""`pecli perplexity` (study E2, E3) and `pecli masks` (the mask shapes and semantics)."""

from __future__ import annotations

import typer
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, derived
from pecli.cli.shared import ci_text, counter, run_and_write
from pecli.cli.shared import console as wide_console
from pecli.experiments.options.perplexity import PerplexityOptions
from pecli.runs import parallel
from pecli.runs.numbers import decimals, number


@derived(PerplexityOptions, "pecli perplexity")
def perplexity(options: PerplexityOptions, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """Perplexity of a causal LM with its positions intervened on and graded attention masks.

    The intact model (its own positions, default mask) always comes first. Without
    --intervention, a --mask SHAPE runs the study's E3: (own positions, default mask), (no
    positions = zero, default mask), (zero, SHAPE); with gpt2 on TruthfulQA the study's
    numbers are shown beside them. An explicit --intervention is crossed with every --mask.
    Every aggregation (corpus, mean/median per text as `evaluate` does, mean per token) is a
    named row with a 95 % bootstrap interval over texts; every row names its intervention,
    mask, semantics and protocol.

    Examples:
        pecli perplexity gpt2 --mask linear
        pecli perplexity smollm2 --mask linear --mask-semantics log-bias --limit 100
        pecli perplexity smollm2 --intervention intact,zero --mask default,linear --protocol relative,study --limit 50
    """
    from pecli.experiments.perplexity import run
    from pecli.measures.intervals import METHOD, PAIRED_METHOD

    with counter("scoring", "tokens") as advance:  # piped: plain lines
        tables, paths, pngs, _ = run_and_write("perplexity", run, options, out, progress=advance, force=force,
                                               notes={"intervals": METHOD, "interval_unit": "text",
                                                      "paired_intervals": PAIRED_METHOD})
    if not parallel.is_main():  # launched on N processes: the main one writes and prints
        return
    console = wide_console()
    _summary(console, tables["perplexity"])
    for p in [*paths.values(), *pngs]:
        console.print(f"wrote {p}")


def _summary(console, df) -> None:
    """One row per condition: every aggregation, the headline with its interval."""
    from pecli.experiments.perplexity import HEADLINE
    from pecli.positions.labels import columns
    from pecli.positions.labels import label as condition_label

    first = df.iloc[0]
    summary = Table(title=f"perplexity: {first['model']} on {first['dataset']}/{first['split']} "
                          f"({first['rows']} texts, {first['tokens']} scored tokens, start token "
                          f"{first['start_token']}, {first['truncated']} truncated)")
    summary.add_column("condition", no_wrap=True)
    aggregations = ("corpus", "mean_per_text", "median_per_text", "mean_per_token")
    for col in aggregations:
        summary.add_column(col + (" * [95 % CI]" if col == HEADLINE else ""), justify="right")
    paired = "diff_vs_intact" in df and df["diff_vs_intact"].notna().any()
    if paired:
        summary.add_column(f"{HEADLINE} - intact [paired 95 % CI]", justify="right")
    study = df["study_value"].notna().any()
    if study:
        summary.add_column("study (gpt2)", justify="right")
    summary.add_column("computed as")
    shown = set()
    digits = {a: decimals(part["value"], part["ci_low"], part["ci_high"])
              for a, part in df.groupby("aggregation")}  # one count per column
    for _, group in df.groupby([c for c in columns() if c in df], sort=False, dropna=False):
        by = group.set_index("aggregation")
        row = group.iloc[0]
        if condition_label(row) in shown:  # the default mask is one model under every semantics
            continue
        shown.add(condition_label(row))
        cells = [number(by.loc[a, "value"], digits[a]) + (ci_text(by.loc[a], lambda x, a=a: number(x, digits[a]))
                                                           if a == HEADLINE else "")
                 for a in aggregations]
        if paired:
            head = by.loc[HEADLINE]
            cells.append("" if head["diff_vs_intact"] != head["diff_vs_intact"] else
                         f"{head['diff_vs_intact']:+,.{digits[HEADLINE]}f}"
                         + ci_text({"ci_low": head["diff_ci_low"], "ci_high": head["diff_ci_high"]},
                                   f"+,.{digits[HEADLINE]}f"))
        if study:
            cells.append("" if row["study_value"] != row["study_value"] else f"{row['study_value']:,}")
        summary.add_row(condition_label(row), *cells, f"{row['computation']}, {row['passes']}")
    console.print(summary)
    console.print(f"* headline: {HEADLINE} = exp(token-weighted mean NLL); mean_per_text is "
                  "evaluate's mean_perplexity; [95 % bootstrap interval over texts] (every aggregation's in "
                  "the table: ci_low, ci_high; the paired difference from intact, texts resampled in pairs: "
                  "diff_vs_intact, diff_ci_low, diff_ci_high)"
                  + ("; study: its reported number (aggregation not stated; transformers 4.x)"
                     if study else ""))


def masks() -> None:
    """List mask shapes (with their weights for q = 5), semantics and protocols.

    Examples:
        pecli masks
        pecli perplexity smollm2 --mask linear --mask-semantics log-bias --limit 20
    """
    from pecli.positions.masks import key_weights
    from pecli.runs.names import MASK_SEMANTICS, MASKS, PROTOCOLS

    console = wide_console()
    shapes = Table(title="mask shapes (--mask): m(q, k), newest key last")
    for col in ("name", "m(5, k), k = 1..5", "description"):
        shapes.add_column(col)
    for name, term in MASKS.items():
        w = key_weights(name, 5, heads=1)[0]
        shapes.add_row(name, " ".join(f"{v:.2f}" for v in w.tolist()), term.description
                       + (" (alibi: head 1 of 1 shown)" if name == "alibi" else ""))
    console.print(shapes)
    sems = Table(title="mask semantics (--mask-semantics)")
    for col in ("name", "what a weight m does", "reproduces"):
        sems.add_column(col)
    for name, term in MASK_SEMANTICS.items():
        sems.add_row(name, term.description, term.note)
    console.print(sems)
    console.print("protocols (--protocol): " + ", ".join(PROTOCOLS.names())
                  + "; see docs/masks.md")


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli perplexity models/tiny-gpt2-imdb --mask linear",), "perplexity with positions, without, "
             "and with a graded mask instead (the study's E2/E3)", "perplexity.csv, texts.csv",
             "187 s (e2e3-tiny-gpt2: 817 questions, 18 conditions)", "data, causal")


def register(app: typer.Typer) -> None:
    app.command()(perplexity)
    app.command()(masks)
