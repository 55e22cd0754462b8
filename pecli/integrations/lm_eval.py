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

import difflib
import json
import logging
import os
import re
import warnings
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

from pecli.experiments import check_before_loading, load, register
from pecli.experiments.options.lm_eval import LmEvalOptions
from pecli.measures.intervals import document_interval, paired_with_intact
from pecli.positions import labels
from pecli.runs import names
from pecli.runs.errors import ConfigError


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
    if "model" in values and not values["model"].strip():
        raise ConfigError(f"{where}: pretrained= is empty; name a model (smollm2, random:gpt2, "
                          "a directory, a hub id)")
    options = LmEvalOptions.build(values, where)
    many = [k for k in labels.columns() if len(getattr(options, k, None) or ()) > 1]
    if many:
        raise ConfigError(f"{where}: {', '.join(many)} take one value per model; cross "
                          "conditions with `pecli lm-eval --intervention a,b ...`")
    return options


def plan_of(options: LmEvalOptions):
    """The one condition of single-valued options (pecli.positions.conditions.Condition)."""
    from pecli.positions.conditions import plan

    mask = options.mask[0]
    semantics = (options.mask_semantics[0] if options.mask_semantics else  # none given: a file's own
                 names.mask_file_fields(mask)["semantics"] if mask.term is names.MASK_FILE else "legacy")
    return plan(mask, semantics, options.protocol[0],
                options.intervention[0], rope=(options.rope_scaling or (None,))[0])


@register_model("pecli")
class PecliLM(HFLM):
    """lm-eval's HFLM on a model pecli loads, under one pecli condition (module docstring).

    `loaded` (a pecli LoadedModel) skips loading: `pecli lm-eval` loads once for every
    condition, and hands each its `condition` (a Condition of its grid, checked on `loaded`):
    the model_args' condition names are parsed only where lm-eval's own command line gives
    them. Other keyword arguments are HFLM's (batch_size, max_length, ...).
    """

    def __init__(self, pretrained: str = "random:gpt2", intervention: str = "intact",
                 mask: str = "default", mask_semantics: str | None = None,
                 protocol: str = "relative", rope_scaling: str | None = None, seed: int = 0,
                 device: str = "auto", dtype: str = "float32", loaded=None, condition=None,
                 **kwargs) -> None:
        from pecli.positions.conditions import check_all

        args = dict(pretrained=pretrained, seed=seed, device=device, dtype=dtype)
        if condition is None:  # lm-eval's command line: the names in model_args, parsed once
            args.update(intervention=intervention, mask=mask, mask_semantics=mask_semantics,
                        protocol=protocol, rope_scaling=rope_scaling)
        options = condition_options(args)
        # HFLM's keys for a loaded model (lm-eval's command line adds the batch sizes)
        check_hflm_args(kwargs, "pecli model_args", extra={"batch_size": BATCH})
        how = condition or plan_of(options)
        if loaded is None:
            check_before_loading(options.model, [how], causal=True)
            loaded = load(options.model, options)
        if condition is None:  # pecli lm-eval checked its grid on the loaded model already
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

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """HFLM's, where a document gives its own `max_new_tokens` (pecli ruler's decoding
        budget, configs/lm_eval/pecli_data.py) in place of the task's max_gen_toks."""
        for r in requests:
            if isinstance(r.doc, dict) and "max_new_tokens" in r.doc:
                context, kwargs = r.arguments
                r.arguments = (context, {**kwargs, "max_gen_toks": int(r.doc["max_new_tokens"])})
        return super().generate_until(requests, disable_tqdm)

    def close(self) -> None:
        """Restore the model exactly (the condition's context managers, in reverse)."""
        self._condition.close()

    def condition_columns(self) -> dict[str, Any]:
        return {**self._columns, "computation": self.plan.computation}


# --- `pecli lm-eval`: every condition, lm-eval's own evaluator ----------------------------------


def model_args(condition) -> dict[str, str]:
    """A condition's names as lm-eval's model_args (what lm-eval's own command line would
    give pecli's model); a record in lm-eval's results, never parsed back."""
    return {k: v for k, v in condition.columns().items() if k != "condition"
            and not (k == "rope_scaling" and condition.rope is None)}


# HFLM's keys that mean something for a model pecli has loaded, and what each value must be;
# HFLM's others (backend, revision, peft, parallelize, ...) load or place a model: pecli does.
def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


