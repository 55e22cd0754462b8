"""`pecli pe`: look at position encodings: the sinusoid, and what learned ones encode."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, build, derived
from pecli.cli.shared import ci_text, run_and_write
from pecli.cli.shared import console as wide_console
from pecli.experiments.options.pe import ProbeOptions, SinusoidOptions
from pecli.experiments.options.recover import RecoverOptions
from pecli.runs import parallel

pe_app = typer.Typer(name="pe", no_args_is_help=True,
                     help="Position encodings under the microscope: sinusoids and learned tables.")

IntervOpt = Annotated[list[str] | None, typer.Option(
    "--intervention",
    help="Conditions of the hidden-state probe, repeatable (default: intact and zero).")]


def _paths(console: Console, tables: dict, figures: list[Path]) -> None:
    for path in [*tables.values(), *figures]:
        console.print(f"  {path}")


def _announced(experiment: str, run, options, out: Path | None, status: str, force: bool = False):
    """run_and_write with progress lines (a status spinner and a log line per step)."""
    console = wide_console(log_path=False)
    with console.status(status) as bar:
        say = (lambda msg: (bar.update(msg), console.log(msg))) if parallel.is_main() else None
        frames, tables, figures, _ = run_and_write(experiment, run, options, out, announce=say, force=force)
    return console, frames, tables, figures


@derived(SinusoidOptions, "pecli pe sinusoidal")
def sinusoidal(options: SinusoidOptions, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """The sinusoidal encoding: heatmaps, the clock, the rotation property, dot products.

    Checks PE(pos + k) = M_k PE(pos) for every offset k (M_k block-diagonal 2x2 rotations
    built from the frequencies alone) and that PE(p).PE(q) depends only on |p - q|.

    Examples:
        pecli pe sinusoidal
        pecli pe sinusoidal --positions 128 --dim 64 --out /tmp/pe
        pecli pe sinusoidal --positions 512 --dim 512 --base 100
    """
    from pecli.experiments.pe import run_sinusoidal

    frames, tables, figures, _ = run_and_write("pe-sinusoidal", run_sinusoidal, options, out, force=force)
    console = wide_console()
    table = Table(title=f"sinusoidal PE: {options.positions} positions x {options.dim} dims, "
                        f"base {options.base:g}")
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_column("how")
    for _, row in frames["summary"].iterrows():
        table.add_row(row["metric"], f"{row['value']:.3g}", row["aggregation"])
    console.print(table)
    _paths(console, tables, figures)


@derived(ProbeOptions, "pecli pe probe")
def probe(options: ProbeOptions, *, out: OutOpt = None, force: ForceOpt = False) -> None:
    """What position information models keep: Wang & Chen's analyses and a per-layer probe.

    For a learned table: linear regression row -> index (5-fold CV, MAE of the rounded
    prediction), which-comes-first classification, row similarity; the sinusoidal matrix of
    the same shape is the reference. For every model: the same regression from hidden
    states at every layer, with the model's positions and without (`zero`). Rotary models
    (smollm2) have no table: hidden-state probe only.

    Examples:
        pecli pe probe minilm random:gpt2 --limit 16
        pecli pe probe smollm2 --dataset truthfulqa --limit 32
        pecli pe probe minilm --intervention intact --intervention shuffle --out /tmp/probe
    """
    from pecli.experiments.pe import ROTARY_NOTE, run_probe

    console, frames, tables, figures = _announced("pe-probe", run_probe, options, out, "probing", force=force)
    if not parallel.is_main():
        return
    if "matrix" in frames:
        console.print(_matrix_summary(frames["matrix"]))
    console.print(_hidden_summary(frames["hidden"]))
    if (frames["hidden"]["position_kind"] != "learned").any():
        console.print(f"* {ROTARY_NOTE}")
    _paths(console, tables, figures)


def _matrix_summary(df) -> Table:
    table = Table(title="position-embedding matrix (Wang & Chen); sinusoidal = same-shape reference")
    for col in ("model", "matrix", "shape"):
        table.add_column(col)
    for col in ("regression MAE", "chance MAE", "order acc. [95 % CI]"):
        table.add_column(col, justify="right")
    for (model, kind), rows in df.groupby(["model", "matrix"], sort=False):
        v = rows.set_index("metric")["value"]
        acc = rows.set_index("metric").loc["order_accuracy"]
        ci = ci_text(acc, ".3f")
        shape = f"{rows['positions'].iloc[0]} x {rows['dim'].iloc[0]}"
        table.add_row(model, kind, shape, f"{v['regression_mae']:.2f}",
                      f"{v['regression_chance_mae']:.2f}", f"{v['order_accuracy']:.3f}{ci}")
    return table


def _hidden_summary(df) -> Table:
    table = Table(title="hidden-state probe: MAE of token position (held-out texts; * rotary)")
    table.add_column("model", no_wrap=True)
    table.add_column("positions", no_wrap=True)
    for col in ("chance", "layer 0", "middle", "last", "best (layer)"):
        table.add_column(col, justify="right", no_wrap=True)
    for (model, iv), rows in df.groupby(["model", "intervention"], sort=False):
        mae = rows[rows["metric"] == "probe_mae"].set_index("layer")["value"].sort_index()
        chance = rows[rows["metric"] == "probe_chance_mae"]["value"].mean()
        last = mae.index.max()
        rotary = "*" if rows["position_kind"].iloc[0] == "rotary" else ""
        table.add_row(model + rotary, iv, f"{chance:.1f}", f"{mae.iloc[0]:.1f}",
                      f"{mae[last // 2]:.1f}", f"{mae[last]:.1f}", f"{mae.min():.1f} ({mae.idxmin()})")
    return table


@derived(RecoverOptions, "pecli pe recover")
def recover(flags: dict, *, ctx: typer.Context, out: OutOpt = None, force: ForceOpt = False) -> None:
    """Is adding position embeddings harmless, and can what was added be taken back out?

    For learned absolute positions, x = E_tok[v] + E_pos[p] as the first block sees it (the
    model's own normalisation): the token by nearest vocabulary row beside the no-position
    ceiling, the position by a linear probe, subtraction with the token known, joint
    decoding, and controls (random rows at the learned scale; a sinusoid plus Gaussian
    tokens). Then a per-layer token probe on real text with and without positions. Models
    that add nothing to the token embedding (rotary, ALiBi, relative bias) get a row: not
    applicable; if every model named is one, the command says so before loading.

    Examples:
        pecli pe recover minilm
        pecli pe recover models/tiny-gpt2-imdb random:bert smollm2 --tokens 16
        pecli pe recover minilm --limit 64 --top-k 100 --out /tmp/recover
    """
    if flags["n_boot"] is not None and ctx.get_parameter_source("bootstrap").name != "COMMANDLINE":
        del flags["bootstrap"]  # --n-boot alone: the deprecated spelling, not two values
    options = build(RecoverOptions, "pecli pe recover", **flags)
    from pecli.experiments.recover import run_recover

    console, frames, tables, figures = _announced("pe-recover", run_recover, options, out, "recovering",
                                                  force=force)
    if not parallel.is_main():
        return
    console.print(_recover_summary(frames["summary"]))
    _paths(console, tables, figures)


def _recover_summary(df) -> Table:
    table = Table(title="token and position from x = E_tok + E_pos at the input (token: nearest row by "
                        "cosine, [95 % bootstrap over tokens]; position: ridge probe)")
    table.add_column("model", no_wrap=True)
    table.add_column("condition", no_wrap=True)
    for col in ("token acc.", "ceiling", "worst pos.", "pos. MAE (chance)", "token known: pos.", "joint"):
        table.add_column(col, justify="right", no_wrap=True)
    notes = []
    for (model, cond), rows in df.groupby(["model", "condition"], sort=False):
        if (rows["metric"] == "not_applicable").any():
            table.add_row(model, "not applicable*", *[""] * 6)
            notes.append(f"* {model}: {rows['note'].iloc[0]}")
            continue
        v = rows.set_index("metric")
        acc = v.loc["token_accuracy"]
        table.add_row(model, cond, f"{acc['value']:.4f}{ci_text(acc, '.3f')}",
                      f"{v.loc['token_accuracy_ceiling', 'value']:.4f}",
                      f"{v.loc['token_accuracy_worst_position', 'value']:.3f}",
                      f"{v.loc['position_probe_mae', 'value']:.1f} ({v.loc['position_probe_chance_mae', 'value']:.0f})",
                      f"{v.loc['known_token_position_accuracy', 'value']:.4f}",
                      f"{v.loc['joint_accuracy', 'value']:.4f}")
    if notes:
        table.caption = "\n".join(notes)
    return table


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli pe sinusoidal", "pe probe", "pe recover"), "what a position encoding holds; can token and "
             "position be read back out?", "tables, figures", "1-229 s (pe-sinusoidal to pe-recover)", "data (probe, recover)")


def register(app: typer.Typer) -> None:
    pe_app.command()(sinusoidal)
    pe_app.command()(probe)
    pe_app.command()(recover)
    app.add_typer(pe_app, name="pe")
