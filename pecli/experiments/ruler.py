"""RULER's synthetic long-context tasks by length, under every condition (pecli.measures.ruler).

For every model and condition (the intact, unscaled model first; then every intervention,
remedy and mask crossed with every --rope-scaling, conditions.grid), `samples` seeded samples
per (task, length), each with its own haystack slice, needles and depth, are read back by
greedy decoding with the KV cache (passkey's decode: one prefill per sample, samples of one
token count batched, no padding; as many new tokens as the cell's longest expected answer
needs, measures.ruler.decode_budget, stopping when every sequence of a batch has ended).
The samples are the same under every condition, so conditions differ only in the model. A
length no condition can take, or one shorter than a task's template, gives "not applicable"
rows, never a clamped number. Scores are RULER's recall of the expected strings;
docs/ruler.md says where pecli's tasks differ from RULER's and why.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, ClassVar

from pecli.experiments import CONDITION, Headline, Units, check_before_loading, load, register
from pecli.positions.rope_scaling import RopeScaled
from pecli.runs import names, parallel
from pecli.runs.errors import ConfigError
from pecli.runs.fields import MAX_RESAMPLES, option
from pecli.runs.options import (
    CAUSAL_MODELS_HELP,
    Masked,
    Running,
    _model_names,
    _token_counts,
    interventions,
    models,
)

if TYPE_CHECKING:
    import pandas as pd

TASK_NAMES = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
              "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa")
HAYSTACK_TEXTS = 5000  # a dataset's texts the essay haystack is cut from (a fixed, seeded subset)
INTERVAL = "95 % Wilson score interval over samples (all-or-nothing), else percentile bootstrap over samples"
DIFF_INTERVAL = ("the difference from intact on the same samples: 95 % Newcombe paired score interval "
                 "(all-or-nothing), else paired percentile bootstrap over samples")


@dataclass(frozen=True)
class RulerOptions(Running, RopeScaled, Masked):
    """`pecli ruler` and the `ruler` experiment: RULER's synthetic tasks (needles in a haystack,
    variable tracking, common/frequent words, question answering) by length, greedy decoding
    (pecli.measures.ruler)."""

    FLAGS: ClassVar[str] = ("model tasks lengths samples haystack intervention mask mask_semantics "
                            "rope_scaling rope_scaling_on batch_size bootstrap seed device dtype "
                            "data_dir out force")

    model: tuple[str, ...] | str = models(("random:llama",), CAUSAL_MODELS_HELP)
    intervention: tuple[names.Choice, ...] = interventions(
        ("intact",), "intact (the model unchanged; default), zero, sinks:4:2044, selfextend:4:2048, "
        "...; the intact model always runs first")
    tasks: tuple[str, ...] | str = option(
        ("niah_single_1", "niah_multikey_1", "vt", "cwe"),
        help="RULER tasks, a,b: " + ", ".join(TASK_NAMES) + " (default: niah_single_1, "
             "niah_multikey_1, vt, cwe).")
    lengths: tuple[int, ...] | str = option(
        (1024, 4096), help="Sequence lengths in tokens: the prompt plus the task's new tokens, as "
                           "RULER counts them, e.g. 4096,8192 (default 1024,4096).")
    samples: int = option(20, low=1, high=10_000, flag={"type": int | None, "default": None, "min": 1},
                          help="Samples per (task, length), each its own haystack slice, needles "
                               "and depth (default 20).")
    haystack: str = option("imdb", help="The essay haystack: imdb, truthfulqa (from the data "
                                        "directory) or a .txt/.md file.")
    bootstrap: int = option(1000, low=0, high=MAX_RESAMPLES,
                            help="Resamples of the bootstrap intervals over samples (recall "
                                 "below 1 and above 0): 0 (none) or 100 to 100000.")

    def check(self) -> None:
        super().check()
        object.__setattr__(self, "model", _model_names(self.model))
        object.__setattr__(self, "lengths", _token_counts(self.lengths, "sequence lengths"))
        tasks = tuple(dict.fromkeys(names.split_names(self.tasks)))
        unknown = [t for t in tasks if t not in TASK_NAMES]
        if not tasks or unknown:
            raise ConfigError(f"tasks (--tasks): {unknown[0] if unknown else self.tasks!r} is not a "
                              f"RULER task here; choose from {', '.join(TASK_NAMES)}")
        object.__setattr__(self, "tasks", tasks)
        from pecli.measures.ruler import TASKS

        for t in tasks:
            if min(self.lengths) < TASKS[t].min_length:
                raise ConfigError(f"lengths (--lengths): {min(self.lengths)} tokens is shorter than "
                                  f"{t}'s template, needles and {TASKS[t].new_tokens} new tokens; "
                                  f"give at least {TASKS[t].min_length}")
        if self.protocol != (names.parse(names.PROTOCOLS, "relative"),):
            raise ConfigError("protocol (--protocol): ruler decodes with the KV cache, where every "
                              "query weighs its own prefix (relative); drop --protocol")


@lru_cache(maxsize=4)
def essay(source: str, data_dir: str | None = None, qa: bool = False):
    """The essay haystack (pecli.measures.ruler.Haystack): a dataset pecli reads (imdb,
    truthfulqa: its text column) or a .txt/.md file; with `qa`, TruthfulQA's items too (the qa
    task's documents)."""
    import hashlib
    from dataclasses import replace
    from pathlib import Path

    from pecli.data.datasets import DATASETS, load_data, names_a_path
    from pecli.measures.ruler import haystack_of, qa_items
    from pecli.runs.errors import DataError

    path = Path(source).expanduser()
    try:
        if path.suffix.lower() in (".txt", ".md"):
            if not path.is_file():
                raise DataError(f"haystack (--haystack): {path} not found")
            raw = path.read_bytes()
            hay = replace(haystack_of([raw.decode("utf-8", errors="replace")], str(path)),
                          revision=f"sha256:{hashlib.sha256(raw).hexdigest()[:16]}")
        elif names_a_path(source):
            raise DataError(f"haystack (--haystack): {path} is not a .txt/.md file; give a plain "
                            f"text file or a dataset ({', '.join(DATASETS)})")
        else:
            data = load_data(source, data_dir_=data_dir, limit=HAYSTACK_TEXTS, at_most=True)
            hay = replace(haystack_of(data.texts(), f"{data.dataset}/{data.split}"), revision=data.revision)
        if qa:
            items = load_data("truthfulqa", data_dir_=data_dir)
            hay = replace(hay, qa=qa_items(list(items.frame["question"]), list(items.frame["correct_answers"])),
                          qa_revision=items.revision)
        return hay
    except ValueError as err:
        raise DataError(str(err)) from None


