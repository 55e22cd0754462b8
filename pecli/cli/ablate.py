"""`pecli ablate` (study E1, E2's cosine) and `pecli interventions` (what --intervention accepts)."""

from __future__ import annotations

import time

import typer
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, build, derived
from pecli.cli.shared import ci_text, run_and_write
from pecli.cli.shared import console as wide_console
from pecli.experiments.options.ablate import AblateOptions
from pecli.positions.labels import INTACT, OLD_INTACT
from pecli.runs import parallel
from pecli.runs.numbers import decimals

INTACT_NAMES = (INTACT, *OLD_INTACT)



@derived(AblateOptions, "pecli ablate")
def ablate(flags: dict, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """Cosine similarity of every token's features with vs without position information.

    For each real token, the cosine between its hidden state with the model's own positions
    and under each --intervention, at every layer and by position index; compared with
    random pairs of vectors of the model's width (z-score, percentile, histogram), and with
    two in-model baselines per layer (the model's own positions, same texts): the cosine of
    two different tokens (its anisotropy floor) and of the same token in another text.
    Means carry 95 % bootstrap intervals over texts. Texts longer than the model's
    positions are truncated and counted.

    Examples:
        pecli ablate minilm
        pecli ablate minilm --intervention zero,shuffle --limit 200 --probe
        pecli ablate random:gpt2 --intervention zero --dataset truthfulqa --text-field question --limit 20
    """
    # an unset --limit takes every row of data smaller than the default
    options = build(AblateOptions, "pecli ablate", **flags, limit_at_most=flags["limit"] is None)
    from pecli.experiments.ablate import run
    from pecli.measures.intervals import METHOD

    start = time.perf_counter()
    tables, paths, pngs, _ = run_and_write(
        "ablate", run, options, out, progress=True, force=force,
        notes={"intervals": METHOD + "; in-model baselines: a pair weighted by both its texts' draws",
               "interval_unit": "text"})
    elapsed = time.perf_counter() - start
    if not parallel.is_main():  # launched on N processes: the main one writes and prints
        return
    _summary(tables, elapsed)
    console = wide_console()
    for p in [*paths.values(), *pngs]:
        console.print(f"wrote {p}", soft_wrap=True)


def _summary(tables: dict, elapsed: float) -> None:
    main = tables["ablate"]
    first = main.iloc[0]
    final = main[main["final_layer"]]
    probe = tables.get("ablate_probe")
    table = Table(title=f"ablate: {first['model']} on {first['dataset']}/{first['split']} "
                        f"({first['rows']} texts, {first['truncated_texts']} truncated to "
                        f"{first['max_length']} tokens; {elapsed:.1f} s)")
    between = "between_baselines" in set(final["metric"])
    for col in ("intervention", "mean cosine [95 % CI]", "std", "median", "tokens",
                "w/o special", "z-score", "percentile", *(["0 = other token, 1 = same"] * between)):
        table.add_column(col, justify="left" if col == "intervention" else "right")
    if probe is not None:
        table.add_column("probe acc. [95 % CI]", justify="right")
    shown = final[~final["intervention"].isin(INTACT_NAMES)]
    inc_all = shown[shown["special_tokens"] == "included"]

    def digits(metric: str, rows=inc_all) -> int:  # one count of decimals per column
        part = rows[rows["metric"] == metric]
        return decimals(part["value"], part["ci_low"], part["ci_high"])

    d = {m: digits(m) for m in ("cosine_mean", "cosine_std", "cosine_median", "between_baselines")}
    d["excluded"] = digits("cosine_mean", shown[shown["special_tokens"] == "excluded"])
    outside = []
    for name, group in shown.groupby("intervention", sort=False):
        inc = group[group["special_tokens"] == "included"].set_index("metric")
        exc = group[group["special_tokens"] == "excluded"].set_index("metric")["value"]
        v = inc["value"]
        cos = d["cosine_mean"]
        row = [name, f"{v['cosine_mean']:.{cos}f}" + ci_text(inc.loc["cosine_mean"], f".{cos}f"),
               f"{v['cosine_std']:.{d['cosine_std']}f}", f"{v['cosine_median']:.{d['cosine_median']}f}",
               f"{int(v['token_count'])}", f"{exc['cosine_mean']:.{d['excluded']}f}", f"{v['z_score']:.1f}",
               f"{v['percentile']:.2f}"]
        if between:
            row.append(f"{v['between_baselines']:.{d['between_baselines']}f}"
                       + ("" if 0 <= v["between_baselines"] <= 1 else " (!)"))
            if not 0 <= v["between_baselines"] <= 1:
                outside.append((name, v["between_baselines"]))
        if probe is not None:
            acc = probe.set_index(["intervention", "metric"])
            intact = next(n for n in INTACT_NAMES if (n, "probe_accuracy") in acc.index)
            row.append(f"{acc.loc[(name, 'probe_accuracy'), 'value']:.3f}"
                       + ci_text(acc.loc[(name, 'probe_accuracy')]) + " (intact "
                       f"{acc.loc[(intact, 'probe_accuracy'), 'value']:.3f})")
        table.add_row(*row)
    console = wide_console()
    console.print(table)
    for name, value in outside:
        console.print(f"(!) {name}: {value:.{d['between_baselines']}f} lies outside the 0-1 scale of the "
                      "in-model baselines: " + (
                          "it moved tokens less than putting the same token in another text does"
                          if value > 1 else "it moved tokens further than another token lies")
                      + "; the scale's ends are measured, so a value past them is a finding, not an error",
                      soft_wrap=True)
    _baselines(console, final, tables["ablate_random"])


def _baselines(console, final, random) -> None:
    """The in-model baselines (the intact model's own) and the random-vector baseline."""
    own = final[final["intervention"].isin(INTACT_NAMES)].set_index("metric")
    if "token_pair_cosine_mean" in own.index and "self_similarity_mean" in own.index:
        tp, ss = own.loc["token_pair_cosine_mean"], own.loc["self_similarity_mean"]
        console.print(f"in-model baselines (final layer, own positions, special tokens excluded): "
                      f"two different tokens {tp['value']:.4f}{ci_text(tp)} ({int(tp['pairs'])} pairs), "
                      f"the same token in another text {ss['value']:.4f}{ci_text(ss)} "
                      f"({int(ss['pairs'])} pairs)")
    rand = random.set_index("metric")["value"]
    console.print(f"random baseline: {int(random['pairs'].iloc[0])} pairs of "
                  f"d = {int(random['dim'].iloc[0])} normal vectors, cosine mean "
                  f"{rand['random_cosine_mean']:.4f}, std {rand['random_cosine_std']:.4f}")


def interventions() -> None:
    """List the position interventions --intervention accepts and which position kinds each
    applies to.

    Examples:
        pecli interventions
        pecli ablate minilm --intervention shift:3
    """
    from rich.markup import escape

    from pecli.runs.names import INTERVENTIONS

    table = Table(title="interventions")
    for col in ("name", "applies to", "what it does"):
        table.add_column(col)
    for _, term in INTERVENTIONS.items():
        table.add_row(escape(term.shown()), ", ".join(term.applies_to), escape(term.description))
    wide_console().print(table)


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli ablate minilm",), "how much do hidden states change without positions, per layer, "
             "against in-model baselines?", "ablate.csv, ablate_positions.csv, figures", "371 s (e1-minilm: 500 reviews, zero and shuffle)",
             "data")


def register(app: typer.Typer) -> None:
    app.command()(ablate)
    app.command()(interventions)
