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

from pecli.errors import ConfigError, DataError
from pecli.experiments import EXPERIMENTS, Experiment
from pecli.metrics import aggregate, per_text_perplexity
from pecli.plots.perplexity import figures
from pecli.provenance import row_provenance
from pecli.tables import validate

HEADLINE = "corpus"  # the aggregation summaries lead with; every other is a row too


def as_list(value, what: str) -> list[str]:
    """A name, a list of names, or "a,b" -> a list of distinct names, in order."""
    items = [value] if isinstance(value, str) else list(value or [])
    items = [s.strip() for item in items for s in str(item).split(",") if s.strip()]
    if not items:
        raise ConfigError(f"no {what} given")
    return list(dict.fromkeys(items))  # keep order, drop repeats


def conditions(pe, masks, semantics, protocol) -> list[tuple[str, str, str, str]]:
    """Every (intervention, mask, semantics, protocol) asked for, names checked."""
    from pecli.lm_scoring import plan

    grid = [(p, m, s, pr) for p in as_list(pe, "intervention") for m in as_list(masks, "mask")
            for s in as_list(semantics, "mask semantics") for pr in as_list(protocol, "protocol")]
    for _, m, s, pr in grid:
        plan(m, s, pr)  # unknown names fail here, before a model loads
    return grid


def run(model: str = "random:gpt2", pe="learned", masks="default", semantics="legacy",
        protocol="relative", dataset: str = "truthfulqa", split: str | None = None,
        text_field: str | None = None, limit: int | None = None, seed: int = 0,
        device: str = "auto", dtype: str = "float32", data_dir: str | None = None,
        batch_size: int | None = None, add_start_token: bool = True, long_text: str = "truncate",
        stride: int | None = None, padding_side: str = "right", loaded=None,
        progress: Callable[[int, int], None] | None = None) -> dict[str, pd.DataFrame]:
    """Perplexity tables: `perplexity` (one row per condition x aggregation) and `texts`
    (one row per condition x text: its scored tokens and perplexity).

    pe, masks, semantics and protocol each take a name or a list (or "a,b"); the run covers
    their product. `loaded` (a LoadedModel) skips loading `model`, for tests and benchmarks;
    `progress(advance, total)` is told of every scored batch.
    """
    from pecli.batching import encode
    from pecli.data import load_data
    from pecli.interventions import check_applies, intervene
    from pecli.lm_scoring import check_causal, plan, prepare, score
    from pecli.loading import load_model

    grid = conditions(pe, masks, semantics, protocol)
    if padding_side not in ("left", "right"):
        raise ConfigError(f"padding side must be left or right (got {padding_side!r})")
    data = load_data(dataset, split, data_dir_=data_dir, limit=limit, seed=seed, text_field=text_field)
    loaded = loaded or load_model(model, device=device, dtype=dtype, seed=seed)
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
    done: dict[tuple, list] = _resumed(checkpoint)
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
                "texts_scored": sum(x.numel() > 0 for x in nlls)}
        for agg, value in aggregate(nlls).items():
            rows.append({**common, **cond, "metric": "perplexity", "aggregation": agg, "value": value,
                         "headline": agg == HEADLINE})
        for i, x in enumerate(nlls):
            text_rows.append({**common, **cond, "metric": "text_perplexity", "text_index": i,
                              "text_tokens": x.numel(), "value": per_text_perplexity(x)})
    checkpoint.clear()
    return {"perplexity": validate(pd.DataFrame(rows)), "texts": validate(pd.DataFrame(text_rows))}


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
    version=1,
    run=run,
    figures=figures,
    description="Perplexity under position interventions and graded attention masks (E2, E3), "
                "every aggregation, semantics and protocol named",
))
