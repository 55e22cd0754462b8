"""lm-evaluation-harness under pecli's conditions: the lm-eval model `pecli`, and `pecli lm-eval`.

Importing this module registers the model `pecli` in lm-eval's registry (`register_model`):

    import lm_eval, pecli.integrations.lm_eval
    lm_eval.simple_evaluate(model="pecli", model_args="pretrained=smollm2,intervention=zero",
                            tasks=["truthfulqa_mc1"], task_manager=TaskManager(include_path=DIR))

`PecliLM` is lm-eval's own HFLM around a model pecli loaded (any name pecli loads), with one
condition (intervention, mask and semantics, rope scaling) entered when it is built and held
for its lifetime: every request type (loglikelihood, loglikelihood_rolling, generate_until)
reaches the model through the same forward, so every one sees the condition. `close()` puts
the model back exactly.

`run` is the experiment behind `pecli lm-eval`: the model loads once, then one lm-eval run per
condition (the intact model first), each written as lm-eval writes it, and one tidy table of
every (condition, task, metric).
"""

from __future__ import annotations

import json
import logging
import os
import re
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

try:
    import lm_eval
    from lm_eval.api.registry import register_model
    from lm_eval.models.huggingface import HFLM
except ModuleNotFoundError as err:  # pragma: no cover - the message is the test
    from pecli.runs.errors import ConfigError

    raise ConfigError("lm-eval is not installed: `pip install -e '.[lm-eval]'` (make setup "
                      "installs it)") from err

from pecli.experiments import EXPERIMENTS, Experiment, check_before_loading, lazy, load
from pecli.runs.errors import ConfigError
from pecli.runs.options import LmEvalOptions

# model_args keys that pecli reads (pretrained= is pecli's model name); the rest go to HFLM
MODEL_KEYS = ("pretrained", "intervention", "mask", "mask_semantics", "protocol", "rope_scaling",
              "seed", "device", "dtype")
GRID = ("intervention", "mask", "mask_semantics", "protocol", "rope_scaling")


def condition_options(args: dict[str, Any], where: str = "pecli model_args") -> LmEvalOptions:
    """One condition's options from lm-eval model_args (values as lm-eval parsed them),
    checked before anything loads; each grid option takes one value here."""
    values = {("model" if k == "pretrained" else k): v for k, v in args.items() if v is not None}
    for key in ("seed",):
        if isinstance(values.get(key), str) and values[key].isdigit():
            values[key] = int(values[key])
    for key in ("device", "dtype", "model"):
        if key in values:
            values[key] = str(values[key])
    options = LmEvalOptions.build(values, where)
    many = [k for k in GRID if len(getattr(options, k)) > 1]
    if many:
        raise ConfigError(f"{where}: {', '.join(many)} take one value per model; cross "
                          "conditions with `pecli lm-eval --intervention a,b ...`")
    return options


def plan_of(options: LmEvalOptions):
    """The one condition of single-valued options (pecli.positions.conditions.Condition)."""
    from pecli.positions.conditions import plan

    return plan(options.mask[0], options.mask_semantics[0], options.protocol[0],
                options.intervention[0], rope=(options.rope_scaling or (None,))[0])


