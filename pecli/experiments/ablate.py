"""E1 / E2's cosine: how much do a model's features change under a position intervention?

For every real token, the cosine similarity between its hidden state with the model's own
positions (`intact`, the baseline) and under each intervention, at every layer. The texts
are tokenised once; both passes run on the same length-bucketed batches.

Tables (long, one measurement per row, provenance on each):
- `ablate`: per intervention x layer x token set (special tokens included / excluded):
  cosine mean, std, median, tokens; at the final layer also the z-score and percentile
  against the random baseline; the count of truncated texts.
- `ablate_positions`: mean cosine at each position index (final layer, all real tokens).
- `ablate_random`: the random baseline (cosine of random pairs of standard-normal vectors
  of the model's width): mean, std, pairs, and a histogram.
- `ablate_probe` (probe=True): held-out accuracy of a logistic-regression probe on
  mean-pooled final features, with the model's positions and with each intervention
  (pecli.measures.probes).

Is a cosine high? Besides random Gaussian vectors (the study's baseline), two in-model
baselines per layer (pecli.measures.baselines), with the model's own positions (intervention `intact`) on the same
texts: `token_pair_cosine` (two different real tokens of different texts: the model's
anisotropy floor, Ethayarajh 2019) and `self_similarity` (the same token id in two different
texts). Their pairs are drawn, seeded, over all evaluated texts, and the states come from
the own-position pass that the cosines need anyway (no extra forward). `between_baselines`
places each intervention's mean cosine on that scale: 0 = as alike as two different tokens,
1 = as alike as the same token in another context.
Every mean, the baselines and between_baselines included, carries a 95 % bootstrap interval
over texts (`ci_low`, `ci_high`; pecli.measures.intervals): a pair of tokens counts as often
as both its texts are drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pandas as pd

from pecli.experiments import Headline, check_before_loading, data_of, lazy, load, register
from pecli.experiments.options.ablate import AblateOptions
from pecli.measures.baselines import (
    BASELINE_PAIRS,
    baseline_rows,
    kept_positions,
    pair_cosines,
    sample_baseline_pairs,
)
from pecli.measures.probes import check_probe_labels, probe_accuracy
from pecli.positions.conditions import labelled
from pecli.runs import parallel
from pecli.runs.names import INTACT, Choice

NAME = "ablate"
VERSION = 3  # 3: in-model baselines over all texts, text-resampled intervals (2: 32 texts, pairs)
HIST_BINS = 60


@dataclass
class Measured:
    """Per-token results of one run (all arrays over the n real tokens, in batch order)."""

    layers: int  # hidden-state layers measured (embeddings = 0, ..., final)
    width: int
    tokens: int
    truncated: int
    max_length: int
    text: np.ndarray  # [n] index of each token's text in the input list
    position: np.ndarray  # [n] position index of each token in its text (0-based)
    special: np.ndarray  # [n] bool: a special token ([CLS], [SEP], <|endoftext|>, ...)
    cosine: dict[str, np.ndarray] = field(default_factory=dict)  # intervention -> [l, n]
    pooled: dict[str, np.ndarray] = field(default_factory=dict)  # condition -> [texts, d]
    baselines: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    # ^ token_pair | self_similarity -> (cosines [l, pairs], texts of each pair [pairs, 2])
    plan: dict = field(default_factory=dict)  # the batch plan (pecli.runs.batching.plan_summary)


def measure(loaded, texts: list[str], interventions: Sequence[str | Choice], *, seed: int = 0,
            batch_size: int | None = None, layers: bool = True, pooled: bool = False,
            progress: bool = False, checkpoint_every: float | None = 60.0,
            baseline_pairs: int = BASELINE_PAIRS) -> Measured:
    """Hidden states with `intact` (the model unchanged) and each intervention on the same batches; cosine per token.

    Args:
        loaded: a LoadedModel.
        texts: the texts, tokenised once here (truncated to the model's positions).
        interventions: parsed names (options' Choices) or names (`zero`, `shift:3`, ...);
            checked before any forward pass.
        batch_size: sequences per pass (length-sorted); None = `tight_batches` under
            `default_token_budget(device, CPU_HIDDEN_STATE_BUDGET)` padded tokens.
        layers: every layer's hidden state (else the final one only).
        pooled: also keep mean-pooled final features per text (for the probe).
        baseline_pairs: pairs per in-model baseline, drawn over all texts (0: none); their
            own-position states are kept from the batches that hold them.
        checkpoint_every: save the batches done so far at most this often (seconds), so
            that an interrupted run resumes where it stopped, at any process count
            (`pecli.runs.io.Checkpoint`, keyed by the whole run's batch plan); None: never.

    Batches run in `pecli.runs.loop.run_batches`; a batch halved after running out of device
    memory keeps its padded width (only the row count changes: numbers equal to float noise).
    """
    import torch

    from pecli.positions.conditions import plan
    from pecli.runs import batching
    from pecli.runs.loop import run_batches

    applied = {str(c): plan(intervention=c).applier(loaded, seed) for c in interventions}  # errors first
    names = list(applied)  # names as the tables and the checkpoint key write them
    enc = _quiet_encode(batching.encode, loaded, texts)
    lengths = [len(x) for x in enc.ids]
    if min(lengths) == 0:
        raise_empty(texts, lengths)
    plan = (batching.length_batches(lengths, 0, max_batch=batch_size) if batch_size else tight_batches(
        lengths, batching.default_token_budget(loaded.device, batching.CPU_HIDDEN_STATE_BUDGET)))
    special_ids = np.array(sorted(set(loaded.tokenizer.all_special_ids)), dtype=np.int64)
    pairs = sample_baseline_pairs(enc.ids, set(special_ids.tolist()), baseline_pairs, seed)
    kept = kept_positions(pairs, len(lengths))  # text -> sorted positions whose states we keep
    compute = _batch_arrays(loaded, enc.ids, special_ids, kept, list(applied.values()), layers, pooled)

    key = {"interventions": names, "seed": seed, "layers": layers, "pooled": pooled,
           "baseline_pairs": baseline_pairs}
    saved = (None if checkpoint_every is None
             else partial(_saved, loaded, texts, key, checkpoint_every, lengths, kept))
    with torch.inference_mode():
        batches, done = run_batches(plan, lengths, compute, join=_joined, checkpoint=saved,
                                    progress="ablate" if progress else None)
    parts = _Parts(batches, lengths, kept)
    parts.done = done
    states = [(t, p) for b in batches for t in b for p in kept.get(t, ())]
    baselines = pair_cosines(pairs, states, parts.joined("states"))
    plan = batching.plan_summary(batching.padded_tokens(batches, lengths), batch_size)
    return _measured(parts, enc, loaded.max_positions, names, pooled, baselines, plan)


def _measured(parts: _Parts, enc, max_length: int, names: list[str], pooled: bool,
              baselines: dict, plan: dict) -> Measured:
    """The Measured of a run from its finished batches (`names`: the interventions)."""
    shape = parts.done[0]["shape"]
    back = np.argsort(parts.joined("order"))  # pooled rows back to text order
    return Measured(
        layers=int(shape[0]), width=int(shape[1]), tokens=enc.tokens, truncated=enc.truncated,
        max_length=max_length, text=parts.joined("text"), position=parts.joined("position"),
        special=parts.joined("special"),
        cosine={name: parts.joined(f"cos{k}") for k, name in enumerate(names)},
        pooled={name: parts.joined(f"pool{k}")[back]
                for k, name in enumerate([INTACT, *names] if pooled else [])},
        baselines=baselines, plan=plan)


def _batch_arrays(loaded, ids: list[list[int]], special_ids: np.ndarray, kept: dict[int, list[int]],
                  applied: list, layers: bool, pooled: bool):
    """measure()'s `compute(rows, width)`: a batch's per-token (and per-text) arrays, rows padded
    to `width`: cosines per intervention, the kept states of the in-model baselines, pooled
    features."""
    import torch

    from pecli.measures.metrics import cosine_by_layer
    from pecli.runs.batching import pad

    base = loaded.model.base_model  # hidden states only: no LM head over the vocabulary

    def hidden(ids, mask):
        out = base(input_ids=ids, attention_mask=mask, output_hidden_states=layers)
        return out.hidden_states if layers else (out.last_hidden_state,)  # l x [b, t, d]

    def one(rows: list[int], width: int) -> dict[str, np.ndarray]:
        seqs = [ids[i] for i in rows]
        x, mask = pad(seqs, loaded.tokenizer.pad_token_id, loaded.device, "right", width)  # [b, t]
        n = [len(s) for s in seqs]
        out = {"position": np.concatenate([np.arange(k, dtype=np.int64) for k in n]),
               "special": np.isin(np.concatenate(seqs), special_ids),
               "text": np.repeat(np.array(rows, dtype=np.int64), n),
               "order": np.array(rows, dtype=np.int64)}
        ref = hidden(x, mask)  # l x [b, t, d]
        out["shape"] = np.array([len(ref), ref[-1].shape[-1]])
        at = [(row, p) for row, t in enumerate(rows) for p in kept.get(t, ())]
        rows_at = torch.tensor([r for r, _ in at], dtype=torch.long)
        pos_at = torch.tensor([p for _, p in at], dtype=torch.long)
        out["states"] = torch.stack([h[rows_at, pos_at] for h in ref]).float().cpu().numpy()  # [l, k, d]
        if pooled:
            out["pool0"] = _mean_pool(ref[-1], mask)
        for k, apply in enumerate(applied):
            with apply():
                h = hidden(x, mask)  # l x [b, t, d]
            out[f"cos{k}"] = cosine_by_layer(ref, h, mask).cpu().numpy()  # [l, n_b]
            if pooled:
                out[f"pool{k + 1}"] = _mean_pool(h[-1], mask)
        return out

    return one


def _axis(name: str) -> int:
    """The axis a batch's array grows along: tokens for cosines [l, n] and kept states
    [l, k, d], else the first."""
    return 1 if name.startswith(("cos", "states")) else 0


def _joined(pieces: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The halves of a batch split after running out of memory, joined back into the batch."""
    if len(pieces) == 1:
        return pieces[0]
    return {name: pieces[0][name] if name == "shape"
            else np.concatenate([p[name] for p in pieces], axis=_axis(name)) for name in pieces[0]}


class _Parts:
    """Finished batches by their index in the whole run's plan (the same at any process count):
    what a checkpoint saves and a run at another process count resumes from."""

    def __init__(self, batches: list[list[int]], lengths: list[int], kept: dict[int, list[int]]):
        self.rows = [len(b) for b in batches]
        self.tokens = [sum(lengths[i] for i in b) for b in batches]
        # states kept for the in-model baselines, per batch (`kept`: text -> positions)
        self.kept = [sum(len(kept.get(t, ())) for t in b) for b in batches]
        self.done: dict[int, dict[str, np.ndarray]] = {}  # batch -> name -> array

    def _sizes(self, name: str, batches: list[int]) -> list[int]:
        per = (self.rows if name == "order" or name.startswith("pool")
               else self.kept if name == "states" else self.tokens)
        return [per[b] for b in batches]

    def joined(self, name: str, batches: list[int] | None = None) -> np.ndarray:
        """`name`'s pieces of `batches` (default: all, in plan order) concatenated."""
        batches = range(len(self.rows)) if batches is None else batches
        return np.concatenate([self.done[b][name] for b in batches], axis=_axis(name))

    def arrays(self) -> dict[str, np.ndarray]:
        done = sorted(self.done)
        out = {name: self.joined(name, done) for name in self.done[done[0]] if name != "shape"}
        return {**out, "batches": np.array(done, dtype=np.int64), "shape": self.done[done[0]]["shape"]}

    def restore(self, saved: dict | None) -> None:
        if not saved:
            return
        done = saved["batches"].tolist()
        self.done = {b: {"shape": saved["shape"]} for b in done}
        for name, arr in saved.items():
            if name in ("batches", "shape"):
                continue
            cuts = np.cumsum(self._sizes(name, done))[:-1]
            for b, piece in zip(done, np.split(arr, cuts, axis=_axis(name)), strict=True):
                self.done[b][name] = piece


class _Saved:
    """measure()'s checkpoint for `pecli.runs.loop.run_batches`: the finished batches' arrays,
    each name joined over batches (`_Parts`), in a `pecli.runs.io.Checkpoint`."""

    def __init__(self, checkpoint, parts: _Parts):
        self.checkpoint, self.parts = checkpoint, parts

    def load(self) -> dict[int, dict[str, np.ndarray]] | None:
        self.parts.restore(self.checkpoint.load())
        return self.parts.done or None

    def save(self, done: dict[int, dict[str, np.ndarray]]) -> None:
        self.parts.done = done
        self.checkpoint.save(self.parts.arrays)  # builds the arrays only when a save is due

    def clear(self) -> None:
        self.checkpoint.clear()


def _saved(loaded, texts: list[str], key: dict, every: float, lengths: list[int],
           kept: dict[int, list[int]], batches: list[list[int]]) -> _Saved:
    """Where this exact measurement's partial results live (see `pecli.runs.io.Checkpoint`): keyed
    by the whole run's batch plan, never by a process's share of it."""
    from pecli.runs.io import Checkpoint

    checkpoint = Checkpoint("ablate", {"version": VERSION, **loaded.provenance(), **key,
                                       "batches": batches, "saved": "by plan batch"},
                            texts, every)
    return _Saved(checkpoint, _Parts(batches, lengths, kept))


def tight_batches(lengths: list[int], token_budget: int, **kwargs) -> list[list[int]]:
    """measure()'s batch plan: `pecli.runs.batching.tight_batches` (kept here for its callers)."""
    from pecli.runs.batching import tight_batches as tight

    return tight(lengths, token_budget, **kwargs)


def _quiet_encode(encode, loaded, texts):
    """encode() without the tokenizer's "longer than the maximum" warning: we truncate and count."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return encode(loaded.tokenizer, texts, loaded.max_positions)
    finally:
        hf_logging.set_verbosity(level)


def raise_empty(texts, lengths):
    from pecli.runs.errors import DataError

    i = lengths.index(0)
    raise DataError(f"text {i} ({texts[i][:40]!r}) has no tokens; drop empty rows from the data")


def _mean_pool(h, mask):
    """Mean of real-token features: h[b, t, d], mask[b, t] -> [b, d] (numpy, float64)."""
    m = mask.to(h.dtype)[..., None]  # [b, t, 1]
    return ((h * m).sum(1) / m.sum(1)).double().cpu().numpy()


# --- tables ------------------------------------------------------------------------


def tables(m: Measured, provenance: dict, *, seed: int, baseline_pairs: int,
           probe_rows: list[dict] | None = None, bootstrap: int = 1000) -> dict[str, pd.DataFrame]:
    """Tidy tables from a Measured run; `provenance` (model, data) and versions go on every row.

    `baseline_pairs`: random Gaussian pairs of the random baseline; `bootstrap`: resamples of
    the intervals (0: none, NaN bounds).
    """
    from pecli.measures.metrics import random_pair_cosines
    from pecli.runs.provenance import row_provenance
    from pecli.runs.tables import validate

    common = {"experiment": NAME, "experiment_version": VERSION, "seed": seed,
              "truncated_texts": m.truncated, "max_length": m.max_length, **m.plan, **row_provenance(),
              **provenance}
    final = m.layers - 1
    rand = random_pair_cosines(m.width, baseline_pairs, seed)
    texts = int(m.text.max()) + 1 if m.text.size else 0
    rows, per_text = _cosine_rows(m, rand, texts, seed, bootstrap)
    rows += baseline_rows(m.baselines, rows, per_text, texts, final, seed, bootstrap)
    out = {NAME: validate(pd.DataFrame([{**common, **r} for r in rows])),
           f"{NAME}_positions": validate(pd.DataFrame(_position_rows(m, common))),
           f"{NAME}_random": validate(pd.DataFrame(_random_rows(m, rand, common)))}
    if probe_rows:
        out[f"{NAME}_probe"] = validate(pd.DataFrame(
            [{**common, "layer": final, "tokens": m.tokens, **r} for r in probe_rows]))
    return {name: labelled(df) for name, df in out.items()}


def _cosine_rows(m: Measured, rand: np.ndarray, texts: int, seed: int, bootstrap: int
                 ) -> tuple[list[dict], dict]:
    """The `ablate` table's rows of the cosines, and each (intervention, layer, token set)'s
    per-text (sums, counts) that the intervals resample."""
    from pecli.measures.intervals import by_text, ratio_interval
    from pecli.measures.metrics import percentile_of, summarize, z_score

    final, pairs = m.layers - 1, len(rand)
    rows, per_text = [], {}
    for name, cos in m.cosine.items():
        for layer in range(m.layers):
            for subset, keep in (("included", np.ones_like(m.special)), ("excluded", ~m.special)):
                s = summarize(cos[layer][keep])
                base = {"intervention": name, "layer": layer, "final_layer": layer == final,
                        "special_tokens": subset, "tokens": s["count"],
                        "aggregation": "over all real tokens of all texts"}
                per_text[name, layer, subset] = by_text(cos[layer][keep], m.text[keep], texts)
                low, high = ratio_interval(*per_text[name, layer, subset], n_boot=bootstrap,
                                           seed=seed)
                rows.append({**base, "metric": "cosine_mean", "value": s["mean"],
                             "ci_low": low, "ci_high": high})
                for stat in ("std", "median"):
                    rows.append({**base, "metric": f"cosine_{stat}", "value": s[stat]})
                rows.append({**base, "metric": "token_count", "value": s["count"]})
                if layer == final:
                    rows.append({**base, "metric": "z_score", "value": z_score(s["mean"], rand),
                                 "aggregation": f"mean cosine vs {pairs} random pairs"})
                    rows.append({**base, "metric": "percentile",
                                 "value": percentile_of(s["mean"], rand),
                                 "aggregation": f"mean cosine vs {pairs} random pairs"})
        rows.append({"intervention": name, "layer": final, "final_layer": True,
                     "special_tokens": "included", "tokens": m.tokens,
                     "metric": "truncated_texts", "value": m.truncated,
                     "aggregation": f"texts longer than {m.max_length} tokens, cut"})
    return rows, per_text


def _position_rows(m: Measured, common: dict) -> list[dict]:
    """`ablate_positions`: the final layer's mean cosine at each position index."""
    from pecli.measures.metrics import mean_by_index

    rows = []
    for name, cos in m.cosine.items():
        keys, means, counts = mean_by_index(cos[m.layers - 1], m.position)
        for k, v, c in zip(keys, means, counts, strict=True):
            rows.append({**common, "intervention": name, "layer": m.layers - 1, "position": int(k),
                         "special_tokens": "included", "metric": "cosine_mean",
                         "value": float(v), "tokens": int(c),
                         "aggregation": "over real tokens at this position index"})
    return rows


def _random_rows(m: Measured, rand: np.ndarray, common: dict) -> list[dict]:
    """`ablate_random`: the random baseline's mean, std, 1/sqrt(dim) and histogram."""
    from pecli.measures.metrics import histogram, summarize

    counts, edges = histogram(rand, HIST_BINS)
    # no model condition: the baseline is the same for every one, named as such
    rnd = {**common, "condition": "random vectors", "intervention": "none", "dim": m.width,
           "pairs": len(rand), "tokens": m.tokens,
           "aggregation": "random pairs of standard-normal vectors"}
    rows = [{**rnd, "metric": "random_cosine_mean", "value": summarize(rand)["mean"]},
            {**rnd, "metric": "random_cosine_std", "value": float(np.std(rand, ddof=1))},
            {**rnd, "metric": "random_cosine_1_over_sqrt_dim", "value": 1 / np.sqrt(m.width)}]
    return rows + [{**rnd, "metric": "random_cosine_hist_count", "value": int(c),
                    "bin_left": float(lo), "bin_right": float(hi)}
                   for c, lo, hi in zip(counts, edges[:-1], edges[1:], strict=True)]


def run(options: AblateOptions, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Load the model and data, measure, and return the tables (see the module docstring)."""
    from pecli.positions.conditions import check_all, grid

    o = options
    conditions = grid(o)  # the intact model (the baseline), then each intervention
    check_before_loading(o.model, conditions)
    data = data_of(o, at_most=o.limit_at_most)
    labels = check_probe_labels(data.labels()) if o.probe else None
    loaded = load(o.model, o)
    check_all(conditions, loaded)
    m = measure(loaded, data.texts(), o.intervention, seed=o.seed, batch_size=o.batch_size,
                layers=o.layers, pooled=o.probe, progress=progress)
    if not parallel.is_main():
        return {}  # launched on N processes: the main one makes and writes the tables
    probe_rows = probe_accuracy(m.pooled, labels, o.seed, o.bootstrap) if o.probe else None
    prov = {**loaded.provenance(), **data.provenance(),
            "text_field": o.text_field or data.text_field}
    return tables(m, prov, seed=o.seed, baseline_pairs=o.baseline_pairs, probe_rows=probe_rows,
                  bootstrap=o.bootstrap)


figures = lazy("pecli.plots.ablate:ablate_figures")


register(NAME, VERSION, run, AblateOptions, figures,
         "cosine of features with vs without (or with altered) position information, per layer "
         "and position, against a random baseline; optional linear probe (study E1, E2)",
         headlines=(
             Headline("cosine_mean", "mean cosine of each token with vs without the intervention "
                      "(final layer)", {"final_layer": True, "special_tokens": "included"}),
             Headline("token_pair_cosine_mean", "cosine of two different tokens (final layer, own "
                      "positions)", {"final_layer": True}),
             Headline("self_similarity_mean", "cosine of one token in two texts (final layer, own "
                      "positions)", {"final_layer": True}),
             Headline("between_baselines", "mean cosine on the in-model scale (0 = as unlike as "
                      "another token, 1 = as unlike as the same token elsewhere)",
                      {"final_layer": True, "special_tokens": "included"},
                      reference=((0.0, "0: as unlike as another token"),
                                 (1.0, "1: as unlike as the same token in another text"))),
             Headline("probe_accuracy", "sentiment probe accuracy (held-out texts)",
                      interval="95 % Wilson score interval over held-out texts")))
