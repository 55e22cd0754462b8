"""How far does each position scheme reach? Loss by position and by window length.

The dataset's documents, in source order, joined by the tokenizer's EOS, make one token
stream; for every model, window length and condition (the intact model first; then every
intervention x mask x semantics, each crossed with every --rope-scaling), the stream's
windows (pecli.measures.length_scoring) are scored and summarised by position bucket, with
a bootstrap over windows. A length a model cannot take (learned positions past their
rows) gets one "not applicable" row per condition, never a clamped number.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import pandas as pd
import torch

from pecli.experiments import (
    CONDITION,
    Headline,
    check_before_loading,
    data_of,
    length_slot,
    load,
    register,
)
from pecli.experiments.options.length import LengthOptions
from pecli.measures.length_scoring import stream_of
from pecli.measures.lm_scoring import resumed_nlls, start_token  # NLLs per key as an .npz, and back
from pecli.measures.lm_scoring import saved_nlls as _saved
from pecli.runs.errors import DataError
from pecli.runs.provenance import row_provenance
from pecli.runs.tables import validate


def conditions(options: LengthOptions) -> list:
    """The run's conditions (pecli.positions.conditions.grid): the intact, unscaled model
    first, then every intervention x mask x semantics, each crossed with every rope scaling."""
    from pecli.positions.conditions import grid

    return grid(options)


def run(options: LengthOptions, progress: Callable[[int, int], None] | None = None,
        loaded=None, per_window: bool = False) -> dict[str, pd.DataFrame]:
    """The `length` table: one row per (model, condition, length, position bucket), the
    all-positions row last in each group. `loaded` (a LoadedModel) replaces loading the one
    model (tests, benchmarks); `progress(advance, total)` counts scored tokens; `per_window`
    keeps each row's per-window sums (length_scoring.PER_WINDOW, never written)."""
    from pecli.measures.length_scoring import PER_WINDOW

    o = options
    grid = conditions(o)
    for name in o.model if loaded is None else ():
        check_before_loading(name, grid, causal=True)
    data = data_of(o, at_most=True)
    data.frame = data.frame.sort_values("text_id", kind="stable").reset_index(drop=True)  # source order
    rows = []
    for name in o.model:
        model = loaded or load(name, o)
        rows += _rows_for(model, data, grid, o, progress)
        del model
    table = pd.DataFrame(rows).assign(**row_provenance())
    return {"length": validate(table if per_window else table.drop(columns=list(PER_WINDOW), errors="ignore"))}


def _rows_for(loaded, data, grid, o: LengthOptions, progress) -> list[dict]:
    from pecli.measures.length_scoring import cut
    from pecli.positions.conditions import check_all
    from pecli.positions.extension import extended, not_applicable

    check_all(grid, loaded, causal=True)
    bos = start_token(loaded, o.start_token, "drop --start-token")
    stream = stream_of(loaded.tokenizer, data.texts())
    cuts = {n: cut(stream, n, o.windows, o.stride, bos) for n in o.lengths}
    if not any(len(c) for c in cuts.values()):
        raise DataError(f"the stream has {len(stream)} tokens, fewer than the shortest window "
                        f"({min(o.lengths)}); use more documents (--limit) or shorter --lengths")
    total = sum(c.tokens for n, c in cuts.items() if not not_applicable(loaded, n)) * len(grid)
    tick = (lambda k: progress(k, total)) if progress else None
    common = _common(loaded, data, o, stream, cuts[o.lengths[0]].stride, bos)
    checkpoint = _checkpoint(loaded, o, stream)
    # (condition, length) -> per-window NLLs; resumed from an interrupted run (the main process reads)
    done: dict[tuple, list] = resumed_nlls(checkpoint)
    rows = []
    for length, windows in cuts.items():
        skip = not_applicable(loaded, length)
        with extended(loaded, length) if skip is None else nullcontext():
            for how in grid:
                intact = _key(grid[0], length) if grid[0].label == "intact" else None
                rows += _condition_rows(loaded, how, length, windows, stream, o, common, done, intact,
                                        checkpoint, tick)
    checkpoint.clear()
    return rows


def _common(loaded, data, o: LengthOptions, stream: list[int], stride, bos) -> dict:
    """The columns every row of this model on this stream shares."""
    from pecli.positions.extension import table_kind

    return {"experiment": "length", "seed": o.seed, **loaded.provenance(), **data.provenance(),
            "text_field": data.text_field, "stream_tokens": len(stream),
            "position_table": table_kind(loaded), "context": loaded.max_positions,
            "context_kind": "training" if hasattr(loaded.model.config, "pecli_position") else "original",
            "window_protocol": o.windows, "stride": stride,
            "start_token": "bos" if bos is not None else "none"}


def _key(how, length: int) -> tuple:
    """What a condition computes at a window length (identical conditions are scored once)."""
    return (*how.computes, length)


def _condition_rows(loaded, how, length: int, windows, stream: list[int], o: LengthOptions,
                    common: dict, done: dict, intact: tuple | None, checkpoint, tick) -> list[dict]:
    """One condition's rows at one window length: its buckets, with the paired difference from
    the intact model's (`intact`: its key in `done`), or one row saying why not."""
    from pecli.measures.length_scoring import score_band, summarise
    from pecli.measures.lm_scoring import score_windows
    from pecli.positions.rope_scaling import provenance as rope_columns

    why = how.reason(loaded, length, band=o.windows == "band")
    cond = {"condition": how.label, **how.names, "computation": how.computation,
            "length": length, "dropped_tokens": windows.dropped_tokens}
    if why is not None or not len(windows):
        note = why or f"no window: the stream has {len(stream)} tokens"
        return [{**common, **cond, **rope_columns(str(how.rope or "none"), how.rope and how.rope.parameters),
                 "window_start": 0, "window_end": length, "all_positions": True,
                 "metric": "perplexity", "value": float("nan"), "tokens": 0, "windows": 0, "note": note}]
    key = _key(how, length)
    passes = "band pass" if o.windows == "band" else "one pass per window"
    with torch.inference_mode(), how.applied(loaded, o.seed):
        if key in done:
            if tick:
                tick(windows.tokens)
        elif o.windows == "band":
            done[key] = score_band(loaded, stream, windows, progress=tick)
        else:
            done[key] = score_windows(loaded, windows.windows(stream), batch_size=o.batch_size,
                                      progress=tick)
        columns = how.columns(loaded)
    columns = {k: columns[k] for k in ("rope_scaling", "rope_parameters")}
    checkpoint.save(lambda: _saved(done), force=True)
    return [{**common, **cond, **columns, "passes": passes, **row, "metric": "perplexity",
             "value": row["perplexity"], "note": ""}
            for row in summarise(done[key], windows, o.buckets, o.bootstrap, o.seed,
                                 None if key == intact else done.get(intact))]


def _checkpoint(loaded, o: LengthOptions, stream: list[int]):
    """Finished (condition, length) NLLs of this model on this stream, saved as they finish."""
    from pecli.runs.io import Checkpoint

    key = {"version": 1, **loaded.provenance(), "windows": o.windows, "stride": o.stride,
           "start_token": o.start_token, "seed": o.seed}
    return Checkpoint("length", key, [" ".join(map(str, stream))])


register("length", 1, run, LengthOptions, "pecli.plots.length:figures",
         "Loss by position and window length over a token stream (windows, rope "
         "scaling, learned tables past their rows)",
         headlines=(Headline("perplexity", "perplexity by position in the window", {},
                             ("pe", *CONDITION), name="length_perplexity",
                             slot=length_slot, interval="95 % percentile bootstrap over windows",
                             axis="perplexity"),))
