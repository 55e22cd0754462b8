"""`pecli attn`: how a model uses position (attention and hidden-state diagnostics)."""

from __future__ import annotations

import typer
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, derived
from pecli.cli.shared import ci_text, counter, run_and_write
from pecli.cli.shared import console as wide_console
from pecli.experiments.options.attn import AttnOptions


@derived(AttnOptions, "pecli attn")
def attn(options: AttnOptions, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """How a model uses position: sink rate, attention entropy and distance, rotary frequency
    usage, positional vectors and a position probe, per layer and head, under every condition.

    attn.csv has one row per (model, condition, scope, layer, head, metric) with a 95 %
    bootstrap interval over texts: sink_rate (Gu et al.'s Sink_1^eps: the share of heads whose
    attention to the first token, averaged over queries, exceeds --epsilon), first_token_mass,
    entropy, mean_distance, previous_token_mass, diagonal_mass (heads named in `role`),
    high_frequency_share. attn_positions.csv: entropy and hidden-state norms by position;
    attn_distance.csv, attn_frequency.csv, attn_positional.csv, attn_probe.csv: see docs/attn.md.
    The intact model comes first; every --intervention x --mask x --mask-semantics is crossed
    with every --rope-scaling. Attention is computed layer by layer in blocks of queries.

    Examples:
        pecli attn smollm2 --dataset imdb --length 64 --intervention zero
        pecli attn models/tiny-gpt2-imdb --intervention zero --mask default,linear,alibi --mask-semantics log-bias
        pecli attn smollm2 --length 12288 --join --limit 4 --rope-scaling yarn:2
    """
    from pecli.experiments.attn import run
    from pecli.measures.intervals import METHOD
    with counter("texts", "texts x conditions") as advance:
        tables, paths, pngs, _ = run_and_write("attn", run, options, out, progress=advance,
                                               force=force, notes={"intervals": METHOD, "interval_unit": "text"})
    console = wide_console()
    df = tables["attn"]
    first = df.iloc[0]
    summary = Table(title=f"attn: {first['dataset']}/{first['split']}, {first['rows']} texts of "
                          f"{first['length']} tokens")
    for col in ("model", "condition", "sink rate [95 % CI]", "first-token mass", "entropy",
                "mean distance", "named heads"):
        summary.add_column(col)
    for _, group in df.groupby(["model", "intervention", "mask", "mask_semantics", "rope_scaling"],
                               sort=False, dropna=False):
        whole = group[group["scope"] == "model"].set_index("metric")
        row = whole.loc["sink_rate"]
        label = _condition(row)
        if row["note"]:
            summary.add_row(str(row["model"]), label, row["note"], "", "", "", "")
            continue
        roles = group[group["role"].fillna("") != ""]
        named = ", ".join(f"{r['role'].split()[0]} L{r['layer']}H{r['head']}"
                          for _, r in roles[roles["role"] != "sink head"].head(6).iterrows())
        summary.add_row(str(row["model"]), label, f"{row['value']:.3f}{ci_text(row, '.3f')}",
                        f"{whole.loc['first_token_mass', 'value']:.3f}",
                        f"{whole.loc['entropy', 'value']:.3f}",
                        f"{whole.loc['mean_distance', 'value']:.2f}", named or "-")
    console.print(summary)
    for p in [*paths.values(), *pngs]:
        console.print(f"wrote {p}")


def _condition(row) -> str:
    parts = [str(row["intervention"])]
    if row["mask"] != "default":
        parts.append(f"{row['mask']} mask ({row['mask_semantics']})")
    if str(row.get("rope_scaling", "none")) not in ("none", "nan"):
        parts.append(str(row["rope_scaling"]))
    return ", ".join(parts)


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli attn smollm2",), "attention sinks, entropy and distance, rotary frequency use, per layer "
             "and head", "attn.csv", needs="data")


def register(app: typer.Typer) -> None:
    app.command()(attn)
