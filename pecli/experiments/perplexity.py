"""Perplexity with and without position information, under graded masks (study E2, E3).

One tokenisation; for each (intervention, mask, semantics, protocol) the per-token NLLs of
every text, then every aggregation of them, each a named row. Conditions that are the same
computation (the default mask under any semantics or protocol) are computed once.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from pecli import parallel
from pecli.errors import ConfigError, DataError
from pecli.experiments import EXPERIMENTS, Experiment, lazy
from pecli.metrics import aggregate, per_text_perplexity
from pecli.provenance import row_provenance
from pecli.tables import validate

HEADLINE = "corpus"  # the aggregation summaries lead with; every other is a row too
BASELINE = ("learned", "default")  # the intact model: its own positions, the default mask
NO_POSITIONS = "zero"
# The study's E2/E3 perplexities of gpt2 on TruthfulQA (transformers 4.x: legacy semantics;
# which aggregation it used is not stated), shown beside ours when the model is gpt2.
STUDY_MODEL, STUDY_DATASET = "gpt2", "truthfulqa"
STUDY_VALUES = {("learned", "default"): 111.2409, ("zero", "default"): 712014.3125,
                ("zero", "linear"): 11897.4824}


def as_list(value, what: str) -> list[str]:
    """A name, a list of names, or "a,b" -> a list of distinct names, in order."""
    items = [value] if isinstance(value, str) else list(value or [])
    items = [s.strip() for item in items for s in str(item).split(",") if s.strip()]
    if not items:
        raise ConfigError(f"no {what} given")
    return list(dict.fromkeys(items))  # keep order, drop repeats


def conditions(pe, masks, semantics, protocol) -> list[tuple[str, str, str, str]]:
    """Every (intervention, mask, semantics, protocol) to run, names checked, the intact
    baseline (learned, default) first.

    pe=None is the study's E2/E3: (learned, default), and for any other mask shape also
    (zero, default) and (zero, shape); an explicit pe list is crossed with the masks.
    """
    from pecli.lm_scoring import plan

    masks = as_list(masks, "mask")
    if pe is None:
        shapes = [m for m in masks if m != "default"]
        pairs = [BASELINE] + ([(NO_POSITIONS, "default")] + [(NO_POSITIONS, m) for m in shapes]
                              if shapes else [])
    else:
        pairs = [(p, m) for p in as_list(pe, "intervention") for m in masks]
        pairs = [BASELINE] + [x for x in pairs if x != BASELINE]
    grid = [(p, m, s, pr) for p, m in pairs for s in as_list(semantics, "mask semantics")
            for pr in as_list(protocol, "protocol")]
    for _, m, s, pr in grid:
        plan(m, s, pr)  # unknown names fail here, before a model loads
    return grid


def run(model: str = "random:gpt2", pe=None, masks="default", semantics="legacy",
        protocol="relative", dataset: str = "truthfulqa", split: str | None = None,
        text_field: str | None = None, limit: int | None = None, seed: int = 0,
        device: str = "auto", dtype: str = "float32", data_dir: str | None = None,
        batch_size: int | None = None, add_start_token: bool = True, long_text: str = "truncate",
        stride: int | None = None, padding_side: str = "right", bootstrap: int = 1000,
        loaded=None, progress: Callable[[int, int], None] | None = None,
        device_map: str | None = None, max_memory: str | None = None) -> dict[str, pd.DataFrame]:
    """Perplexity tables: `perplexity` (one row per condition x aggregation, with its 95 %
    bootstrap interval over texts) and `texts` (one row per condition x text: its scored
    tokens and perplexity).

    pe, masks, semantics and protocol each take a name or a list (or "a,b"); the run covers
    their product, after the intact baseline (learned, default); pe=None is the study's
    E2/E3 (see `conditions`). `bootstrap`: resamples of the intervals (0: none). `loaded` (a
    LoadedModel) skips loading `model`, for tests and benchmarks; `progress(advance,
    total)` is told of every scored batch.
    """
    from pecli.batching import encode
    from pecli.data import load_data
    from pecli.interventions import check_applies, intervene
    from pecli.lm_scoring import batch_plan, check_causal, plan, prepare, score
    from pecli.loading import load_model, peek

    grid = conditions(pe, masks, semantics, protocol)
    if bootstrap < 0:
        raise ConfigError(f"--bootstrap must be 0 (no intervals) or more (got {bootstrap})")
    if padding_side not in ("left", "right"):
        raise ConfigError(f"padding side must be left or right (got {padding_side!r})")
    ref = None if loaded is not None else peek(model)  # family checks before data and weights load
    if ref is not None and not ref.spec.causal:
        check_causal(ref)
    for p in dict.fromkeys(g[0] for g in grid) if ref is not None else ():
        check_applies(ref, p)
    data = load_data(dataset, split, data_dir_=data_dir, limit=limit, seed=seed, text_field=text_field)
    loaded = loaded or load_model(model, device=device, dtype=dtype, seed=seed,
                                  device_map=device_map, max_memory=max_memory)
    check_causal(loaded)
    for p in dict.fromkeys(g[0] for g in grid):
        check_applies(loaded, p)
    bos = None
    if add_start_token:
        bos = loaded.tokenizer.bos_token_id
        if bos is None:
            raise DataError(f"{loaded.name}'s tokenizer has no start token; run with --no-start-token")
    texts = data.texts()
    ids = encode(loaded.tokenizer, texts, max_length=10**12, add_special_tokens=False).ids
    prepared = prepare(ids, loaded.max_positions, bos, long_text, stride)
    if prepared.tokens == 0:
        raise DataError("no text has a token to score; use --start-token or longer texts")

    common = {"experiment": "perplexity", "seed": seed, **row_provenance(), **loaded.provenance(),
              **data.provenance(), "text_field": data.text_field, "start_token": prepared.start_token,
              "long_text": prepared.long_text, "stride": prepared.stride,
              "truncated": prepared.truncated, "dropped_tokens": prepared.dropped_tokens,
              "tokens": prepared.tokens, "padding_side": padding_side}
    total = sum(prepared.tokens for _ in grid)
    checkpoint = _checkpoint(loaded, texts, prepared, padding_side, batch_size, seed)
    # computation -> per-text NLLs, shared by identical conditions; resumed from an interrupted run
    # launched on N processes: the main one reads (and so locks and saves) the checkpoint
    done: dict[tuple, list] = parallel.from_main(_resumed(checkpoint) if parallel.is_main() else {})
    rows, text_rows = [], []
    for pe_name, mask, sem, proto in grid:
        how = plan(mask, sem, proto)
        key = (pe_name, how.attention, how.passes)
        if key not in done:
            with intervene(loaded, pe_name, seed):
                done[key] = score(loaded, prepared, mask, sem, proto, batch_size=batch_size,
                                  side=padding_side,
                                  progress=(lambda n: progress(n, total)) if progress else None)[0]
                checkpoint.save(lambda: _saved(done), force=True)
        elif progress:
            progress(prepared.tokens, total)
        nlls = done[key]
        cond = {"intervention": pe_name, "mask": mask, "mask_semantics": sem, "protocol": proto,
                "computation": how.attention, "passes": how.passes,
                **batch_plan(loaded, prepared.windows, how.passes, batch_size),
                "texts_scored": sum(x.numel() > 0 for x in nlls)}
        study = _study_value(loaded.model_id, data.dataset, pe_name, mask, sem)
        ci = intervals(nlls, bootstrap, seed)
        for agg, value in aggregate(nlls).items():
            rows.append({**common, **cond, "metric": "perplexity", "aggregation": agg, "value": value,
                         "ci_low": ci[agg][0], "ci_high": ci[agg][1], "headline": agg == HEADLINE,
                         "study_value": study})
        for text_id, x in zip(data.text_ids(), nlls, strict=True):
            text_rows.append({**common, **cond, "metric": "text_perplexity", "text_id": text_id,
                              "text_tokens": x.numel(), "value": per_text_perplexity(x)})
    checkpoint.clear()
    notes = row_provenance()  # again: what happened while scoring (oom_splits: batches halved)
    return {"perplexity": validate(pd.DataFrame(rows).assign(**notes)),
            "texts": validate(pd.DataFrame(text_rows).assign(**notes))}


def intervals(nlls: list[torch.Tensor], n_boot: int, seed: int) -> dict[str, tuple[float, float]]:
    """95 % bootstrap interval of every aggregation (metrics.AGGREGATIONS) over texts.

    corpus and mean_per_token are ratios of per-text sums (NLL, exp(NLL)) to token counts;
    mean_ and median_per_text are statistics of the per-text perplexities (texts without a
    scored token left out, as in `aggregate`).
    """
    from pecli.intervals import mean_interval, ratio_interval, statistic_interval

    scored = [x.double() for x in nlls if x.numel()]
    counts = np.array([x.numel() for x in scored], np.float64)
    nll_sums = np.array([x.sum().item() for x in scored])
    exp_sums = np.array([x.exp().sum().item() for x in scored])
    per_text = np.exp(nll_sums / np.maximum(counts, 1))
    return {
        "corpus": ratio_interval(nll_sums, counts, n_boot=n_boot, seed=seed, transform=np.exp),
        "mean_per_text": mean_interval(per_text, n_boot=n_boot, seed=seed),
        "median_per_text": statistic_interval(per_text, np.median, n_boot=n_boot, seed=seed),
        "mean_per_token": ratio_interval(exp_sums, counts, n_boot=n_boot, seed=seed),
    }


def _study_value(model_id: str, dataset: str, pe: str, mask: str, semantics: str) -> float:
    """The study's number for this condition when the model and data are the study's, else NaN."""
    if model_id != STUDY_MODEL or dataset != STUDY_DATASET:
        return float("nan")
    if mask != "default" and semantics != "legacy":  # the study ran transformers 4.x
        return float("nan")
    return STUDY_VALUES.get((pe, mask), float("nan"))


# --- resuming: each finished computation is saved (pecli.io.Checkpoint) -------------------


def _checkpoint(loaded, texts, prepared, padding_side, batch_size, seed):
    from pecli.io import Checkpoint

    return Checkpoint("perplexity", {
        "version": 1, **loaded.provenance(), "start_token": prepared.start_token,
        "long_text": prepared.long_text, "stride": prepared.stride, "padding_side": padding_side,
        "batch_size": batch_size, "seed": seed}, texts)


def _saved(done: dict) -> dict:
    """NLLs per computation as flat arrays + per-text lengths, keys as JSON strings."""
    out = {"keys": np.array([json.dumps(list(k)) for k in done])}
    for j, nlls in enumerate(done.values()):
        out[f"nll{j}"] = torch.cat(nlls).cpu().numpy() if nlls else np.zeros(0)
        out[f"len{j}"] = np.array([x.numel() for x in nlls], dtype=np.int64)
    return out


def _resumed(checkpoint) -> dict:
    saved = checkpoint.load()
    if saved is None:
        return {}
    done = {}
    for j, key in enumerate(saved["keys"]):
        flat, lengths = torch.from_numpy(saved[f"nll{j}"]), saved[f"len{j}"].tolist()
        done[tuple(json.loads(str(key)))] = list(torch.split(flat, lengths))
    return done


EXPERIMENTS.add("perplexity", Experiment(
    name="perplexity",
    version=3,  # 2: per-text rows carry text_id; 3: ci_low/ci_high on every aggregation, study_value
    run=run,
    figures=lazy("pecli.plots.perplexity:figures"),
    description="Perplexity under position interventions and graded attention masks (E2, E3), "
                "every aggregation, semantics and protocol named",
))
