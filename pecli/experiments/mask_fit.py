"""`pecli mask fit`: the best mask of a small form as a stand-in for positions (the study's
open question 2, "design a more useful mask").

The model is frozen and its positions removed (`zero`); a mask of one form
(pecli.runs.names.MASK_FORMS) is fitted on IMDB train texts (pecli.measures.mask_fitting) and
written as a file (OUT/mask/mask.json) that every masked command takes back as `--mask FILE`.
It is then judged on held-out texts only (IMDB test, TruthfulQA) against the intact model,
positions removed with the default mask, the study's linear mask under each semantics, and
ALiBi's fixed slopes (log-bias), all by the relative protocol (one pass per text): corpus
perplexity with a bootstrap interval over texts, and the share of the gap closed in log
perplexity with a paired bootstrap interval.

Tables: `mask_fit` (one row per evaluation set x condition), `mask_fit_curve` (the fitted
log-weight by distance and head beside ALiBi's and the linear mask's), `mask_fit_history`
(the training loss per step).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pecli.experiments import Headline, check_before_loading, load, register
from pecli.experiments.options.mask_fit import MaskFitOptions
from pecli.runs.errors import DataError
from pecli.runs.names import INTACT
from pecli.runs.provenance import row_provenance
from pecli.runs.tables import validate

FILE_NAME = "mask.json"
COMPARED_SEMANTICS = ("legacy", "boolean", "log-bias", "scale")  # the study's linear mask under each


def conditions(intervention, fitted: str) -> list[tuple[str, object]]:
    """(label, Plan) of every condition judged, intact first; `fitted` is the mask file's name."""
    from pecli.measures.lm_scoring import plan

    zero = str(intervention)
    out = [("intact", plan("default", "legacy", "relative", INTACT)),
           ("no positions", plan("default", "legacy", "relative", zero))]
    out += [(f"linear ({s})", plan("linear", s, "relative", zero)) for s in COMPARED_SEMANTICS]
    out += [("alibi (log-bias)", plan("alibi", "log-bias", "relative", zero)),
            ("fitted (log-bias)", plan(fitted, "log-bias", "relative", zero))]
    return out


def run(options: MaskFitOptions, announce: Callable[[str], None] | None = None,
        loaded=None) -> dict[str, pd.DataFrame]:
    from pecli.data.datasets import load_data
    from pecli.measures.mask_fitting import fit, sequences
    from pecli.positions.conditions import check_all

    o = options
    say = announce or (lambda msg: None)
    judged = [how for _, how in conditions(o.intervention, "linear")]  # a mask on the intervention
    if loaded is None:
        check_before_loading(o.model, judged, causal=True)
    train = load_data("imdb", "train", data_dir_=o.data_dir, limit=o.train_limit, seed=o.seed)
    held_out = [load_data(dataset, split or None, data_dir_=o.data_dir, limit=o.limit, seed=o.seed)
                for dataset, _, split in (item.partition(":") for item in o.eval_data)]
    loaded = loaded or load(o.model, o)
    check_all(judged, loaded, causal=True)
    bos = loaded.tokenizer.bos_token_id
    max_length = min(o.max_length, loaded.max_positions)
    seqs = sequences(loaded.tokenizer, train.texts(), max_length, bos)
    if not seqs:
        raise DataError("no training text has 2 tokens or more")
    say(f"fitting a {o.form} mask on {len(seqs)} IMDB train texts ({o.steps} steps)")
    mask, history = fit(loaded, o.form.name, seqs, steps=o.steps, lr=o.lr, batch=o.batch,
                        seed=o.seed, intervention=str(o.intervention),
                        progress=lambda step, loss: say(f"step {step}/{o.steps}: loss {loss:.4f}")
                        if step % 10 == 0 else None)
    fitted_on = {"model": loaded.model_id, "model_revision": loaded.revision,
                 "intervention": str(o.intervention), **train.provenance(), "steps": o.steps,
                 "lr": o.lr, "batch": o.batch, "seed": o.seed, "max_length": max_length,
                 "train_texts": len(seqs), "final_train_loss": history[-1],
                 "git_commit": row_provenance()["git_commit"]}
    mask = type(mask)(mask.form, mask.values, mask.heads, mask.edges, fitted_on)
    folder = Path(o.save_dir or "mask")
    folder.mkdir(parents=True, exist_ok=True)
    name = mask.save(folder / FILE_NAME)
    common = {"experiment": "mask-fit", "seed": o.seed, **row_provenance(), **loaded.provenance(),
              "form": o.form.name, "fitted_parameters": mask.parameters, "mask_file": name,
              "max_length": max_length, "train_rows": len(seqs), "train_data_revision":
              train.revision}
    rows = []
    for data in held_out:
        say(f"judging on {data.dataset}/{data.split} ({len(data.texts())} held-out texts)")
        rows += evaluate(loaded, data, conditions(o.intervention, name), max_length, bos,
                         mask.parameters, o.bootstrap, o.seed, common)
    curve = curve_rows(mask, max_length, common)
    hist = pd.DataFrame({"step": np.arange(1, len(history) + 1), "metric": "train_loss",
                         "value": history}).assign(**_short(common))
    return {"mask_fit": validate(pd.DataFrame(rows)),
            "mask_fit_curve": validate(curve, model_rows=False),
            "mask_fit_history": validate(hist, model_rows=False)}


