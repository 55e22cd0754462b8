"""Experiments `pe-sinusoidal` and `pe-probe`: what position encodings are and what they encode.

    pe-sinusoidal  the Vaswani encoding, its rotation property and dot products (no model)
    pe-probe       Wang & Chen's analyses of a model's position-embedding matrix, with the
                   sinusoidal matrix of the same shape as reference, and a per-layer probe
                   of position in hidden states with and without the model's positions
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pecli.experiments import Headline, check_before_loading, data_of, load, preflight, register
from pecli.experiments.options.pe import ProbeOptions, SinusoidOptions
from pecli.measures import pe_analysis as pa
from pecli.measures.pe_analysis import collect_hidden, hidden_states, model_texts  # noqa: F401
from pecli.measures.pe_analysis import embedding_rows as _embedding_rows
from pecli.runs import parallel
from pecli.runs.names import INTACT
from pecli.runs.tables import frame as _frame
from pecli.runs.tables import validate

SIMILARITY_POINTS = 64  # the similarity heatmap samples this many positions per axis
ROTARY_NOTE = ("positions in attention (rotary, alibi or relative bias): no embedding table, so "
               "no matrix analyses; hidden-state probe only ('zero' = identity rotation, slopes "
               "0 or bias removed)")


# --- pe-sinusoidal -------------------------------------------------------------------


def run_sinusoidal(options: SinusoidOptions) -> dict[str, pd.DataFrame]:
    """The encoding, the rotation error per offset, the dot products, and a summary.

    Tables: `encoding` (pos, dim_index, pair, component), `rotation` (offset k from
    -(positions-1) to positions-1), `dot` (every pair p, q), `summary` (the worst case of
    each check). `seed` changes nothing (the encoding is deterministic); it is recorded.
    """
    positions, dim, base, seed = options.positions, options.dim, options.base, options.seed
    name = "pe-sinusoidal"
    shared = dict(positions=positions, dim=dim, base=base)
    pe = pa.sinusoidal(positions, dim, base)  # [P, dim]
    pos, dim_index = (a.ravel() for a in np.indices((positions, dim)))  # row p * dim + j: PE(p)_j
    encoding = pd.DataFrame({"metric": "pe", "value": pe.ravel(), "pos": pos, "dim_index": dim_index,
                             "pair": dim_index // 2, "component": np.where(dim_index % 2, "cos", "sin")})
    offsets = list(range(-(positions - 1), positions))
    errors = pa.rotation_errors(positions, dim, base, offsets)
    rotation = [{"metric": "rotation_max_abs_error", "value": e, "offset": k}
                for k, e in zip(offsets, errors, strict=True)]
    dots = pa.dot_products(positions, dim, base)
    p, q = (a.ravel() for a in np.indices((positions, positions)))  # row p * P + q
    dot = pd.DataFrame({"metric": "dot_product", "value": dots.gram.ravel(), "p": p, "q": q,
                        "offset": p - q})
    summary = [
        {"metric": "rotation_max_abs_error", "value": float(errors.max()),
         "aggregation": "max over offsets and positions"},
        {"metric": "dot_offset_spread", "value": dots.offset_spread,
         "aggregation": "max over offsets of max-min of PE(p).PE(q) with p-q fixed"},
        {"metric": "dot_symmetry_error", "value": dots.symmetry_error,
         "aggregation": "max over k of |f(k) - f(-k)|"},
        {"metric": "dot_closed_form_error", "value": dots.closed_form_error,
         "aggregation": "max over p, q of |PE(p).PE(q) - sum_i cos((p-q) w_i)|"},
        {"metric": "dot_at_offset_0", "value": dots.by_offset[0], "aggregation": "= dim/2"},
        {"metric": "dot_min", "value": float(dots.gram.min()), "aggregation": "min over pairs"},
    ]
    return {table: validate(_frame(rows, name, seed, **shared), model_rows=False)
            for table, rows in [("encoding", encoding), ("rotation", rotation), ("dot", dot),
                                ("summary", summary)]}


register("pe-sinusoidal", 1, run_sinusoidal, SinusoidOptions, "pecli.plots.pe:sinusoidal_figures",
         "Sinusoidal position encoding: heatmap, clock, rotation property, dot product vs offset")


# --- pe-probe --------------------------------------------------------------------------


def matrix_analyses(matrix: np.ndarray, folds: int, pairs: int, seed: int,
                    bootstrap: int = 1000) -> tuple[list[dict], list[dict]]:
    """Wang & Chen on one matrix [N, d]: (metric rows, sampled similarity-matrix rows)."""
    from pecli.measures.intervals import accuracy_interval

    reg = pa.position_regression(matrix, folds=folds, seed=seed, regressor="linear")
    correct = pa.order_correct(matrix, folds=folds, pairs=pairs, seed=seed)
    low, high = accuracy_interval(correct, n_boot=bootstrap, seed=seed)
    metrics = [
        {"metric": "regression_mae", "value": reg.mae, "evaluation":
         f"linear regression row -> index, {folds}-fold CV over a seeded shuffle, MAE of round(prediction)"},
        {"metric": "regression_chance_mae", "value": reg.chance_mae, "evaluation":
         "predict the training folds' mean index (same folds)"},
        {"metric": "order_accuracy", "value": float(correct.mean()), "ci_low": low, "ci_high": high,
         "test_pairs": len(correct), "evaluation":
         f"logistic regression on [x_i, x_j] -> i < j, {pairs} training pairs per fold, "
         f"{folds} folds of held-out positions (interval: Wilson's over test pairs)"},
        {"metric": "order_chance_accuracy", "value": 0.5, "evaluation": "guessing"},
    ]
    idx = pa.grid(len(matrix), SIMILARITY_POINTS)
    sim = pa.cosine_matrix(matrix[idx])  # [g, g]
    similarity = [{"metric": "cosine_similarity", "value": sim[a, b], "pos_p": int(p), "pos_q": int(q)}
                  for a, p in enumerate(idx) for b, q in enumerate(idx)]
    return metrics, similarity


def hidden_probe(loaded, ids: list[list[int]], intervention, folds: int, seed: int,
                 batch_size: int | None = None, progress=None) -> list[dict]:
    """Per-layer probe of position from hidden states under `intervention` (rows of a table)."""
    states, positions, texts = hidden_states(loaded, ids, intervention, seed, batch_size)
    if not parallel.is_main():  # launched on N processes: the main one fits the probes
        return []
    rows = []
    for layer, x in enumerate(states):
        # Tokens of one text stay in one fold: held-out texts, not held-out tokens.
        reg = pa.position_regression(x, positions, folds=folds, seed=seed, groups=texts,
                                     regressor="ridge")
        common = {"layer": layer, "intervention": str(intervention), "tokens": len(positions),
                  "max_position": int(positions.max()), "regressor": "standardise + RidgeLOO (alpha by leave-one-text-out)",
                  "folds": folds, "evaluation": f"{folds}-fold CV over texts, MAE of round(prediction)"}
        rows += [{"metric": "probe_mae", "value": reg.mae, **common},
                 {"metric": "probe_chance_mae", "value": reg.chance_mae, **common}]
        if progress:
            progress()
    return rows


def run_probe(options: ProbeOptions, announce=None) -> dict[str, pd.DataFrame]:
    """Position-embedding matrix analyses and the hidden-state probe for each model.

    Tables: `matrix` (regression MAE, order accuracy and their chance levels, for the
    model's matrix and the sinusoidal reference of the same shape; learned models only),
    `similarity` (cosine similarity of rows at <= 64 evenly spaced positions),
    `hidden` (probe MAE per layer and intervention; rotary models carry a note).

    Options (ProbeOptions): models; limit texts of `dataset` (seeded subset); max_length
    tokens kept per text; folds: k of every cross-validation; pairs: training pairs per
    fold (order task); intervention: conditions of the hidden-state probe (`learned` = the
    model as is). announce: optional callable(str) for progress lines (the CLI passes one).

    Launched on N processes (`pecli.runs.parallel`), each extracts the hidden states of its shard
    of the batches; the main process fits every probe and alone gets tables ({} elsewhere).
    """
    from pecli.positions.conditions import check_all, labelled, plan

    o = options
    preflight(o.models)
    conditions = [plan(intervention=c) for c in o.intervention]  # as asked, in order
    for name in o.models:  # an intervention that does not fit a later model fails now, not after the first
        check_before_loading(name, conditions)
    say = announce or (lambda _msg: None)
    data = data_of(o)
    texts = data.texts()
    matrix_rows, similarity_rows, hidden_rows = [], [], []
    for name in o.models:
        loaded = load(name, o)
        check_all(conditions, loaded)
        model_cols = {**loaded.provenance(), "intervention": INTACT}
        if loaded.spec.position == "learned" and parallel.is_main():  # no batches to share out
            own = _embedding_rows(loaded)  # [N, d]
            for kind, matrix in [("learned", own), ("sinusoidal", pa.sinusoid_like(*own.shape))]:
                say(f"{name}: Wang & Chen analyses of the {kind} matrix {own.shape[0]} x {own.shape[1]}")
                metrics, sim = matrix_analyses(matrix, o.folds, o.pairs, o.seed)
                cols = {**model_cols, "matrix": kind, "positions": own.shape[0], "dim": own.shape[1],
                        "folds": o.folds,
                        "note": "" if kind == "learned" else "reference: sinusoids of the same shape"}
                matrix_rows += [{**r, **cols} for r in metrics]
                similarity_rows += [{**r, **cols} for r in sim]
        else:
            say(f"{name}: {ROTARY_NOTE}")
        enc, data_cols = model_texts(loaded, data, texts, o.max_length)
        data_cols["note"] = "" if loaded.spec.position == "learned" else ROTARY_NOTE
        for iv in o.intervention:
            say(f"{name}: hidden-state probe, intervention {iv}, {enc.tokens} tokens")
            rows = hidden_probe(loaded, enc.ids, iv, o.folds, o.seed, o.batch_size)
            hidden_rows += [{**data_cols, **r} for r in rows]
        del loaded
    if not parallel.is_main():
        return {}
    tables = {}
    if matrix_rows:
        tables["matrix"] = validate(_frame(matrix_rows, "pe-probe", o.seed), model_rows=False)
        tables["similarity"] = validate(_frame(similarity_rows, "pe-probe", o.seed), model_rows=False)
    tables["hidden"] = validate(_frame(hidden_rows, "pe-probe", o.seed))
    return {name: labelled(df) for name, df in tables.items()}


# version 2: order_accuracy with ci_low/ci_high; 3: column `protocol` (a CV scheme) -> `evaluation`
register("pe-probe", 3, run_probe, ProbeOptions, "pecli.plots.pe:probe_figures",
         "Wang & Chen analyses of position-embedding matrices (sinusoidal reference) and a "
         "per-layer hidden-state probe of position with and without the model's positions",
         headlines=(Headline("order_accuracy", "which-comes-first accuracy of position rows", {},
                             ("matrix",), reference=((0.5, "chance"),),
                             interval="95 % Wilson score interval over test pairs"),))
