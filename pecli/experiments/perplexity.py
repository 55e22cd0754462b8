"""Perplexity with and without position information, under graded masks (study E2, E3).

One tokenisation; for each (intervention, mask, semantics, protocol) the per-token NLLs of
every text, then every aggregation of them, each a named row. Conditions that are the same
computation (the default mask under any semantics or protocol) are computed once.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from pecli.experiments import Headline, check_before_loading, data_of, load, register
from pecli.experiments.options.perplexity import PerplexityOptions
from pecli.measures.intervals import paired_perplexity
from pecli.measures.intervals import perplexity_intervals as intervals  # noqa: F401 (tests)
from pecli.measures.lm_scoring import resumed_nlls, start_token
from pecli.measures.lm_scoring import saved_nlls as _saved
from pecli.measures.metrics import aggregate, per_text_perplexity
from pecli.runs import names
from pecli.runs.errors import DataError
from pecli.runs.provenance import row_provenance
from pecli.runs.tables import validate

HEADLINE = "corpus"  # the aggregation summaries lead with; every other is a row too
NO_POSITIONS = names.parse(names.INTERVENTIONS, "zero")  # the study's E2/E3 "without"
DEFAULT_MASK = names.parse(names.MASKS, "default")
# The study's E2/E3 perplexities of gpt2 on TruthfulQA (transformers 4.x: legacy semantics;
# which aggregation it used is not stated), shown beside ours when the model is gpt2.
STUDY_MODEL, STUDY_DATASET = "gpt2", "truthfulqa"
STUDY_VALUES = {("intact", "default"): 111.2409, ("zero", "default"): 712014.3125,
                ("zero", "linear"): 11897.4824}


def conditions(options: PerplexityOptions) -> list:
    """The run's conditions (pecli.positions.conditions.grid), the intact model first.

    intervention None is the study's E2/E3: (intact, default), and for any other mask shape
    also (zero, default) and (zero, shape); an explicit intervention list is crossed with
    the masks. Each pair is crossed with every semantics and protocol (the default mask
    named under each).
    """
    from pecli.positions.conditions import grid

    o = options
    pairs = None
    if o.intervention is None:
        shapes = [m for m in o.mask if m.name != "default"]
        pairs = [(NO_POSITIONS, DEFAULT_MASK), *((NO_POSITIONS, m) for m in shapes)] if shapes else []
    return grid(o, pairs=pairs, default_once=False)


def run(options: PerplexityOptions, progress: Callable[[int, int], None] | None = None,
        loaded=None) -> dict[str, pd.DataFrame]:
    """Perplexity tables: `perplexity` (one row per condition x aggregation, with its 95 %
    bootstrap interval over texts) and `texts` (one row per condition x text: its scored
    tokens and perplexity).

    The run covers `conditions(options)`. `loaded` (a LoadedModel) skips
    loading the model, for tests and benchmarks; `progress(advance, total)` is told of
    every scored batch.
    """
    from pecli.measures.lm_scoring import score
    from pecli.positions.conditions import check_all

    o = options
    plans = conditions(o)
    if loaded is None:
        check_before_loading(o.model, plans, causal=True)
    data = data_of(o)
    loaded = loaded or load(o.model, o)
    check_all(plans, loaded, causal=True)
    texts = data.texts()
    prepared = _prepared(loaded, texts, o)
    common = {"experiment": "perplexity", "seed": o.seed, **row_provenance(), **loaded.provenance(),
              **data.provenance(), "text_field": data.text_field, "start_token": prepared.start_token,
              "long_text": prepared.long_text, "stride": prepared.stride,
              "truncated": prepared.truncated, "dropped_tokens": prepared.dropped_tokens,
              "tokens": prepared.tokens, "padding_side": o.padding_side}
    total = sum(prepared.tokens for _ in plans)
    checkpoint = _checkpoint(loaded, texts, prepared, o.padding_side, o.batch_size, o.seed)
    # computation -> per-text NLLs, shared by identical conditions; resumed from an interrupted run
    done: dict[tuple, list] = resumed_nlls(checkpoint)
    rows, text_rows = [], []
    keys = [(str(h.intervention), h.computation, h.passes) for h in plans]
    for how, key in zip(plans, keys, strict=True):
        if key not in done:
            with how.applied(loaded, o.seed):
                done[key] = score(loaded, prepared, how, batch_size=o.batch_size,
                                  side=o.padding_side,
                                  progress=(lambda n: progress(n, total)) if progress else None)[0]
                checkpoint.save(lambda: _saved(done), force=True)
        elif progress:
            progress(prepared.tokens, total)
        intact = next((done[k] for k, h in zip(keys, plans, strict=True) if h.label == "intact" and k in done), None)
        _condition_rows(loaded, data, prepared, how, done[key], common, o, rows, text_rows,
                        None if how.label == "intact" else intact)
    checkpoint.clear()
    notes = row_provenance()  # again: what happened while scoring (oom_splits: batches halved)
    return {"perplexity": validate(pd.DataFrame(rows).assign(**notes)),
            "texts": validate(pd.DataFrame(text_rows).assign(**notes))}


def _prepared(loaded, texts: list[str], o: PerplexityOptions):
    """The texts tokenised once and cut into the windows every condition scores."""
    from pecli.measures.lm_scoring import windows_for
    from pecli.runs.batching import encode

    bos = start_token(loaded, o.start_token, "run with --no-start-token")
    ids = encode(loaded.tokenizer, texts, max_length=10**12, add_special_tokens=False).ids
    prepared = windows_for(ids, loaded.max_positions, bos, o.long_text.name, o.stride)
    if prepared.tokens == 0:
        raise DataError("no text has a token to score; use --start-token or longer texts")
    return prepared


def _condition_rows(loaded, data, prepared, how, nlls: list, common: dict, o: PerplexityOptions,
                    rows: list[dict], text_rows: list[dict], intact: list | None) -> None:
    """A condition's rows: each aggregation with its interval and its paired difference from
    the intact model's `intact` NLLs on the same texts (`rows`), each text (`text_rows`)."""
    from pecli.measures.lm_scoring import batch_plan

    cond = {"condition": how.label, **how.names, "computation": how.computation, "passes": how.passes,
            **batch_plan(loaded, prepared.windows, how.passes, o.batch_size),
            "texts_scored": sum(x.numel() > 0 for x in nlls)}
    study = _study_value(loaded.model_id, data.dataset, how)
    ci = intervals(nlls, o.bootstrap, o.seed)
    diffs = paired_perplexity(nlls, intact, o.bootstrap, o.seed)
    for agg, value in aggregate(nlls).items():
        rows.append({**common, **cond, "metric": "perplexity", "aggregation": agg, "value": value,
                     "ci_low": ci[agg][0], "ci_high": ci[agg][1], **diffs[agg],
                     "headline": agg == HEADLINE, "study_value": study})
    for text_id, x in zip(data.text_ids(), nlls, strict=True):
        text_rows.append({**common, **cond, "metric": "text_perplexity", "text_id": text_id,
                          "text_tokens": x.numel(), "value": per_text_perplexity(x)})