@register_model("pecli")
class PecliLM(HFLM):
    """lm-eval's HFLM on a model pecli loads, under one pecli condition (module docstring).

    `loaded` (a pecli LoadedModel) skips loading: `pecli lm-eval` loads once for every
    condition. Other keyword arguments are HFLM's (batch_size, max_length, ...).
    """

    def __init__(self, pretrained: str = "random:gpt2", intervention: str = "intact",
                 mask: str = "default", mask_semantics: str = "legacy",
                 protocol: str = "relative", rope_scaling: str | None = None, seed: int = 0,
                 device: str = "auto", dtype: str = "float32", loaded=None, **kwargs) -> None:
        from pecli.positions.conditions import check_all

        args = dict(pretrained=pretrained, intervention=intervention, mask=mask,
                    mask_semantics=mask_semantics, protocol=protocol, rope_scaling=rope_scaling,
                    seed=seed, device=device, dtype=dtype)
        options = condition_options(args)
        how = plan_of(options)
        if loaded is None:
            check_before_loading(options.model, [how], causal=True)
            loaded = load(options.model, options)
        check_all([how], loaded, causal=True)
        self.loaded, self.options, self.plan = loaded, options, how
        self.tokens = 0  # input positions the model computed (padding included)
        super().__init__(pretrained=loaded.model, tokenizer=loaded.tokenizer, **kwargs)
        self._columns = how.columns(loaded)  # the unscaled model's own rope_parameters
        self._condition = ExitStack()
        self._condition.enter_context(how.applied(loaded, options.seed))

    def _model_call(self, inps, attn_mask=None, labels=None):
        self.tokens += inps.numel()
        return super()._model_call(inps, attn_mask=attn_mask, labels=labels)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        self.tokens += context.numel()
        return super()._model_generate(context, max_length, stop, **generation_kwargs)

    def close(self) -> None:
        """Restore the model exactly (the condition's context managers, in reverse)."""
        self._condition.close()

    def condition_columns(self) -> dict[str, Any]:
        c = self._columns
        return {"condition": c["condition"], **self.plan.names,
                "computation": self.plan.computation,
                **{k: c[k] for k in ("rope_scaling", "rope_parameters")}}


# --- `pecli lm-eval`: every condition, lm-eval's own evaluator ----------------------------------


def conditions(options: LmEvalOptions) -> list[dict[str, Any]]:
    """model_args of each condition: the intact, unscaled model first, then every intervention
    x mask x semantics crossed with every rope scaling (as `pecli length` crosses them)."""
    from pecli.positions.conditions import grid

    return [{**c.names, "rope_scaling": str(c.rope) if c.rope else None} for c in grid(options)]


def _hflm_args(text: str) -> dict[str, Any]:
    """--model_args beyond pecli's own keys, parsed as lm-eval parses them."""
    from lm_eval.utils import simple_parse_args_string

    return simple_parse_args_string(text) if text else {}