HFLM_KEYS: dict[str, tuple[Any, str]] = {
    "max_length": (_count, "a positive integer (tokens)"),
    "max_batch_size": (_count, "a positive integer"),
    "truncation": (lambda v: isinstance(v, bool), "true or false"),
    "logits_cache": (lambda v: isinstance(v, bool), "true or false"),
    "add_bos_token": (lambda v: isinstance(v, bool), "true or false"),
    "enable_thinking": (lambda v: isinstance(v, bool), "true or false"),
    "prefix_token_id": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                        "a token id (an integer from 0)"),
    "softmax_dtype": (lambda v: v in ("float32", "float16", "bfloat16"), "float32, float16 or bfloat16"),
    "think_end_token": (lambda v: isinstance(v, str | int) and not isinstance(v, bool), "a token or its id"),
}
# What lm-eval's own command line adds to a model's arguments (the `pecli` model as a plugin)
BATCH = (lambda v: _count(v) or (isinstance(v, str) and re.fullmatch(r"auto(:\d+)?", v) is not None),
         "a positive integer, auto or auto:N")
# pecli's own keys: in `pecli lm-eval` each has its flag (the grid keys cross several values)
FLAGS = {"intervention": "--intervention", "mask": "--mask", "mask_semantics": "--mask-semantics",
         "protocol": "--protocol", "rope_scaling": "--rope-scaling", "seed": "--seed",
         "device": "--device", "dtype": "--dtype", "batch_size": "--batch_size"}


def parse_model_args(text: str, where: str = "--model_args") -> dict[str, Any]:
    """KEY=VALUE,... as lm-eval parses the values (numbers, true/false, none), refusing what
    lm-eval would drop or overwrite silently: an item without `=` or a key, a key given twice,
    an empty pretrained=."""
    from lm_eval.utils import handle_arg_string

    args: dict[str, Any] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"{where}: {item.strip()!r} is not KEY=VALUE; write e.g. "
                              "pretrained=smollm2,max_length=2048")
        if key in args:
            raise ConfigError(f"{where}: {key} is given twice; give each key once"
                              + (f" (several conditions: {FLAGS[key]} a,b)" if key in labels.columns() else ""))
        args[key] = handle_arg_string(value)
    if "pretrained" in args and (args["pretrained"] is None or not str(args["pretrained"]).strip()):
        raise ConfigError(f"{where}: pretrained= is empty; name a model (smollm2, random:gpt2, a "
                          "directory, a hub id)")
    return args


def check_hflm_args(args: dict[str, Any], where: str = "--model_args",
                    extra: dict[str, tuple[Any, str]] | None = None) -> None:
    """Every key one that HFLM uses on a model pecli loaded, every value of its kind."""
    known = {**HFLM_KEYS, **(extra or {})}
    for key, value in args.items():
        if key not in known:
            close = difflib.get_close_matches(key, [*known, *FLAGS, "pretrained"], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint}; the pecli model takes "
                              f"pretrained and {', '.join(sorted(known))}")
        ok, what = known[key]
        if not ok(value):
            raise ConfigError(f"{where}: {key}={value} must be {what}")


