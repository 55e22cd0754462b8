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
