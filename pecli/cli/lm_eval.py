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
    build,
    intervention_option,
)
from pecli.cli.shared import ci_text, console, decimals, run_and_write, short_method
from pecli.runs.errors import ConfigError
from pecli.runs.options import LmEvalOptions

InterventionOpt = intervention_option("intact (the model unchanged; default), zero, ..., crossed "
                                      "with --mask and --rope-scaling")


def lm_eval(
    model_args: Annotated[str, typer.Option(
        "--model_args", help="lm-eval's model_args for the `pecli` model: pretrained=NAME (any "
                             "model pecli loads: smollm2, random:gpt2, a directory, a hub id), "
                             "and HFLM's keys for a loaded model (max_length=..., ...); the "
                             "condition, seed, device, dtype and batch size are flags here.")] = "pretrained=random:gpt2",
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
    log_samples: Annotated[bool, typer.Option(
        "--log_samples", "-s", help="Also write each document's samples JSONL beside lm-eval's "
                                    "results, as lm-eval does (pecli reads them either way: its "
                                    "intervals and paired differences are over documents).")] = False,
    apply_chat_template: Annotated[bool, typer.Option(
        "--apply_chat_template", help="Format every prompt with the tokenizer's chat template, "
                                      "as lm-eval does (its SHA-256 in every row; a named "
                                      "template of a dict is not supported).")] = False,
    fewshot_as_multiturn: Annotated[bool | None, typer.Option(
        "--fewshot_as_multiturn/--no_fewshot_as_multiturn",
        help="Few-shot examples as chat turns (lm-eval's; default: on with "
             "--apply_chat_template, which it needs).")] = None,
    system_instruction: Annotated[str | None, typer.Option(
        "--system_instruction", help="A system instruction before every prompt (lm-eval's).")] = None,
    gen_kwargs: Annotated[str, typer.Option(
        "--gen_kwargs", help="Generation arguments of generate_until tasks, as lm-eval reads "
                             "them: key=value,... e.g. temperature=0,max_gen_toks=64.")] = "",
    predict_only: Annotated[bool, typer.Option(
        "--predict_only", "-x", help="Refused: pecli lm-eval compares conditions by lm-eval's "
                                     "metrics, which predict_only skips.")] = False,
    seed: Annotated[str | None, typer.Option(
        help="lm-eval's seeds: N for all four (python, numpy, torch, few-shot) or four values "
             "a,b,c,d ('None' leaves one unset); default lm-eval's 0,1234,1234,1234. The first "
             "also seeds pecli (shuffles, random models, bootstrap; 0 when None).")] = None,
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
    hence this command (docs/lm-eval.md).

    Examples:
        pecli lm-eval --model_args pretrained=smollm2 --intervention zero --tasks truthfulqa_mc1,truthfulqa_mc2 --include_path configs/lm_eval --limit 20
        pecli lm-eval --model_args pretrained=smollm2,max_length=10250 --rope-scaling yarn:2 --tasks passkey --include_path configs/lm_eval --metadata '{"passkey_lengths": [4096, 10240], "passkey_trials": 5}'
    """
    from pecli.integrations.lm_eval import split_model_args

    if predict_only:
        raise ConfigError("--predict_only: pecli lm-eval compares conditions by lm-eval's metrics, "
                          "which predict_only skips; run lm-eval itself for predictions alone "
                          "(docs/lm-eval.md)")
    pecli_seed, lm_eval_seed = seeds(seed)
    if out is not None and output_path is not None and out != output_path:
        raise ConfigError("--out and --output_path name the output folder; give one")
    pecli_args, hflm_args = split_model_args(model_args)  # condition keys: refused, see FLAGS
    grid = {"intervention": intervention, "mask": mask, "mask_semantics": mask_semantics,
            "protocol": protocol, "rope_scaling": rope_scaling}
    hflm = ",".join(f"{k}={v}" for k, v in hflm_args.items())
    options = build(LmEvalOptions, "pecli lm-eval", **grid, model=pecli_args.get("pretrained"),
                    tasks=tasks, num_fewshot=num_fewshot, limit=limit, include_path=include_path,
                    model_args=hflm, batch_size=batch_size, metadata=metadata, bootstrap=bootstrap,
                    seed=pecli_seed, lm_eval_seed=lm_eval_seed, device=device, dtype=dtype,
                    data_dir=data_dir, log_samples=log_samples,
                    apply_chat_template=apply_chat_template,
                    fewshot_as_multiturn=fewshot_as_multiturn, system_instruction=system_instruction,
                    gen_kwargs=gen_kwargs)
    from pecli.integrations.lm_eval import run

    show = console()
    tables, paths, pngs, _ = run_and_write("lm-eval", run, options, out or output_path,
                                           save_dir="lm_eval", force=force,
                                           progress=lambda i, n: show.print(f"condition {i}/{n} done"))
    df = tables["lm_eval"]
    summary = Table(title=f"lm-eval through pecli: {df['model'].iloc[0]}")
    numbers = ("value [95 % CI]", "stderr", "minus intact, same documents [95 % CI]")
    for col in ("task", "metric", "condition", *numbers, "interval"):
        summary.add_column(col, justify="right" if col in numbers else "left")
    digits = decimals(df["value"], df["ci_low"], df["ci_high"])
    paired_digits = decimals(df["diff_vs_intact"], df["diff_ci_low"], df["diff_ci_high"])
    for _, r in df.iterrows():
        cond = f"{r['intervention']}, {r['mask']}/{r['mask_semantics']}, rope {r['rope_scaling']}"
        diff = r["diff_vs_intact"]
        paired = "" if diff != diff else f"{diff:+.{paired_digits}f}" + ci_text(
            {"ci_low": r["diff_ci_low"], "ci_high": r["diff_ci_high"]}, f"+.{paired_digits}f")
        summary.add_row(r["dataset"], r["metric"], cond, f"{r['value']:.{digits}f}{ci_text(r, f'.{digits}f')}",
                        f"{r['stderr']:.{digits}f}", paired, short_method(r["interval_method"]))
    show.print(summary)
    if options.apply_chat_template:
        show.print(f"prompts in {df['model'].iloc[0]}'s chat template (sha256 "
                   f"{df['chat_template_sha256'].iloc[0]}), few-shot as turns: "
                   f"{options.fewshot_as_multiturn}", soft_wrap=True)
    for p in [*paths.values(), *pngs]:
        show.print(f"wrote {p}")


def seeds(text: str | None) -> tuple[int, tuple[int | None, ...] | None]:
    """--seed as lm-eval reads it -> (pecli's seed, lm-eval's four seeds or None for its
    default): "42" -> (42, (42, 42, 42, 42)); "0,None,8,52" -> (0, (0, None, 8, 52))."""
    if text is None:
        return 0, None
    items = [t.strip() for t in text.split(",")]
    try:
        values = [None if t == "None" else int(t) for t in items]
    except ValueError:
        values = []
    if len(values) not in (1, 4) or any(v is not None and v < 0 for v in values):
        raise ConfigError(f"--seed: {text!r} is not a seed or four comma-separated seeds (python, "
                          "numpy, torch, few-shot; None leaves one unset), e.g. 42 or 0,1234,1234,1234")
    four = tuple(values * 4) if len(values) == 1 else tuple(values)
    return (four[0] if four[0] is not None else 0), four


def register(app: typer.Typer) -> None:
    app.command("lm-eval")(lm_eval)