def samples_for(tokenizer, o: RulerOptions, hay) -> dict[tuple[str, int], list]:
    """Every (task, length)'s samples for this tokenizer (None where the template does not fit):
    the same under every condition, and the same for the lm-eval route."""
    from pecli.measures.ruler import fit

    try:
        return {(t, n): [fit(tokenizer, t, o.seed, n, i, hay) for i in range(o.samples)]
                for t in o.tasks for n in o.lengths}
    except ValueError as err:
        raise ConfigError(str(err)) from None


def run(options: RulerOptions, progress: Callable[[int, int], None] | None = None,
        loaded=None) -> dict[str, pd.DataFrame]:
    """`ruler` (mean recall with a 95 % interval over samples per model, condition, task and
    length) and `ruler_samples` (every sample: its depth, haystack slice, answers, output and
    recall; its prompt in the rows of the first condition). `loaded` replaces loading the one
    model (tests, benchmarks); `progress(advance, total)` counts samples."""
    import pandas as pd

    from pecli.measures.ruler import accuracy
    from pecli.models.sources import peek
    from pecli.positions.conditions import grid as grid_of
    from pecli.runs.provenance import row_provenance
    from pecli.runs.tables import validate

    o = options
    grid = grid_of(o)
    for name in o.model if loaded is None else ():
        check_before_loading(name, grid, causal=True)
        ref = peek(name)  # a table's positions, from the config before any weights
        refuse_past_the_table(name, o, ref.table_rows() if ref else None)
    hay = essay(o.haystack, o.data_dir, "qa" in o.tasks)
    rows, summary = [], []
    for name in o.model:
        model = loaded or load(name, o)
        got = _samples_under(model, grid, o, hay, progress)
        rows += got
        summary += accuracy(got, o.bootstrap, o.seed)
        del model
    extra = row_provenance()
    return {"ruler": validate(pd.DataFrame(summary).assign(**extra)),
            "ruler_samples": validate(pd.DataFrame(rows).assign(**extra))}


