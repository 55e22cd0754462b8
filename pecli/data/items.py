"""Multiple-choice item files: TruthfulQA's `truthfulqa-mc` (hub or data directory) or a user's
.json / .jsonl file of items, each a question with `mc1_targets` and `mc2_targets`, read and
checked into `Item`s (scored by pecli.measures.mc_scoring).

A target is `{choice: label}` (mc_task.json) or `{"choices": [...], "labels": [...]}` (the
hub's form); the first choice is the true one. Errors name the item (0-based in its source).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pecli.runs.errors import DataError

TASKS = ("mc1", "mc2")


@dataclass(frozen=True)
class Item:
    text_id: int  # index of the item in its source
    question: str
    targets: dict[str, tuple[tuple[str, ...], tuple[int, ...]]]  # task -> (choices, labels)

    @property
    def choices(self) -> list[str]:
        """Distinct choices over both tasks (MC1's are usually among MC2's): each scored once."""
        return list(dict.fromkeys(c for t in TASKS for c in self.targets[t][0]))


def _targets(value, where: str, task: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """{choice: label} (mc_task.json) or {"choices": [...], "labels": [...]} (the hub's form)."""
    if not isinstance(value, dict):
        raise DataError(f"{where}: {task}_targets must be a {{choice: label}} mapping or "
                        f"{{\"choices\": [...], \"labels\": [...]}}, not {type(value).__name__}")
    if set(value) == {"choices", "labels"}:
        choices, labels = list(value["choices"]), list(value["labels"])
        if len(choices) != len(labels):
            raise DataError(f"{where}: {task}_targets has {len(choices)} choices but {len(labels)} labels")
    else:
        choices, labels = list(value), list(value.values())
    if not choices:
        raise DataError(f"{where}: {task}_targets has no choices")
    if not all(isinstance(c, str) for c in choices):
        raise DataError(f"{where}: {task}_targets has a choice that is not a string")
    bad = [x for x in labels if isinstance(x, bool) or not isinstance(x, int | float) or x not in (0, 1)]
    if bad:
        raise DataError(f"{where}: {task}_targets labels must be 0 or 1 (numbers), not {bad[0]!r}")
    labels = [int(x) for x in labels]
    if task == "mc1" and sum(labels) != 1:
        raise DataError(f"{where}: mc1_targets has {sum(labels)} true choices; MC1 scores exactly one "
                        "true answer (put the others under mc2_targets)")
    if labels[0] != 1:
        # MC1 takes the first choice as the true one; MC2 counts the true ones before the first false
        raise DataError(f"{where}: {task}_targets has no true choice first (the first choice must be "
                        "labelled 1: the true answer, as in TruthfulQA)")
    return tuple(choices), tuple(labels)


def parse_items(records, source: str, text_ids=None) -> list[Item]:
    """Validated items from dict-like records; errors name the item (0-based in its source)."""
    items = []
    for n, rec in enumerate(records):
        text_id = int(text_ids[n]) if text_ids is not None else n
        where = f"{source} item {text_id}"
        if not isinstance(rec, dict):
            raise DataError(f"{where}: not an object with question, mc1_targets, mc2_targets")
        for field in ("question", "mc1_targets", "mc2_targets"):
            if field not in rec or rec[field] is None:
                raise DataError(f"{where}: missing field {field!r}; each item needs question, "
                                "mc1_targets and mc2_targets")
        if not isinstance(rec["question"], str) or not rec["question"].strip():
            raise DataError(f"{where}: the question is empty")
        items.append(Item(text_id, rec["question"],
                          {t: _targets(_plain(rec[f"{t}_targets"]), where, t) for t in TASKS}))
    return items


def _plain(value):
    # the hub's frame holds numpy arrays inside the targets dict
    if isinstance(value, dict):
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in value.items()}
    return value


def read_file(path: Path) -> tuple[list, str]:
    """(records of a JSON list or a JSONL file, the sha256 of the bytes read: read once, so a
    FIFO works)."""
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
        if path.suffix.lower() == ".jsonl":
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            records = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"cannot read {path}: {str(err).splitlines()[0]}") from None
    if not isinstance(records, list):
        raise DataError(f"{path}: a multiple-choice file is a JSON list of items (or JSONL)")
    return records, hashlib.sha256(raw).hexdigest()


def load_items(dataset: str = "truthfulqa-mc", data_dir: str | None = None, limit: int | None = None,
               seed: int = 0):
    """(items, TextData) for `truthfulqa-mc` (hub or data directory) or a .json/.jsonl file.

    `limit` draws a seeded subset; every item keeps its index in the source (`text_id`).
    """
    import pandas as pd

    from pecli.data.datasets import TextData, load_data, subset

    path = Path(dataset).expanduser()
    if path.suffix.lower() in (".json", ".jsonl"):
        if not path.exists():
            raise DataError(f"data file {path} does not exist")
        records, digest = read_file(path)
        parse_items(records, path.name)  # every item checked, not only the subset
        frame = pd.DataFrame({"record": records})
        data = TextData(frame, path.name, "file", "local", "sha256:" + digest[:16],
                        "question", None, len(frame))
    else:
        if path.suffix:
            raise DataError(f"{path.name}: a multiple-choice file must be .json (a list) or .jsonl")
        data = load_data(dataset, data_dir_=data_dir)
        if not {"mc1_targets", "mc2_targets"} <= set(data.frame.columns):
            raise DataError(f"{dataset} has no mc1_targets/mc2_targets: use truthfulqa-mc or a "
                            "JSON/JSONL file of question, mc1_targets, mc2_targets")
        frame = pd.DataFrame({"record": data.frame.to_dict("records")})
    if len(frame) == 0:
        raise DataError(f"{data.dataset} has no items")
    frame["text_id"] = range(len(frame))
    data.frame = subset(frame, limit, seed, None, data.dataset)
    items = parse_items(data.frame["record"].tolist(), data.dataset, data.frame["text_id"].tolist())
    return items, data