def split_model_args(text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """`pecli lm-eval --model_args`: ({"pretrained": NAME} or {}, HFLM's keys), checked. A key
    that sets the condition, the seed, the device, the dtype or the batch size is refused
    with its flag: the flags cross conditions and are recorded in every row."""
    args = parse_model_args(text)
    own = [k for k in args if k in FLAGS]
    if own:
        raise ConfigError(f"--model_args {own[0]}=...: in pecli lm-eval give {FLAGS[own[0]]} "
                          f"instead ({', '.join(FLAGS[k] for k in own)}); --model_args takes "
                          "pretrained= and HFLM's keys")
    hflm = {k: v for k, v in args.items() if k != "pretrained"}
    check_hflm_args(hflm)
    return {k: str(v) for k, v in args.items() if k == "pretrained"}, hflm


def run(options: LmEvalOptions, progress=None) -> dict[str, pd.DataFrame]:
    """The `lm_eval` table: one row per (condition, task, metric); lm-eval's results JSON of
    each condition under `options.save_dir`/<condition>/ (when given)."""
    from pecli.positions import conditions
    from pecli.runs.provenance import row_provenance

    o = options
    if not o.tasks:
        raise ConfigError("tasks (--tasks): name at least one lm-eval task, e.g. "
                          "truthfulqa_mc1,truthfulqa_mc2")
    _, hflm = split_model_args(o.model_args)  # a preset's model_args, checked as the flag's
    hflm = {"batch_size": o.batch_size or 8, **hflm}
    grid = conditions.grid(o)  # the intact, unscaled model first (as `pecli length` crosses)
    single = {"pretrained": o.model, "seed": o.seed, "device": o.device, "dtype": o.dtype}
    first = condition_options(single, "pecli lm-eval")
    check_before_loading(o.model, grid, causal=True)  # before the model loads
    if o.apply_chat_template:
        from pecli.models.loading import load_tokenizer

        check_chat_template(o.model, load_tokenizer(o.model))  # the tokenizer alone says
    if o.data_dir:  # the local task YAMLs (configs/lm_eval) read it from the environment
        from pecli.data.datasets import data_dir

        os.environ["PECLI_DATA_DIR"] = str(data_dir(o.data_dir))  # a folder, or one line
    if o.include_path is not None and not Path(o.include_path).is_dir():
        why = "is a file" if Path(o.include_path).exists() else "does not exist"
        raise ConfigError(f"include_path (--include_path): {o.include_path} {why}; give the "
                          "folder of your task YAMLs (e.g. configs/lm_eval)")
    quiet_lm_eval()
    meta = json.loads(o.metadata) if o.metadata else {}
    if "passkey" in o.tasks or any(k.startswith("passkey_") for k in meta):
        passkey_sizes(meta, "metadata (--metadata)")  # as `pecli passkey` checks its flags
    # lm-eval hands the model's name to tasks as metadata (passkey sizes prompts in its tokens)
    gen_kwargs = generation_kwargs(o.gen_kwargs)
    manager = _task_manager(o, meta)
    loaded = load(o.model, first)
    if o.apply_chat_template:
        check_chat_template(o.model, loaded.tokenizer)  # where only loading gave the tokenizer
    conditions.check_all(grid, loaded, causal=True)  # again, before any condition is scored
    if "passkey" in o.tasks:
        check_passkey_fits(loaded, passkey_sizes(meta, "metadata (--metadata)"), hflm)
    rows, per_doc = [], []  # per condition: {(task, metric, filter): {doc_id: value}}
    for i, how in enumerate(grid):
        lm = PecliLM(**single, loaded=loaded, condition=how, **hflm)
        cond = model_args(how)
        results, samples = _evaluated(lm, o, {**single, **cond, **hflm}, condition_dir(cond), manager,
                                      gen_kwargs)
        common = {**lm.loaded.provenance(), **lm.condition_columns(), "tokens": lm.tokens,
                  "seed": o.seed, "limit": o.limit, "lm_eval_version": lm_eval.__version__,
                  **prompt_columns(lm, o, gen_kwargs)}
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


def check_chat_template(model: str, tokenizer) -> None:
    """--apply_chat_template needs a tokenizer with a chat template (None: not known yet)."""
    if tokenizer is not None and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"apply_chat_template (--apply_chat_template): {model}'s tokenizer has "
                          "no chat template; drop the flag (a base model reads plain prompts)")


