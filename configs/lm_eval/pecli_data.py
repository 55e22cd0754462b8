"""Local data for lm-eval tasks: the data directory pecli reads (PECLI_DATA_DIR, the
layout of shared/data), in the hub's shapes, so the tasks' own prompts and metrics apply.

Task YAMLs name these functions with `!function pecli_data.NAME`.
"""

import json
import os
from pathlib import Path

import datasets

# TruthfulQA MC2 as lm-eval scores it (version 3.0: the normalised probability mass of every
# true choice), imported, not restated.
from lm_eval.tasks.truthfulqa.utils import process_results_mc2  # noqa: F401


def data_dir() -> Path:
    root = os.environ.get("PECLI_DATA_DIR")
    if not root:
        raise ValueError("set PECLI_DATA_DIR to the data directory (the layout of shared/data)")
    return Path(root).expanduser()


def _targets(mapping: dict) -> dict:
    """{choice: label} (the file's shape) -> {"choices": [...], "labels": [...]} (the hub's)."""
    return {"choices": list(mapping), "labels": [int(v) for v in mapping.values()]}


def truthfulqa_mc(**kwargs) -> datasets.DatasetDict:
    """truthfulqa/mc_task.json as the hub's truthful_qa `multiple_choice` config: one
    `validation` split of question, mc1_targets, mc2_targets, in the file's order."""
    path = data_dir() / "truthfulqa" / "mc_task.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: PECLI_DATA_DIR must hold truthfulqa/mc_task.json")
    items = json.loads(path.read_text(encoding="utf-8"))
    rows = [{"question": it["question"], "mc1_targets": _targets(it["mc1_targets"]),
             "mc2_targets": _targets(it["mc2_targets"])} for it in items]
    return datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)})


def _tokenizer(kwargs: dict):
    """The tokenizer of the model the task is run with (lm-eval passes model_args as
    metadata: `pretrained=`), loaded as pecli loads it, so prompts fit it in tokens."""
    from pecli.models.loading import load_model

    name = kwargs.get("tokenizer") or kwargs.get("pretrained")
    if not name:
        raise ValueError("passkey sizes prompts in the model's tokens: run it with "
                         "model_args pretrained=NAME (or metadata tokenizer=NAME)")
    return load_model(str(name), device="cpu").tokenizer


def passkey(**kwargs) -> datasets.DatasetDict:
    """pecli passkey's trials as documents: for each length (metadata `passkey_lengths`,
    tokens; default 1024) and depth (`passkey_depths`, default 0, 0.5, 1), `passkey_trials`
    (default 5) prompts with seeded keys (`passkey_seed`, default 0): the same prompts and
    keys `pecli passkey` builds for the same tokenizer."""
    from pecli.integrations.lm_eval import passkey_sizes
    from pecli.measures.passkey import fit, keys

    sizes = passkey_sizes(kwargs)  # checked as `pecli passkey` checks its flags
    tokenizer = _tokenizer(kwargs)
    rows = []
    for length in sizes.lengths:
        for depth in sizes.depths:
            for k in keys(sizes.seed, length, depth, sizes.trials):
                trial = fit(tokenizer, k, length, depth)
                if trial is None:
                    raise ValueError(f"the passkey template alone is longer than {length} tokens")
                rows.append({"prompt": trial.text, "k": k, "length": int(length),
                             "depth": float(depth), "tokens": len(trial.ids)})
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def passkey_results(doc: dict, results: list[str]) -> dict:
    """pecli's decoding rule: right when the first integer of the output is the key."""
    from pecli.measures.passkey import answer

    return {"acc": float(answer(results[0]) == doc["k"])}


def _ruler(family: str, kwargs: dict) -> datasets.DatasetDict:
    """pecli ruler's samples of one family of tasks (niah, vt, cwe, fwe, qa) as documents: for each
    task among metadata `ruler_tasks` (default: pecli ruler's), length (`ruler_lengths`) and
    sample (`ruler_samples`, seed `ruler_seed`, haystack `ruler_haystack`), the same prompt and
    answers `pecli ruler` builds for the same tokenizer, and its decoding budget
    (`max_new_tokens`, which lm-eval's model `pecli` decodes; other models the YAML's 128)."""
    from pecli.experiments.ruler import RulerOptions, essay, samples_for
    from pecli.measures.ruler import TASKS, decode_budget

    keys = {"ruler_tasks": "tasks", "ruler_lengths": "lengths", "ruler_samples": "samples",
            "ruler_seed": "seed", "ruler_haystack": "haystack"}
    values = {name: kwargs[k] for k, name in keys.items() if k in kwargs}
    o = RulerOptions.build(values, "ruler metadata")  # checked as pecli ruler checks its flags
    o = o.replace(tasks=tuple(t for t in o.tasks if TASKS[t].family == family))
    rows = []
    tokenizer = _tokenizer(kwargs)
    for (task, length), samples in samples_for(tokenizer, o, essay(o.haystack, str(data_dir()), family == "qa")).items():
        if samples[0] is None:
            raise ValueError(f"{task}'s template alone is longer than {length} tokens")
        budget = decode_budget(tokenizer, samples)
        rows += [{"prompt": s.text, "answers": list(s.answers), "task": task, "length": length,
                  "sample": s.index, "tokens": len(s.ids), "max_new_tokens": budget} for s in samples]
    if not rows:
        raise ValueError(f"ruler_tasks names no {family} task")
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def ruler_niah(**kwargs) -> datasets.DatasetDict:
    return _ruler("niah", kwargs)


def ruler_vt(**kwargs) -> datasets.DatasetDict:
    return _ruler("vt", kwargs)


def ruler_cwe(**kwargs) -> datasets.DatasetDict:
    return _ruler("cwe", kwargs)


def ruler_fwe(**kwargs) -> datasets.DatasetDict:
    return _ruler("fwe", kwargs)


def ruler_qa(**kwargs) -> datasets.DatasetDict:
    return _ruler("qa", kwargs)


def ruler_results(doc: dict, results: list[str]) -> dict:
    """pecli ruler's score: RULER's recall of the expected strings in the output (for qa: any
    of them)."""
    from pecli.measures.ruler import TASKS, score

    return {"recall": score(results[0], tuple(doc["answers"]), TASKS[doc["task"]].match)}