def refuse_past_the_table(name: str, o: RulerOptions, rows: int | None) -> None:
    """Every length past the `rows` positions of a table with no row past them (None: none)
    would give only "not applicable" rows: one line naming the largest length that works."""
    from pecli.measures.ruler import TASKS

    need = max(TASKS[t].min_length for t in o.tasks)  # the options' check refused fewer
    if rows is not None and rows < need:
        raise ConfigError(f"lengths (--lengths): {name}'s {rows} positions (a table with no row past "
                          f"them) hold none of {', '.join(o.tasks)}: they need at least {need} tokens")
    if rows is not None and min(o.lengths) > rows:
        raise ConfigError(f"lengths (--lengths): {','.join(map(str, o.lengths))} tokens are past "
                          f"{name}'s {rows} positions (a table with no row past them); give "
                          f"lengths of at most {rows}")


def _samples_under(loaded, grid, o: RulerOptions, hay, progress) -> list[dict]:
    from pecli.measures.passkey import decode
    from pecli.measures.ruler import TASKS, decode_budget, score
    from pecli.positions.conditions import check_all

    check_all(grid, loaded, causal=True)
    past = {n: all(how.reason(loaded, n, "the prompt and its answer") for how in grid) for n in o.lengths}
    refuse_past_the_table(loaded.name, o, loaded.max_positions if all(past.values()) else None)
    cells = {(t, n): [None] * o.samples if past[n] else got
             for (t, n), got in samples_for(loaded.tokenizer, o, hay).items()}
    budget = {cell: decode_budget(loaded.tokenizer, got) for cell, got in cells.items() if got[0] is not None}
    checkpoint = _checkpoint(loaded, o, cells)
    done = parallel.from_main(checkpoint.load_outputs() if parallel.is_main() else {})
    total = len(grid) * len(cells) * o.samples
    tick = (lambda k: progress(k, total)) if progress else None
    common = {"experiment": "ruler", "seed": o.seed, **loaded.provenance(), "dataset": "ruler",
              "split": "synthetic", "haystack": hay.name, "data_revision": hay.revision,
              **({"qa_data_revision": hay.qa_revision} if hay.qa else {}),
              "decoding": "greedy, KV cache; recall of the expected strings (RULER's string_match_all)",
              "context": loaded.max_positions}
    rows = []
    for c, how in enumerate(grid):
        columns = how.columns(loaded)
        with how.applied(loaded, o.seed):
            for (task, length), samples in cells.items():
                why = how.reason(loaded, length, "the prompt and its answer")
                if why is None and samples[0] is None:
                    why = f"not applicable: {task}'s template alone is longer than {length} tokens"
                base = {**common, **columns, "task": task, "length": length,
                        "max_new_tokens": budget.get((task, length), 0)}
                if why is not None:
                    rows += [{**base, "sample": i, "tokens": 0, "metric": "recall", "value": float("nan"),
                              "rows": 1, "note": why} for i in range(o.samples)]
                    if tick:
                        tick(o.samples)
                    continue
                key = (*how.computes, task, length)
                if key in done:  # decoded before (an interruption, or the same computation named otherwise)
                    if tick:
                        tick(len(samples))
                else:
                    done[key] = decode(loaded, samples, o.batch_size, progress=tick,
                                       new_tokens=budget[task, length])
                    checkpoint.save_outputs(done)
                outputs = done[key]
                for s, text in zip(samples, outputs, strict=True):
                    rows.append({**base, "sample": s.index, "attempt": s.attempt, "depth": s.depth,
                                 "start": s.start, "size": s.size, "tokens": len(s.ids),
                                 "answers": "|".join(s.answers), "output": text,
                                 "prompt": s.text if c == 0 else "", "metric": "recall",
                                 "value": score(text, s.answers, TASKS[task].match), "rows": 1,
                                 "note": ""})
    checkpoint.clear()
    return rows