def split_model_args(text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pecli's keys, HFLM's keys) of a --model_args string."""
    args = _hflm_args(text)
    return ({k: v for k, v in args.items() if k in MODEL_KEYS},
            {k: v for k, v in args.items() if k not in MODEL_KEYS})


def run(options: LmEvalOptions, progress=None) -> dict[str, pd.DataFrame]:
    """The `lm_eval` table: one row per (condition, task, metric); lm-eval's results JSON of
    each condition under `options.save_dir`/<condition>/ (when given)."""
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from pecli.positions.conditions import check_all
    from pecli.runs.provenance import row_provenance

    o = options
    if not o.tasks:
        raise ConfigError("tasks (--tasks): name at least one lm-eval task, e.g. "
                          "truthfulqa_mc1,truthfulqa_mc2")
    _, hflm = split_model_args(o.model_args)
    grid = conditions(o)
    single = {"pretrained": o.model, "seed": o.seed, "device": o.device, "dtype": o.dtype}
    first = condition_options({**single, **grid[0]}, "pecli lm-eval")
    conditions_ = [plan_of(condition_options({**single, **cond}, "pecli lm-eval")) for cond in grid]
    check_before_loading(o.model, conditions_, causal=True)  # before the model loads
    if o.data_dir:  # the local task YAMLs (configs/lm_eval) read it from the environment
        os.environ["PECLI_DATA_DIR"] = o.data_dir
    # lm-eval's notes (a local task overriding its own, truncation) stay out of pecli's output
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    # lm-eval hands the model's name to tasks as metadata (passkey sizes prompts in its tokens)
    metadata = {"pretrained": o.model, **(json.loads(o.metadata) if o.metadata else {})}
    gen_kwargs = generation_kwargs(o.gen_kwargs)
    manager = TaskManager(include_path=o.include_path, metadata=metadata)
    unknown = [t for t in o.tasks if t not in manager.all_tasks]
    if unknown:
        raise ConfigError(f"unknown lm-eval task {', '.join(unknown)}; see `python -m lm_eval "
                          "ls tasks`, or give --include_path DIR for your own task YAMLs")
    loaded = load(o.model, first)
    if o.apply_chat_template and not getattr(loaded.tokenizer, "chat_template", None):
        raise ConfigError(f"apply_chat_template (--apply_chat_template): {o.model}'s tokenizer has "
                          "no chat template; drop the flag (a base model reads plain prompts)")
    check_all(conditions_, loaded, causal=True)  # again, before any condition is scored
    rows, per_doc = [], []  # per condition: {(task, metric, filter): {doc_id: value}}
    for i, cond in enumerate(grid):
        lm = PecliLM(**single, **cond, loaded=loaded, **hflm)
        args = ",".join(f"{k}={v}" for k, v in {**single, **cond, **hflm}.items() if v is not None)
        tracker = EvaluationTracker(output_path=str(Path(o.save_dir) / condition_dir(cond))
                                    if o.save_dir else None)
        python_seed, numpy_seed, torch_seed, fewshot_seed = o.lm_eval_seed
        try:
            with quiet_git():
                results = lm_eval.simple_evaluate(
                    model=lm, model_args=f"model=pecli,{args}", tasks=list(o.tasks),
                    num_fewshot=o.num_fewshot, limit=o.limit, task_manager=manager,
                    log_samples=True,  # always: the intervals and paired differences need them
                    evaluation_tracker=tracker, random_seed=python_seed,
                    numpy_random_seed=numpy_seed, torch_random_seed=torch_seed,
                    fewshot_random_seed=fewshot_seed, bootstrap_iters=o.bootstrap,
                    apply_chat_template=o.apply_chat_template,
                    fewshot_as_multiturn=o.fewshot_as_multiturn,
                    system_instruction=o.system_instruction, gen_kwargs=gen_kwargs or None)
        finally:
            lm.close()
        samples = results.pop("samples")
        if o.save_dir:  # as lm-eval's own command line saves them: samples with --log_samples
            tracker.save_results_aggregated(results=results, samples=samples if o.log_samples else None)
            for task in results["configs"] if o.log_samples else ():
                tracker.save_results_samples(task_name=task, samples=samples[task])
        common = {**lm.loaded.provenance(), **lm.condition_columns(), "tokens": lm.tokens,
                  "seed": o.seed, "num_fewshot": o.num_fewshot, "limit": o.limit,
                  "lm_eval_version": lm_eval.__version__, **prompt_columns(lm, o, gen_kwargs)}
        per_doc.append(documents(samples))
        chance = chance_levels(results, samples)
        rows += [{**row, "condition_index": i,
                  "chance": chance.get(row["task"], np.nan) if row["metric"] in CHANCE_METRICS else np.nan}
                 for row in task_rows(results, per_doc[-1], common, o.bootstrap, o.seed)]
        if progress:
            progress(i + 1, len(grid))
    from pecli.runs.tables import validate

    table = paired_with_intact(pd.DataFrame(rows), per_doc, o.bootstrap, o.seed)
    return {"lm_eval": validate(table.assign(experiment="lm-eval", **row_provenance()))}


def generation_kwargs(text: str) -> dict[str, Any]:
    """--gen_kwargs as lm-eval parses it (`temperature=0,max_gen_toks=64`), checked before
    the model loads: one line where lm-eval's parser fails."""
    if not text:
        return {}
    from lm_eval.utils import simple_parse_args_string

    try:
        parsed = simple_parse_args_string(text)
    except (ValueError, SyntaxError) as err:
        raise ConfigError(f"gen_kwargs (--gen_kwargs): {text!r} is not key=value,... as lm-eval "
                          f"reads it ({err}); e.g. temperature=0,max_gen_toks=64") from None
    if not isinstance(parsed, dict) or not parsed or "" in parsed.values():
        raise ConfigError(f"gen_kwargs (--gen_kwargs): {text!r} is not key=value,...; e.g. "
                          "temperature=0,max_gen_toks=64")
    return parsed