def _task_manager(o: LmEvalOptions, meta: dict):
    """lm-eval's TaskManager for these tasks, once every task is known (the model's name goes
    to tasks as metadata: passkey sizes prompts in its tokens); warns where a task's config
    fixes num_fewshot 0 against --num_fewshot."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=o.include_path, metadata={"pretrained": o.model, **meta})
    unknown = [t for t in o.tasks if t not in manager.all_tasks]
    if unknown:
        unread = unreadable_yamls(o.include_path)
        raise ConfigError(f"unknown lm-eval task {', '.join(unknown)}"
                          + (f"; {unread}" if unread else "; see `python -m lm_eval ls tasks`, "
                             "or give --include_path DIR for your own task YAMLs"))
    shots = fixed_shots(manager, o.tasks)
    if o.num_fewshot is not None:
        for task, n in shots.items():
            if n == 0 and o.num_fewshot != 0:
                warnings.warn(f"{task} fixes num_fewshot 0 in its config: lm-eval ignores "
                              f"--num_fewshot {o.num_fewshot} for it, and its rows say 0",
                              UserWarning, stacklevel=3)
    return manager


def _evaluated(lm: PecliLM, o: LmEvalOptions, model_args: dict, folder: str, manager,
               gen_kwargs: dict) -> tuple[dict, dict]:
    """(results, samples) of one lm-eval run of one condition's model; written under
    `o.save_dir`/`folder` as lm-eval's own command line writes them (samples with --log_samples)."""
    from lm_eval.loggers import EvaluationTracker

    args = ",".join(f"{k}={v}" for k, v in model_args.items() if v is not None)
    tracker = EvaluationTracker(output_path=str(Path(o.save_dir) / folder) if o.save_dir else None)
    python_seed, numpy_seed, torch_seed, fewshot_seed = o.lm_eval_seed
    try:
        with quiet_git():
            results = evaluate_or_say_why(
                lm_eval.simple_evaluate, tasks_named=o.tasks,
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
    if o.save_dir:
        tracker.save_results_aggregated(results=results, samples=samples if o.log_samples else None)
        for task in results["configs"] if o.log_samples else ():
            tracker.save_results_samples(task_name=task, samples=samples[task])
    return results, samples


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


class _Known(logging.Filter):
    """lm-eval's notes that say nothing about the numbers: a local task overriding its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "overrides existing task" not in record.getMessage()


def quiet_lm_eval() -> None:
    """lm-eval's warnings reach the user (truncation, fewshot overrides); its info does not."""
    for name in ("lm_eval", "lm_eval.tasks._index"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        if not any(isinstance(f, _Known) for f in logger.filters):
            logger.addFilter(_Known())


def unreadable_yamls(include_path: str | None) -> str:
    """Which task YAMLs under `include_path` lm-eval skipped because they do not parse."""
    from lm_eval.tasks._yaml_loader import load_yaml

    if include_path is None:
        return ""
    bad = []
    for path in sorted(Path(include_path).rglob("*.yaml")):
        try:
            load_yaml(path, resolve_func=False, recursive=True)
        except Exception as err:  # noqa: BLE001 (yaml and lm-eval raise many kinds)
            bad.append(f"{path} does not parse ({' '.join(str(err).split())[:160]})")
    return "; ".join(bad[:3])


def fixed_shots(manager, tasks) -> dict[str, int | None]:
    """Each task's num_fewshot as its YAML fixes it (None: not fixed)."""
    out = {}
    for task in tasks:
        entry = manager.task_index.get(task)
        cfg = getattr(entry, "cfg", None) or {}
        out[task] = cfg.get("num_fewshot") if isinstance(cfg, dict) else None
    return out


PASSKEY_KEYS = {"passkey_lengths": "lengths", "passkey_depths": "depths",
                "passkey_trials": "trials", "passkey_seed": "seed"}


def passkey_sizes(meta: dict[str, Any], where: str = "passkey metadata"):
    """The passkey task's sizes from lm-eval metadata, checked as `pecli passkey` checks its
    flags (PasskeyOptions: lengths, depths from 0 to 1, trials, seed): the same prompts, the
    same refusals. Returns the PasskeyOptions."""
    from pecli.experiments.options.passkey import PasskeyOptions

    unknown = [k for k in meta if k.startswith("passkey_") and k not in PASSKEY_KEYS]
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; the passkey task reads "
                          f"{', '.join(PASSKEY_KEYS)}")
    values = {PASSKEY_KEYS[k]: v for k, v in meta.items() if k in PASSKEY_KEYS}
    values.setdefault("lengths", [1024])
    try:
        return PasskeyOptions.build(values, where)
    except ConfigError as err:  # name the metadata keys, not the flags
        text = str(err)
        for key, name in PASSKEY_KEYS.items():
            text = text.replace(f"{name} (--{name})", key)
        raise ConfigError(text) from None


def check_passkey_fits(loaded, sizes, hflm: dict[str, Any]) -> None:
    """A passkey prompt and its answer must fit what the model sees: past a learned table it is
    not applicable (as in `pecli passkey`); past lm-eval's max_length lm-eval would cut the
    prompt's start, the key with it, so either is refused before any condition is scored."""
    from lm_eval.models.utils import resolve_max_length

    from pecli.measures.passkey import NEW_TOKENS
    from pecli.positions.extension import not_applicable

    longest = max(sizes.lengths) + NEW_TOKENS
    why = not_applicable(loaded, longest)
    if why is not None:
        raise ConfigError(f"passkey_lengths {max(sizes.lengths)}: {why} (the prompt and its "
                          f"{NEW_TOKENS} new tokens: {longest}); `pecli passkey` gives the same "
                          "length a not-applicable row")
    limit = hflm.get("max_length") or resolve_max_length(loaded.model.config, loaded.tokenizer,
                                                         default=HFLM._DEFAULT_MAX_LENGTH)
    if longest > limit:
        raise ConfigError(f"passkey_lengths {max(sizes.lengths)}: the prompt and its {NEW_TOKENS} "
                          f"new tokens ({longest}) exceed max_length {limit}, and lm-eval would "
                          f"cut the prompt's start (the key with it); give max_length={longest} "
                          "or more in --model_args, or shorter passkey_lengths")


def evaluate_or_say_why(evaluate, *, tasks_named, **kwargs) -> dict:
    """lm-eval's evaluator; what lm-eval raises while it builds or scores a task (a dataset on
    the unreachable hub, a request longer than the model takes) becomes one line naming it."""
    from pecli.runs.errors import PecliError

    try:
        return evaluate(**kwargs)
    except PecliError:
        raise
    except (OSError, ValueError, AssertionError, KeyError, IndexError, ImportError) as err:
        what = " ".join(str(err).split())[:240] or type(err).__name__
        hint = (" (offline: the task's dataset is not in the local cache)"
                if "connect" in f"{type(err).__name__} {what}".lower()
                or "offline" in what.lower() else "")
        raise ConfigError(f"lm-eval could not run {', '.join(tasks_named)}: "
                          f"{type(err).__name__}: {what}{hint}") from None


def documents(samples: dict) -> dict[tuple, dict[int, float]]:
    """Each (task, metric, filter)'s value per document, from lm-eval's logged samples."""
    out: dict[tuple, dict[int, float]] = {}
    for task, logged in samples.items():
        for s in logged:
            for metric, value in s.items():
                if isinstance(value, int | float) and metric != "doc_id":
                    out.setdefault((task, metric, s.get("filter")), {})[s["doc_id"]] = float(value)
    return out


def condition_dir(cond: dict[str, Any]) -> str:
    """A folder name for one condition's lm-eval output: intervention-mask-semantics[-rope]."""
    parts = [cond["intervention"], cond["mask"], cond["mask_semantics"]]
    parts += [cond["rope_scaling"]] if cond.get("rope_scaling") else []
    return "-".join(re.sub(r"[^\w.+=-]", "_", p) for p in parts)  # a mask file's path too


def task_rows(results: dict, docs: dict, common: dict, n_boot: int, seed: int) -> list[dict]:
    """One row per (task, metric, filter): lm-eval's value and stderr, and a 95 % interval by
    documents where the samples carry the metric per document (`docs`, from `documents`)."""
    rows = []
    for task, metrics in results["results"].items():
        n = results.get("n-samples", {}).get(task, {}).get("effective")
        config = results.get("configs", {}).get(task, {})
        version = results.get("versions", {}).get(task)
        shots = results.get("n-shot", {}).get(task, config.get("num_fewshot"))
        for key, value in metrics.items():
            if "," not in key or "_stderr" in key or not isinstance(value, int | float):
                continue
            metric, filt = key.split(",", 1)
            stderr = metrics.get(f"{metric}_stderr,{filt}")
            per_doc = list(docs.get((task, metric, filt), {}).values())
            low, high, method = document_interval(per_doc if len(per_doc) == n else [], stderr, value,
                                         n_boot, seed)
            if method.endswith("over documents") and not np.isclose(np.mean(per_doc), value):
                raise ValueError(f"{task} {metric}: the documents' mean {np.mean(per_doc)} is "
                                 f"not lm-eval's {value}")
            rows.append({**common, "task": task, "dataset": task, "split": config.get("test_split")
                         or config.get("validation_split") or "", "rows": n,
                         "task_version": version, "num_fewshot": shots, "metric": metric,
                         "filter": filt,
                         "value": float(value),
                         "stderr": float(stderr) if isinstance(stderr, int | float) else np.nan,
                         "ci_low": low, "ci_high": high, "interval_method": method})
    return rows


register("lm-eval", 1, run, LmEvalOptions, "pecli.plots.lm_eval:figures",
         "lm-evaluation-harness tasks under each condition (the pecli model)")


def results_json(folder: Path) -> list[Path]:
    """lm-eval's results files under a condition's folder (for tests and users)."""
    return sorted(Path(folder).rglob("results_*.json"))


def load_results(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))
