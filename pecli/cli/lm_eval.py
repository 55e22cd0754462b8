"""`pecli lm-eval`: lm-evaluation-harness tasks, scored by lm-eval, under pecli's conditions."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pecli.cli.docs import Row
from pecli.cli.flags import ForceOpt, OutOpt, build, derived
from pecli.cli.shared import ci_text, console, run_and_write, short_method
from pecli.experiments.options.lm_eval import LmEvalOptions
from pecli.runs.errors import ConfigError
from pecli.runs.numbers import decimals


@derived(LmEvalOptions, "pecli lm-eval")
def lm_eval(
    flags: dict,
    *,
    model: Annotated[str | None, typer.Argument(
        show_default=False, help="The model, as every command names it (smollm2, random:gpt2, a "
                                 "directory, a hub id); the same as --model_args pretrained=NAME.")] = None,
    model_args: Annotated[str, typer.Option(
        "--model_args", help="lm-eval's model_args for the `pecli` model: pretrained=NAME (any "
                             "model pecli loads: smollm2, random:gpt2, a directory, a hub id), "
                             "and HFLM's keys for a loaded model (max_length=..., ...); the "
                             "condition, seed, device, dtype and batch size are flags here; default "
                             "pretrained=random:gpt2.")] = "",
    output_path: Annotated[Path | None, typer.Option(
        "--output_path", help="Same as --out (lm-eval's spelling).")] = None,
    predict_only: Annotated[bool, typer.Option(
        "--predict_only", "-x", help="Refused: pecli lm-eval compares conditions by lm-eval's "
                                     "metrics, which predict_only skips.")] = False,
    seed: Annotated[str | None, typer.Option(
        help="lm-eval's seeds: N for all four (python, numpy, torch, few-shot) or four values "
             "a,b,c,d ('None' leaves one unset); default lm-eval's 0,1234,1234,1234. The first "
             "also seeds pecli (shuffles, random models, bootstrap; 0 when None).")] = None,
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
        pecli lm-eval smollm2 --intervention zero --tasks truthfulqa_mc1,truthfulqa_mc2 --include_path configs/lm_eval --limit 20
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
    if model is not None:
        if pecli_args.get("pretrained", model) != model:
            raise ConfigError(f"the model is given twice ({model} and --model_args "
                              f"pretrained={pecli_args['pretrained']}); give one")
        pecli_args["pretrained"] = model
    hflm = ",".join(f"{k}={v}" for k, v in hflm_args.items())
    options = build(LmEvalOptions, "pecli lm-eval", **flags, model=pecli_args.get("pretrained"),
                    model_args=hflm, seed=pecli_seed, lm_eval_seed=lm_eval_seed)
    from pecli.integrations.lm_eval import run

    show = console()
    tables, paths, pngs, _ = run_and_write("lm-eval", run, options, out or output_path,
                                           save_dir="lm_eval", force=force,
                                           progress=lambda i, n: show.print(f"condition {i}/{n} done"))
    _summary(show, tables["lm_eval"], options)
    for p in [*paths.values(), *pngs]:
        show.print(f"wrote {p}")


def _summary(show, df, options) -> None:
    """One row per task, metric and condition, with the paired difference from intact."""
    summary = Table(title=f"lm-eval through pecli: {df['model'].iloc[0]}")
    numbers = ("value [95 % CI]", "stderr", "minus intact, same documents [95 % CI]")
    for col in ("task", "metric", "condition", *numbers, "interval"):
        summary.add_column(col, justify="right" if col in numbers else "left")
    digits = decimals(df["value"], df["ci_low"], df["ci_high"])
    paired_digits = decimals(df["diff_vs_intact"], df["diff_ci_low"], df["diff_ci_high"])
    for _, r in df.iterrows():
        diff = r["diff_vs_intact"]
        paired = "" if diff != diff else f"{diff:+.{paired_digits}f}" + ci_text(
            {"ci_low": r["diff_ci_low"], "ci_high": r["diff_ci_high"]}, f"+.{paired_digits}f")
        summary.add_row(r["dataset"], r["metric"], r["condition"], f"{r['value']:.{digits}f}{ci_text(r, f'.{digits}f')}",
                        f"{r['stderr']:.{digits}f}", paired, short_method(r["interval_method"]))
    show.print(summary)
    if options.apply_chat_template:
        show.print(f"prompts in {df['model'].iloc[0]}'s chat template (sha256 "
                   f"{df['chat_template_sha256'].iloc[0]}), few-shot as turns: "
                   f"{options.fewshot_as_multiturn}", soft_wrap=True)


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


# Its row in README.md's table of commands (`make docs`)
README = Row(("pecli lm-eval smollm2 --tasks ...",), "any lm-eval task under pecli's "
             "conditions, scored by lm-eval", "lm_eval.csv, lm-eval's JSON", "3 min (20 items, 2 conditions)",
             "causal")


def register(app: typer.Typer) -> None:
    app.command("lm-eval")(lm_eval)