def prompt_columns(lm: PecliLM, o: LmEvalOptions, gen_kwargs: dict) -> dict[str, Any]:
    """How the prompts were built, for every row: the chat template lm-eval applied (its
    SHA-256; lm-eval's results JSON keeps the text), the system instruction, few-shot turns,
    generation arguments and lm-eval's four seeds."""
    import hashlib

    template = lm.chat_template(True) if o.apply_chat_template else None
    return {"apply_chat_template": o.apply_chat_template,
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest()[:16] if template else "",
            "fewshot_as_multiturn": o.fewshot_as_multiturn,
            "system_instruction": o.system_instruction or "",
            "gen_kwargs": json.dumps(gen_kwargs, sort_keys=True) if gen_kwargs else "",
            "lm_eval_seed": ",".join(str(s) for s in o.lm_eval_seed)}


def quiet_git():
    """lm-eval records the git commit of the current directory by running `git describe`,
    which prints `fatal: not a git repository` outside a checkout: the same lookup, silent."""
    import subprocess
    from unittest import mock

    from lm_eval.loggers.utils import get_commit_from_path

    def commit() -> str | None:
        try:
            done = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True,
                                  timeout=10)
        except (OSError, subprocess.SubprocessError):
            done = None
        if done is not None and done.returncode == 0:
            return done.stdout.strip()
        return get_commit_from_path(os.getcwd())

    return mock.patch("lm_eval.evaluator.get_git_commit_hash", commit)


CHANCE_METRICS = ("acc", "acc_norm")  # of a multiple-choice task: a uniform guess scores 1/choices


def chance_levels(results: dict, samples: dict) -> dict[str, float]:
    """Each multiple-choice task's chance accuracy (lm-eval's own scoring: the most likely
    choice is the gold one): the mean over its documents of 1 / (number of choices), the
    choices being the requests lm-eval logged per document."""
    out = {}
    for task, logged in samples.items():
        config = results.get("configs", {}).get(task, {})
        if config.get("output_type") != "multiple_choice" or config.get("process_results"):
            continue  # a task's own scoring (TruthfulQA MC2's mass) has another chance level
        first = {s["doc_id"]: len(s["arguments"]) for s in logged}  # once per document
        if first:
            out[task] = float(np.mean([1 / n for n in first.values()]))
    return out


def documents(samples: dict) -> dict[tuple, dict[int, float]]:
    """Each (task, metric, filter)'s value per document, from lm-eval's logged samples."""
    out: dict[tuple, dict[int, float]] = {}
    for task, logged in samples.items():
        for s in logged:
            for metric, value in s.items():
                if isinstance(value, int | float) and metric != "doc_id":
                    out.setdefault((task, metric, s.get("filter")), {})[s["doc_id"]] = float(value)
    return out


def paired_with_intact(df: pd.DataFrame, per_doc: list[dict], n_boot: int, seed: int
                       ) -> pd.DataFrame:
    """Add `diff_vs_intact` (the condition's value minus the intact model's, from the same
    documents) and a 95 % bootstrap interval of it over documents, resampling each document's
    pair together: sharper than comparing the two conditions' own intervals. NaN for the
    intact rows, and where the documents' values are not logged."""
    from pecli.measures.intervals import MIN_TEXTS, mean_interval

    diffs = []
    for row in df.itertuples():
        key = (row.task, row.metric, row.filter)
        intact, here = per_doc[0].get(key, {}), per_doc[row.condition_index].get(key, {})
        docs = sorted(set(intact) & set(here))
        if row.condition_index == 0 or not docs or len(docs) != row.rows:
            diffs.append((np.nan, np.nan, np.nan))
            continue
        d = np.array([here[k] - intact[k] for k in docs])
        low, high = (mean_interval(d, n_boot=n_boot, seed=seed) if n_boot and len(d) >= MIN_TEXTS
                     else (np.nan, np.nan))
        diffs.append((float(d.mean()), low, high))
    return df.assign(**dict(zip(("diff_vs_intact", "diff_ci_low", "diff_ci_high"),
                                np.array(diffs, dtype=float).T, strict=True)))


