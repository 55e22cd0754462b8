"""TruthfulQA multiple choice (MC1, MC2, MC1-norm) with and without position information.

One tokenisation; for each (intervention, mask, semantics, protocol) the log-likelihood of
every choice of every item (pecli.measures.mc_scoring), then the per-item metrics, their mean, standard error
and bootstrap interval over items. The intact condition (own positions, default mask) is
always computed and comes first; conditions that are the same computation run once.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from pecli.experiments import CONDITION, Headline, Units, check_before_loading, load, register
from pecli.experiments.options.mc import McOptions
from pecli.runs.provenance import row_provenance
from pecli.runs.tables import validate

TASK_VERSIONS = "truthfulqa_mc1 v2.0, truthfulqa_mc2 v2.0 (lm-evaluation-harness)"


def conditions(options: McOptions) -> list:
    """The run's conditions (pecli.positions.conditions.grid): the intact model (intact,
    default, legacy, relative) first, then every (intervention, mask, semantics, protocol)
    asked for; the default mask, the unchanged model under every semantics and protocol,
    gives one condition per intervention (named legacy, relative)."""
    from pecli.positions.conditions import grid

    return grid(options)


def summarise(values: np.ndarray, n_boot: int, seed: int) -> dict:
    """Mean over items, its standard error (sample sd / sqrt n, as the harness) and 95 %
    interval by `accuracy_interval`: Wilson's where every item is right or wrong (MC1: a
    bootstrap of 0/1 values collapses to [0, 0] when none is right), as the lm-eval path; a
    bootstrap otherwise (MC2). None from fewer than 2 items, or with --bootstrap 0."""
    from pecli.measures.intervals import accuracy_interval, accuracy_method

    low, high = accuracy_interval(values, n_boot=n_boot, seed=seed)
    method = accuracy_method(values, "items") if low == low else ""
    stderr = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
    return {"value": float(values.mean()), "stderr": stderr, "ci_low": low, "ci_high": high,
            "interval_method": method}


def chance(items, metric: str) -> float:
    """The expected value of a metric when every choice is equally likely."""
    if metric == "mc2":
        return float(np.mean([(list(lab) + [0]).index(0) / len(lab)
                              for lab in (it.targets["mc2"][1] for it in items)]))
    return float(np.mean([1 / len(it.targets["mc1"][0]) for it in items]))


def run(options: McOptions, progress: Callable[[int, int], None] | None = None,
        loaded=None) -> dict[str, pd.DataFrame]:
    """Tables `mc` (condition x metric: value, stderr, ci_low, ci_high, chance and whether the
    interval contains it, the paired difference from intact over items) and `mc_items`
    (condition x item x task x choice: log-likelihood, label, picked).

    The run covers `conditions(options)`. `loaded` skips loading the model
    (tests, benchmarks); `progress(advance, total)` is told of every finished condition (in
    items).
    """
    from pecli.data import items as item_files
    from pecli.measures import mc_scoring as mc
    from pecli.measures.intervals import diff_columns
    from pecli.positions.conditions import check_all

    o = options
    conds = conditions(o)
    if loaded is None:
        check_before_loading(o.model, conds, causal=True)
    items, data = item_files.load_items(o.dataset, o.data_dir, o.limit, o.seed)
    loaded = loaded or load(o.model, o)
    check_all(conds, loaded, causal=True)
    reqs = mc.requests(loaded.tokenizer, items)
    pairs = [(r.context, c) for r in reqs for c in r.continuations]
    common = {"experiment": "mc", "seed": o.seed, **row_provenance(), **loaded.provenance(),
              **data.provenance(), "tasks": TASK_VERSIONS, "items": len(items),
              "choices_scored": len(pairs), "tokens": sum(len(c) for _, c in pairs),
              "context_tokens_mean": float(np.mean([len(r.context) for r in reqs])),
              "truncated_pairs": sum(len(a) + len(c) > loaded.max_positions + 1 for a, c in pairs),
              "aggregation": "mean_over_items", "bootstrap": o.bootstrap}
    done: dict[tuple, tuple] = {}  # (intervention, computation) -> (log-likelihoods, how)
    rows, item_rows, intact = [], [], {}
    for plan in conds:
        key = (str(plan.intervention), plan.computation)
        if key not in done:
            with plan.applied(loaded, o.seed):
                done[key] = mc.score(loaded, reqs, plan, batch_size=o.batch_size)
        if progress:
            progress(len(items), len(items) * len(conds))
        lls, how = done[key]
        cond = {"condition": plan.label, **plan.names, "computation": how.computation, "passes": how.passes,
                **mc.batch_plan(loaded, reqs, how.passes, o.batch_size),
                "intact": plan == conds[0]}
        scored = [mc.item_scores(it, ll) for it, ll in zip(items, lls, strict=True)]
        for metric in mc.METRICS:
            values = np.array([s["values"][metric] for s in scored])
            if plan == conds[0]:
                intact[metric] = values
            row = summarise(values, o.bootstrap, o.seed)
            level = chance(items, metric)
            rows.append({**common, **cond, "metric": metric, **row, "chance": level,
                         "chance_in_interval": bool(row["ci_low"] <= level <= row["ci_high"]),
                         # Newcombe's paired interval for MC1's right-or-wrong items, a paired bootstrap for MC2
                         **diff_columns(values, intact[metric], n_boot=o.bootstrap, seed=o.seed,
                                        reference_row=plan == conds[0]),
                         "meaning": mc.METRIC_MEANING[metric]})
        for it, s in zip(items, scored, strict=True):
            for task, t in s["tasks"].items():
                for j, (choice, label, ll) in enumerate(zip(t["choices"], t["labels"], t["loglik"],
                                                            strict=True)):
                    item_rows.append({**common, **cond, "metric": "choice_loglik", "value": float(ll),
                                      "text_id": it.text_id, "task": task, "choice_index": j,
                                      "choice": choice, "label": label, "picked": j == t["picked"],
                                      "picked_norm": j == t["picked_norm"],
                                      "item_value": s["values"][task]})
    notes = row_provenance()  # again: what happened while scoring (process shares, OOM splits)
    return {"mc": validate(pd.DataFrame(rows).assign(**notes)),
            "mc_items": validate(pd.DataFrame(item_rows).assign(**notes))}


def item_values(choices: pd.DataFrame, metric: str) -> pd.DataFrame:
    """mc_items' rows (one per choice) -> one row per item with its `metric` value: MC1 and
    MC2 as the items table gives them, MC1 normalised from the choice picked by
    length-normalised log-likelihood (right when it is the true one)."""
    rows = choices[choices["task"] == ("mc2" if metric == "mc2" else "mc1")]
    if metric == "mc1_norm":
        rows = rows[rows["picked_norm"].astype(str).str.lower() == "true"]
        return rows.assign(value=rows["label"].astype(float))
    return rows.drop_duplicates("text_id").assign(value=lambda r: r["item_value"].astype(float))


# an item is drawn from its data: the same text_id of other data is another item
ITEMS = Units("_items", cell=(), pair=("text_id",), draw=("data_revision", "text_id"), per_unit=item_values)


# version 1: Wilson for MC1 since issue 36: rows say which (interval_method); values unchanged
register("mc", 1, run, McOptions, "pecli.plots.mc:figures",
         "TruthfulQA MC1/MC2 (lm-evaluation-harness v2.0) under position interventions "
         "and graded masks, with bootstrap intervals over items",
         headlines=tuple(Headline(metric, quantity, {}, CONDITION,
                                  interval="95 % percentile bootstrap over items", units=ITEMS)
                         for metric, quantity in (
                             ("mc1", "TruthfulQA MC1 accuracy"),
                             ("mc2", "TruthfulQA MC2 (mass on the true answers)"),
                             ("mc1_norm", "TruthfulQA MC1, length-normalised (acc_norm)"))))