def _short(common: dict) -> dict:
    """The columns of the curve and history rows: which fit, and the core provenance."""
    return {"experiment": "mask-fit", **row_provenance(),
            **{k: common[k] for k in ("model", "model_revision", "form", "mask_file", "seed",
                                      "fitted_parameters")}}


def evaluate(loaded, data, plans, max_length: int, bos, parameters: int, n_boot: int, seed: int,
             common: dict) -> list[dict]:
    """Corpus perplexity of every condition on `data` (texts truncated to `max_length`), with
    its interval and the gap closed against (no positions, intact)."""
    from pecli.measures.intervals import perplexity_intervals as intervals
    from pecli.measures.lm_scoring import score, windows_for
    from pecli.measures.mask_fitting import gap_closed, gap_interval
    from pecli.runs.batching import encode

    ids = encode(loaded.tokenizer, data.texts(), max_length=10**12, add_special_tokens=False).ids
    prepared = windows_for(ids, max_length, bos, "truncate")
    nlls, done = {}, {}
    for label, how in plans:
        key = how.computes  # the same computation is scored once
        if key not in done:
            with how.applied(loaded, seed):
                done[key] = [x.double() for x in score(loaded, prepared, how)[0]]
        nlls[label] = done[key]
    kept = [i for i, x in enumerate(nlls["intact"]) if x.numel()]
    counts = np.array([nlls["intact"][i].numel() for i in kept], np.float64)
    sums = {label: np.array([x[i].sum().item() for i in kept]) for label, x in nlls.items()}
    nll = {label: s.sum() / counts.sum() for label, s in sums.items()}
    rows = []
    for label, how in plans:
        ci = intervals(nlls[label], n_boot, seed)["corpus"]
        gap = gap_closed(nll["no positions"], nll[label], nll["intact"])
        g_low, g_high = gap_interval({"zero": sums["no positions"], "intact": sums["intact"],
                                      label: sums[label]}, counts, label, n_boot, seed
                                     ) if np.isfinite(gap) else (np.nan, np.nan)  # no gap: undefined
        row = {**common, **data.provenance(), **how.names, "condition": label,
               "computation": how.computation,
               "parameters": parameters if label.startswith("fitted") else 0,
               "metric": "perplexity", "aggregation": "corpus",
               "value": float(np.exp(nll[label])), "ci_low": ci[0], "ci_high": ci[1],
               "gap_closed": gap, "gap_ci_low": g_low, "gap_ci_high": g_high,
               "texts": len(kept), "tokens": int(counts.sum()),
               "truncated": prepared.truncated, "start_token": prepared.start_token}
        rows.append(row)
        # the same number as its own row, so that a report or compare can pick it by metric
        rows.append({**row, "metric": "gap_closed", "aggregation": "log perplexity",
                     "value": gap, "ci_low": g_low, "ci_high": g_high})
    return rows


def curve_rows(mask, max_length: int, common: dict) -> pd.DataFrame:
    """log m by distance d = 0..max_length-1 and head: the fitted mask, ALiBi's fixed slopes and
    the study's linear mask (for the longest row, span max_length - 1), each 0 at d = 0 where
    the form allows (the fitted one shifted by its d = 0 value: under log-bias a shift is no
    change), with the distance of each to the fitted curve (RMSE over d and heads)."""
    from pecli.positions.masks import WEIGHTS, form_bias

    heads = mask.heads
    dist = torch.arange(max_length, dtype=torch.float32).view(1, 1, 1, -1)
    span = torch.full((1, 1, 1, 1), float(max_length - 1))
    fitted = form_bias(mask.form, mask.tensor(), dist, span, mask.edges)[0, :, 0]  # [rows, d]
    fitted = (fitted - fitted[:, :1]).expand(heads, -1)
    shapes = {"fitted": fitted,
              "alibi": torch.log(WEIGHTS["alibi"](dist, span, heads))[0, :, 0].expand(heads, -1),
              "linear": torch.log(WEIGHTS["linear"](dist, span, heads))[0, :, 0].expand(heads, -1)}
    rmse = {k: float((v - fitted).pow(2).mean().sqrt()) for k, v in shapes.items()}
    keep = _short(common)
    rows = [{**keep, "shape": k, "head": h, "distance": d, "metric": "log_weight",
             "value": float(v[h, d]), "rmse_to_fitted": rmse[k]}
            for k, v in shapes.items() for h in range(heads) for d in range(max_length)]
    return pd.DataFrame(rows)


register("mask-fit", 1, run, MaskFitOptions, "pecli.plots.mask_fit:figures",
         "A mask of a small form fitted to stand in for removed positions (frozen model, "
         "IMDB train), judged on held-out texts against intact, no positions, the study's "
         "linear mask and ALiBi", files="mask",
         headlines=(
             Headline("perplexity", "held-out corpus perplexity by mask (mask fit)", {}, ("condition",),
                      name="mask_fit_perplexity", slot=lambda r: f"{r['dataset']}/{r['split']}",
                      axis="perplexity"),
             Headline("gap_closed", "share of the gap closed, (zero - x) / (zero - intact) in log "
                      "perplexity", {}, ("condition",), name="mask_fit_gap_closed",
                      slot=lambda r: f"{r['dataset']}/{r['split']}",
                      reference=((0.0, "no positions"), (1.0, "intact")),
                      interval="95 % percentile bootstrap over texts, the three conditions' texts paired")))
