"""Passkey retrieval by prompt length and depth (pecli.measures.passkey).

For every model and condition (the intact, unscaled model first; then every intervention
crossed with every --rope-scaling), `trials` seeded draws at every (length, depth) are read
back by greedy decoding: each trial its own key, depth (within 0.05 of the cell's), filler
sentence order and filler offset, so trials of a cell are independent draws that share only
the template (and the Wilson interval over them means what it says). The draws are the same
under every condition, so conditions differ only in the model. Prompts longer than a model can take
(learned positions past their rows, a template longer than the length asked) give
"not applicable" rows, never a clamped number.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pandas as pd

from pecli.experiments import CONDITION, Headline, Units, check_before_loading, load, register
from pecli.experiments.options.passkey import PasskeyOptions
from pecli.runs import parallel
from pecli.runs.errors import ConfigError
from pecli.runs.provenance import row_provenance
from pecli.runs.tables import validate

TEMPLATE = "mohtashami-jaggi-2023 (as YaRN's passkey evaluation)"


def conditions(o: PasskeyOptions) -> list:
    """The run's conditions (pecli.positions.conditions.grid): the intact, unscaled model
    first, then every intervention crossed with every rope scaling."""
    from pecli.positions.conditions import grid

    return grid(o)


def run(options: PasskeyOptions, progress: Callable[[int, int], None] | None = None,
        loaded=None) -> dict[str, pd.DataFrame]:
    """`passkey` (accuracy with a 95 % Wilson interval per model, condition, length and depth,
    and per length over all depths) and `passkey_trials` (every trial: k, depth, length, the
    prompt's tokens, the decoded text, whether it was right). `loaded` replaces loading the
    one model (tests, benchmarks); `progress(advance, total)` counts trials."""
    from pecli.models.loading import load_tokenizer
    from pecli.models.sources import peek

    o = options
    grid = conditions(o)
    for name in o.model if loaded is None else ():
        check_before_loading(name, grid, causal=True)
        ref = peek(name)  # what the config and the tokenizer alone decide, before any weights
        refuse_what_cannot_fit(name, load_tokenizer(name), o, ref.table_rows() if ref else None)
    if not o.independent and o.trials > 1:
        warnings.warn("the trials of a cell share their filler and depth (--draws fixed): accuracy "
                      "without intervals; --draws independent gives each trial its own draw",
                      stacklevel=2)
    from pecli.measures.passkey import accuracy

    trials, summary = [], []
    for name in o.model:
        model = loaded or load(name, o)
        got = _trials_for(model, grid, o, progress)
        trials += got
        summary += accuracy(got, independent=o.independent)
        del model
    extra = row_provenance()
    return {"passkey": validate(pd.DataFrame(summary).assign(**extra)),
            "passkey_trials": validate(pd.DataFrame(trials).assign(**extra))}


def _trials_for(loaded, grid, o: PasskeyOptions, progress) -> list[dict]:
    from pecli.measures.passkey import NEW_TOKENS, answer, decode, draws, fit, keys
    from pecli.positions.conditions import check_all

    check_all(grid, loaded, causal=True)
    # a length that no condition can take is decided before any prompt is built
    past = {n: all(how.reason(loaded, n + NEW_TOKENS, "the prompt and its answer") for how in grid)
            for n in o.lengths}
    # every trial its own draw: key, depth jitter, filler order and offset (measures.passkey.draws)
    refuse_what_cannot_fit(loaded.name, loaded.tokenizer, o, loaded.max_positions if any(past.values())
                           else None, {n for n, p in past.items() if p})  # names only loading knew
    cells = {(n, d): [] if past[n] else [fit(loaded.tokenizer, x.k, n, x.depth, x.filler, x.offset)
                                         for x in draws(o.seed, n, d, o.trials, o.independent)]
             for n in o.lengths for d in o.depths}
    total = len(grid) * sum(len(ts) for ts in cells.values())
    tick = (lambda k: progress(k, total)) if progress else None
    common = {"experiment": "passkey", "seed": o.seed, **loaded.provenance(), "dataset": "passkey",
              "split": "synthetic", "template": TEMPLATE, "draws": o.draws, "max_new_tokens": NEW_TOKENS,
              "decoding": "greedy, KV cache; correct when the first integer equals the key",
              "context": loaded.max_positions}
    checkpoint = _checkpoint(loaded, o, cells)
    done = parallel.from_main(checkpoint.load_outputs() if parallel.is_main() else {})
    rows = []
    for how in grid:
        columns = how.columns(loaded)  # every kind's, the mask's included (its default here)
        with how.applied(loaded, o.seed):
            for (length, depth), fitted in cells.items():
                why = how.reason(loaded, length + NEW_TOKENS, "the prompt and its answer")
                if why is None and any(t is None for t in fitted):
                    why = f"not applicable: the template alone is longer than {length} tokens"
                base = {**common, **columns, "length": length, "depth": depth}
                if why is not None:
                    rows += [{**base, "trial": j, "k": k, "tokens": 0, "output": "", "answer": None,
                              "metric": "correct", "value": float("nan"), "rows": 1, "note": why}
                             for j, k in enumerate(keys(o.seed, length, depth, o.trials))]
                    if tick:
                        tick(len(fitted))
                    continue
                key = (*how.computes, length, depth)
                if key in done:  # decoded before an interruption (or the same computation named otherwise)
                    if tick:
                        tick(len(fitted))
                else:
                    done[key] = decode(loaded, fitted, o.batch_size, progress=tick)
                    checkpoint.save_outputs(done)
                outputs = done[key]
                for j, (t, text) in enumerate(zip(fitted, outputs, strict=True)):
                    got = answer(text)
                    rows.append({**base, "trial": j, "k": t.k, "depth_drawn": t.depth,
                                 "filler_offset": t.offset, "tokens": len(t.ids), "output": text,
                                 "answer": got, "metric": "correct", "value": float(got == t.k),
                                 "rows": 1, "note": ""})
    checkpoint.clear()
    return rows


def _checkpoint(loaded, o: PasskeyOptions, cells: dict):
    """Each finished (computation, length, depth)'s outputs for this model and these prompts
    (the checkpoint's texts), saved as each cell finishes: an interrupted run decodes only the
    cells it had not (a 12,288-token cell takes minutes on a CPU)."""
    from pecli.runs.io import Checkpoint

    key = {"version": 1, **loaded.provenance(), "seed": o.seed, "batch_size": o.batch_size}
    return Checkpoint("passkey", key, [f"{n}|{d}|{t.text}" for (n, d), fitted in cells.items()
                                       for t in fitted if t is not None])


def refuse_what_cannot_fit(name: str, tokenizer, o: PasskeyOptions, rows: int | None,
                           past=frozenset()) -> None:
    """A run none of whose cells can be scored, refused in one line naming the lengths that
    work: each length shorter than its template with its key (per `tokenizer`; None: not known
    yet), or past `rows` positions with the answer, or in `past` (no condition can take it)."""
    from pecli.measures.passkey import NEW_TOKENS, cell_fits, shortest

    last = None if rows is None else rows - NEW_TOKENS
    if not all(n in past or (last is not None and n > last) or (tokenizer is not None and not any(
            cell_fits(tokenizer, o.seed, n, d, o.trials, o.independent) for d in o.depths))
            for n in o.lengths):
        return
    first = None if tokenizer is None else shortest(tokenizer, o.seed, o.depths, o.trials, o.independent)
    lengths = f"--lengths {','.join(map(str, o.lengths))}: no passkey trial fits {name}"
    if first is not None and last is not None and first > last:
        raise ConfigError(f"{lengths}: its template with a key takes {first} tokens and the answer "
                          f"{NEW_TOKENS}, more than its {rows} positions")
    why = [f"the template with its key takes {first} tokens" if first is not None else "",
           f"its {rows} positions hold the answer's {NEW_TOKENS} after at most {last}" if rows else ""]
    fits = (f"from {first} to {last}" if first is not None and last is not None else
            f"of at least {first}" if first is not None else f"of at most {last}")
    raise ConfigError(f"{lengths} ({'; '.join(w for w in why if w)}); give lengths {fits} tokens")


def _slot(row) -> str:
    """A headline's slot: `4,096 tokens, depth 0.5` (or `depth all`)."""
    depth = row["depth"]
    return f"{int(row['length']):,} tokens, depth {'all' if str(depth) == 'all' else f'{float(depth):g}'}"


register("passkey", 1, run, PasskeyOptions, "pecli.plots.passkey:figures",
         "Passkey retrieval by prompt length and depth (greedy decoding; rope scaling, "
         "interventions)",
         headlines=(Headline("accuracy", "passkey retrieval accuracy", {}, CONDITION,
                             name="passkey_accuracy", slot=_slot,
                             interval="95 % Wilson score interval over trials",
                             axis="share of trials with the key retrieved",
                             units=Units("_trials", cell=("length", "depth"),
                                         pair=("length", "depth", "trial"), draw=("k",))),))