def _checkpoint(loaded, o: RulerOptions, cells: dict):
    """Each finished (computation, task, length)'s outputs for this model and these samples
    (their prompts are the checkpoint's texts), saved as they finish: an interrupted run
    decodes only what it had not."""
    from pecli.runs.io import Checkpoint

    key = {"version": 1, **loaded.provenance(), "seed": o.seed, "batch_size": o.batch_size}
    return Checkpoint("ruler", key, [f"{t}|{n}|{s.text}" for (t, n), got in cells.items()
                                     for s in got if s is not None])


SAMPLES_JSONL = "ruler_samples.jsonl"


def samples_jsonl(tables: dict[str, pd.DataFrame]) -> str:
    """ruler_samples.jsonl: one line per sample, its prompt, answers and depth, and per
    condition its output, recall and note. Each field is typed here, so the run's frames and
    ruler_samples.csv read back as text (a preset's finished section) give the same file."""
    def missing(v) -> bool:
        return v is None or (isinstance(v, float) and v != v) or v == "" or str(v) == "<NA>"

    def text(v) -> str:
        return "" if missing(v) else str(v)

    def number(v, kind):
        return None if missing(v) else kind(float(v)) if kind is int else kind(v)

    kinds = {"length": int, "sample": int, "seed": int, "attempt": int, "tokens": int,
             "depth": float, "start": float}
    lines: dict[tuple, dict] = {}
    for row in tables["ruler_samples"].to_dict("records"):
        key = (text(row["model"]), text(row["task"]), number(row["length"], int),
               number(row["sample"], int))
        line = lines.setdefault(key, {k: number(row.get(k), kinds[k]) if k in kinds else text(row.get(k))
                                      for k in ("model", "task", "length", "sample", "seed", "attempt",
                                                "depth", "start", "tokens", "haystack", "answers")}
                                | {"prompt": "", "outputs": {}})
        line["prompt"] = line["prompt"] or text(row.get("prompt"))
        line["outputs"][text(row["condition"])] = {"output": text(row.get("output")),
                                                   "recall": number(row["value"], float),
                                                   "note": text(row.get("note"))}
    return "".join(json.dumps(line) + "\n" for line in lines.values())


def _slot(row) -> str:
    """A headline's slot: `niah_single_1, 4,096 tokens`."""
    return f"{row['task']}, {int(row['length']):,} tokens"


register("ruler", 1, run, RulerOptions, "pecli.plots.ruler:figures",
         "RULER's synthetic long-context tasks by length (greedy decoding; every condition)",
         headlines=(Headline("accuracy", "RULER accuracy (recall of the expected strings)", {},
                             CONDITION,
                             name="ruler_accuracy", slot=_slot, interval=INTERVAL,
                             axis="mean recall of the expected strings",
                             units=Units("_samples", cell=("task", "length"),
                                         pair=("task", "length", "sample"), draw=("answers",))),),
         companions={SAMPLES_JSONL: samples_jsonl})