def _study_value(model_id: str, dataset: str, how) -> float:
    """The study's number for this condition (a Plan) when the model and data are the
    study's, else NaN."""
    if model_id != STUDY_MODEL or dataset != STUDY_DATASET:
        return float("nan")
    if how.mask.name != "default" and how.mask_semantics.name != "legacy":  # transformers 4.x
        return float("nan")
    return STUDY_VALUES.get((str(how.intervention), str(how.mask)), float("nan"))


# --- resuming: each finished computation is saved (pecli.runs.io.Checkpoint) -------------------


def _checkpoint(loaded, texts, prepared, padding_side, batch_size, seed):
    from pecli.runs.io import Checkpoint

    return Checkpoint("perplexity", {
        "version": 1, **loaded.provenance(), "start_token": prepared.start_token,
        "long_text": prepared.long_text, "stride": prepared.stride, "padding_side": padding_side,
        "batch_size": batch_size, "seed": seed}, texts)


# version 2: per-text rows carry text_id; 3: ci_low/ci_high on every aggregation, study_value
# (diff_vs_intact, diff_ci_low, diff_ci_high added without a new version: the numbers before are the same)
register("perplexity", 3, run, PerplexityOptions, "pecli.plots.perplexity:figures",
         "Perplexity under position interventions and graded attention masks (E2, E3), "
         "every aggregation, semantics and protocol named",
         headlines=(Headline("perplexity", "corpus perplexity", {"aggregation": "corpus"},
                             ("intervention", "mask", "mask_semantics", "protocol")),))
