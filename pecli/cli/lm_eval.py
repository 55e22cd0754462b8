"""`pecli lm-eval`: lm-evaluation-harness tasks, scored by lm-eval, under pecli's conditions."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pecli.cli.flags import (
    DataDirOpt,
    DeviceOpt,
    DtypeOpt,
    ForceOpt,
    MaskOpt,
    MaskSemanticsOpt,
    OutOpt,
    ProtocolOpt,
    RopeScalingOpt,
    SeedOpt,
    build,
    intervention_option,
)
from pecli.cli.shared import ci_text, console, run_and_write
from pecli.runs.errors import ConfigError
from pecli.runs.options import LmEvalOptions

InterventionOpt = intervention_option("learned (the model's own; default), zero, ..., crossed "
                                      "with --mask and --rope-scaling")


def lm_eval(
    model_args: Annotated[str, typer.Option(
        "--model_args", help="lm-eval's model_args for the `pecli` model: pretrained=NAME (any "
                             "model pecli loads: smollm2, random:gpt2, a directory, a hub id), "
                             "and HFLM's own keys (max_length=..., ...).")] = "pretrained=random:gpt2",
    tasks: Annotated[str, typer.Option(
        "--tasks", help="lm-eval task names, a,b (with --include_path: your own task YAMLs).")] = "",
    num_fewshot: Annotated[int | None, typer.Option("--num_fewshot", min=0)] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", min=1, help="The first N documents of each task (lm-eval's --limit).")] = None,
    include_path: Annotated[Path | None, typer.Option(
        "--include_path", help="A folder of task YAMLs (configs/lm_eval: TruthfulQA MC1/MC2 on "
                               "the local data directory).")] = None,
    batch_size: Annotated[int, typer.Option("--batch_size", min=1)] = 8,
    metadata: Annotated[str, typer.Option(
        "--metadata", help="JSON for the tasks (lm-eval's --metadata), e.g. passkey's sizes: "
                           "'{\"passkey_lengths\": [1024, 4096], \"passkey_trials\": 5}'.")] = "",
    output_path: Annotated[Path | None, typer.Option(
        "--output_path", help="Same as --out (lm-eval's spelling).")] = None,
    intervention: InterventionOpt = None,
    mask: MaskOpt = None,
    mask_semantics: MaskSemanticsOpt = None,
    protocol: ProtocolOpt = None,
    rope_scaling: RopeScalingOpt = None,
    bootstrap: Annotated[int, typer.Option(
        help="Resamples of the 95 % intervals over documents (and lm-eval's bootstrap_iters): "
             "0 (none) or 100 to 100000.")] = 1000,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    data_dir: DataDirOpt = None,
    out: OutOpt = None,
    force: ForceOpt = False,
) -> None:
    """lm-evaluation-harness tasks through the lm-eval model `pecli`, one run per condition
    (the intact model first), scored by lm-eval's own evaluator and metrics.

    Writes each condition's results as lm-eval writes them (lm_eval/<condition>/), a tidy
    lm_eval.csv (task, metric, value, stderr, interval, condition, provenance; each
    condition's difference from the intact model on the same documents, with a paired
    bootstrap interval) that `pecli compare` reads, and a figure. lm-eval's own command line does not import plugin models,
    hence this command (README: lm-eval).

    Examples:
        pecli lm-eval --model_args pretrained=smollm2 --intervention zero --tasks truthfulqa_mc1,truthfulqa_mc2 --include_path configs/lm_eval --limit 20
        pecli lm-eval --model_args pretrained=smollm2 --rope-scaling yarn:2 --tasks passkey --include_path configs/lm_eval --metadata '{"passkey_lengths": [4096, 10240], "passkey_trials": 5}'
    """
    from pecli.integrations.lm_eval import split_model_args

    if out is not None and output_path is not None and out != output_path:
        raise ConfigError("--out and --output_path name the output folder; give one")
    pecli_args, hflm_args = split_model_args(model_args)
    grid = {"intervention": intervention, "mask": mask, "mask_semantics": mask_semantics,
            "protocol": protocol, "rope_scaling": rope_scaling}
    clash = [k for k in pecli_args if k in grid and grid[k] is not None]
    if clash:
        raise ConfigError(f"--model_args {', '.join(clash)}=... and --{clash[0].replace('_', '-')} "
                          "both set the condition; give the flag (it crosses several)")
    flags = {**{k: v for k, v in pecli_args.items() if k != "pretrained"}, **grid}
    hflm = ",".join(f"{k}={v}" for k, v in {"batch_size": batch_size, **hflm_args}.items())
    options = build(LmEvalOptions, "pecli lm-eval", **flags, model=pecli_args.get("pretrained"),
                    tasks=tasks, num_fewshot=num_fewshot, limit=limit, include_path=include_path,
                    model_args=hflm, metadata=metadata, bootstrap=bootstrap, seed=seed, device=device, dtype=dtype,
                    data_dir=data_dir)
    from pecli.integrations.lm_eval import run

    show = console()
    tables, paths, pngs, _ = run_and_write("lm-eval", run, options, out or output_path,
                                           save_dir="lm_eval", force=force,
                                           progress=lambda i, n: show.print(f"condition {i}/{n} done"))
    df = tables["lm_eval"]
    summary = Table(title=f"lm-eval through pecli: {df['model'].iloc[0]}")
    numbers = ("value [95 % CI]", "stderr", "minus intact, same documents [95 % CI]")
    for col in ("task", "metric", "condition", *numbers):
        summary.add_column(col, justify="right" if col in numbers else "left")
    for _, r in df.iterrows():
        cond = f"{r['intervention']}, {r['mask']}/{r['mask_semantics']}, rope {r['rope_scaling']}"
        diff = r["diff_vs_intact"]
        paired = "" if diff != diff else f"{diff:+.4f}" + ci_text(
            {"ci_low": r["diff_ci_low"], "ci_high": r["diff_ci_high"]}, "+.4f")
        summary.add_row(r["dataset"], r["metric"], cond, f"{r['value']:.4f}{ci_text(r)}",
                        f"{r['stderr']:.4f}", paired)
    show.print(summary)
    for p in [*paths.values(), *pngs]:
        show.print(f"wrote {p}")


def register(app: typer.Typer) -> None:
    app.command("lm-eval")(lm_eval)