def condition_dir(cond: dict[str, Any]) -> str:
    """A folder name for one condition's lm-eval output: intervention-mask-semantics[-rope]."""
    parts = [cond["intervention"], cond["mask"], cond["mask_semantics"]]
    parts += [cond["rope_scaling"]] if cond["rope_scaling"] else []
    return "-".join(re.sub(r"[^\w.+=-]", "_", p) for p in parts)  # a mask file's path too


def interval(per_doc: list, stderr, value: float, n_boot: int, seed: int):
    """(low, high, method) of a 95 % interval: Wilson's where every document is right or
    wrong, a bootstrap over documents for other per-document values, else value ± 1.96
    lm-eval stderr; NaN when there is nothing to build one from (a single document)."""
    from pecli.measures.intervals import MIN_TEXTS, mean_interval, wilson

    if len(per_doc) >= MIN_TEXTS and set(per_doc) <= {0, 1}:
        return (*wilson(int(sum(per_doc)), len(per_doc)), "Wilson score interval over documents")
    if len(per_doc) >= MIN_TEXTS and n_boot:
        low, high = mean_interval(np.asarray(per_doc, dtype=float), n_boot=n_boot, seed=seed)
        return low, high, "percentile bootstrap over documents"
    if isinstance(stderr, int | float) and np.isfinite(stderr) and len(per_doc) != 1:
        return value - 1.96 * stderr, value + 1.96 * stderr, "normal: value ± 1.96 lm-eval stderr"
    return float("nan"), float("nan"), ""


def task_rows(results: dict, docs: dict, common: dict, n_boot: int, seed: int) -> list[dict]:
    """One row per (task, metric, filter): lm-eval's value and stderr, and a 95 % interval by
    documents where the samples carry the metric per document (`docs`, from `documents`)."""
    rows = []
    for task, metrics in results["results"].items():
        n = results.get("n-samples", {}).get(task, {}).get("effective")
        config = results.get("configs", {}).get(task, {})
        version = results.get("versions", {}).get(task)
        for key, value in metrics.items():
            if "," not in key or "_stderr" in key or not isinstance(value, int | float):
                continue
            metric, filt = key.split(",", 1)
            stderr = metrics.get(f"{metric}_stderr,{filt}")
            per_doc = list(docs.get((task, metric, filt), {}).values())
            low, high, method = interval(per_doc if len(per_doc) == n else [], stderr, value,
                                         n_boot, seed)
            if method.endswith("over documents") and not np.isclose(np.mean(per_doc), value):
                raise ValueError(f"{task} {metric}: the documents' mean {np.mean(per_doc)} is "
                                 f"not lm-eval's {value}")
            rows.append({**common, "task": task, "dataset": task, "split": config.get("test_split")
                         or config.get("validation_split") or "", "rows": n,
                         "task_version": version, "metric": metric, "filter": filt,
                         "value": float(value),
                         "stderr": float(stderr) if isinstance(stderr, int | float) else np.nan,
                         "ci_low": low, "ci_high": high, "interval_method": method})
    return rows


EXPERIMENTS.add("lm-eval", Experiment(
    "lm-eval", 1, run, lazy("pecli.plots.lm_eval:figures"),
    "lm-evaluation-harness tasks under each condition (the pecli model)", LmEvalOptions))


def results_json(folder: Path) -> list[Path]:
    """lm-eval's results files under a condition's folder (for tests and users)."""
    return sorted(Path(folder).rglob("results_*.json"))


def load_results(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))
