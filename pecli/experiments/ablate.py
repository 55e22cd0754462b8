"""E1 / E2's cosine: how much do a model's features change under a position intervention?

For every real token, the cosine similarity between its hidden state with the model's own
positions (`learned`, the baseline) and under each intervention, at every layer. The texts
are tokenised once; both passes run on the same length-bucketed batches.

Tables (long, one measurement per row, provenance on each):
- `ablate`: per intervention x layer x token set (special tokens included / excluded):
  cosine mean, std, median, tokens; at the final layer also the z-score and percentile
  against the random baseline; the count of truncated texts.
- `ablate_positions`: mean cosine at each position index (final layer, all real tokens).
- `ablate_random`: the random baseline (cosine of random pairs of standard-normal vectors
  of the model's width): mean, std, pairs, and a histogram.
- `ablate_probe` (probe=True): held-out accuracy of a logistic-regression probe on
  mean-pooled final features, with the model's positions and with each intervention.

Is a cosine high? Besides random Gaussian vectors (the study's baseline), two in-model
baselines per layer, with the model's own positions (intervention `learned`) on the same
texts: `token_pair_cosine` (two different real tokens of different texts: the model's
anisotropy floor, Ethayarajh 2019) and `self_similarity` (the same token id in two different
texts). `between_baselines` places each intervention's mean cosine on that scale: 0 = as
alike as two different tokens, 1 = as alike as the same token in another context.
Means carry 95 % bootstrap intervals over texts (`ci_low`, `ci_high`; pecli.measures.intervals).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pecli.experiments import EXPERIMENTS, Experiment, check_before_loading, lazy, load
from pecli.runs import parallel
from pecli.runs.names import Choice
from pecli.runs.options import AblateOptions

NAME = "ablate"
VERSION = 2  # 2: in-model baselines (token_pair_cosine, self_similarity, between_baselines); ci_low/ci_high
BASELINE_TEXTS = 32  # the in-model baselines sample from this many of the texts (one more pass)
BASELINE_PAIRS = 1000  # pairs per in-model baseline
HIST_BINS = 60
PROBE_TEST_FRACTION = 0.3


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
    plan: dict = field(default_factory=dict)  # the batch plan (pecli.runs.batching.plan_summary)


def measure(loaded, texts: list[str], interventions: Sequence[str | Choice], *, seed: int = 0,
            batch_size: int | None = None, layers: bool = True, pooled: bool = False,
            progress: bool = False, checkpoint_every: float | None = 60.0) -> Measured:
    """Hidden states with `learned` and each intervention on the same batches; cosine per token.

    Args:
        loaded: a LoadedModel.
        texts: the texts, tokenised once here (truncated to the model's positions).
        interventions: parsed names (options' Choices) or names (`zero`, `shift:3`, ...);
            checked before any forward pass.
        batch_size: sequences per pass (length-sorted); None = `tight_batches` under
            `default_token_budget(device, CPU_HIDDEN_STATE_BUDGET)` padded tokens.
        layers: every layer's hidden state (else the final one only).
        pooled: also keep mean-pooled final features per text (for the probe).
        checkpoint_every: save the batches done so far at most this often (seconds), so
            that an interrupted run resumes where it stopped, at any process count
            (`pecli.runs.io.Checkpoint`, keyed by the whole run's batch plan); None: never.

    A batch that runs out of device memory is halved and retried (`halving_on_oom`); the
    halves keep the batch's padded width, so only the matrix products' row count changes
    (numbers equal to float noise).
    """
    import torch

    from pecli.measures.metrics import cosine_by_layer
    from pecli.positions.interventions import prepare
    from pecli.runs.batching import (
        CPU_HIDDEN_STATE_BUDGET,
        default_token_budget,
        encode,
        halving_on_oom,
        length_batches,
        pad,
        padded_tokens,
        plan_summary,
    )

    applied = {str(c): prepare(loaded, c, seed) for c in interventions}  # errors first
    interventions = list(applied)  # names as the tables and the checkpoint key write them
    enc = _quiet_encode(encode, loaded, texts)
    lengths = [len(x) for x in enc.ids]
    if min(lengths) == 0:
        raise_empty(texts, lengths)
    batches = (length_batches(lengths, 0, max_batch=batch_size) if batch_size
               else tight_batches(lengths, default_token_budget(loaded.device, CPU_HIDDEN_STATE_BUDGET)))
    special_ids = np.array(sorted(set(loaded.tokenizer.all_special_ids)), dtype=np.int64)
    base = loaded.model.base_model  # hidden states only: no LM head over the vocabulary
    pad_id = loaded.tokenizer.pad_token_id

    def hidden(ids, mask):
        out = base(input_ids=ids, attention_mask=mask, output_hidden_states=layers)
        return out.hidden_states if layers else (out.last_hidden_state,)  # l x [b, t, d]

    def one(rows: list[int], width: int) -> dict[str, np.ndarray]:
        """A batch's per-token (and per-text) arrays; rows padded to `width`."""
        seqs = [enc.ids[i] for i in rows]
        ids, mask = pad(seqs, pad_id, loaded.device, "right", width)  # [b, t]
        n = [len(x) for x in seqs]
        out = {"position": np.concatenate([np.arange(k, dtype=np.int64) for k in n]),
               "special": np.isin(np.concatenate(seqs), special_ids),
               "text": np.repeat(np.array(rows, dtype=np.int64), n),
               "order": np.array(rows, dtype=np.int64)}
        ref = hidden(ids, mask)  # l x [b, t, d]
        out["shape"] = np.array([len(ref), ref[-1].shape[-1]])
        if pooled:
            out["pool0"] = _mean_pool(ref[-1], mask)
        for k, apply in enumerate(applied.values()):
            with apply():
                h = hidden(ids, mask)  # l x [b, t, d]
            out[f"cos{k}"] = cosine_by_layer(ref, h, mask).cpu().numpy()  # [l, n_b]
            if pooled:
                out[f"pool{k + 1}"] = _mean_pool(h[-1], mask)
        return out

    parts = _Parts(batches, lengths)
    checkpoint = None
    if checkpoint_every is not None and parallel.is_main():  # the main process alone saves
        checkpoint = _checkpoint(loaded, texts, interventions, seed, layers, pooled, batches,
                                 checkpoint_every)
    parts.restore(parallel.from_main(checkpoint.load() if checkpoint is not None else None))
    if parts.done and progress and parallel.is_main():
        print(f"resuming: {len(parts.done)} of {len(batches)} batches were done before",
              file=sys.stderr)
    todo = [b for b in range(len(batches)) if b not in parts.done]
    shares = [[todo[i] for i in s] for s in parallel.shards([batches[b] for b in todo], lengths)]
    mine = shares[parallel.rank()]
    from pecli.runs.provenance import RUN_NOTES

    splits_before = RUN_NOTES.get("oom_splits", 0)
    with _progress(progress and parallel.is_main(), len(batches), "ablate") as advance, \
            torch.inference_mode():
        for _ in parts.done:
            advance()
        for step in range(max(map(len, shares))):  # launched: every process takes part in each step
            new = {}
            if step < len(mine):
                rows = batches[mine[step]]
                width = max(lengths[i] for i in rows)
                new[mine[step]] = _joined(halving_on_oom(lambda r, w=width: one(r, w), rows))
            for b, arrays in parallel.gather(new).items():  # every process's batch of this step
                parts.done[b] = arrays
                advance()
            if checkpoint is not None and len(parts.done) < len(batches):
                checkpoint.save(parts.arrays)  # builds the arrays only when a save is due
    splits = sum(parallel.gather({parallel.rank(): RUN_NOTES.get("oom_splits", 0) - splits_before}
                                 ).values())
    if splits:  # every process's splits, in the main process's rows
        RUN_NOTES["oom_splits"] = splits_before + splits
    if checkpoint is not None:
        checkpoint.clear()
    names = list(applied)
    shape = parts.done[0]["shape"]
    back = np.argsort(parts.joined("order"))  # pooled rows back to text order
    return Measured(
        layers=int(shape[0]), width=int(shape[1]), tokens=enc.tokens, truncated=enc.truncated,
        max_length=loaded.max_positions, text=parts.joined("text"),
        position=parts.joined("position"), special=parts.joined("special"),
        cosine={name: parts.joined(f"cos{k}") for k, name in enumerate(names)},
        pooled={name: parts.joined(f"pool{k}")[back]
                for k, name in enumerate(["learned", *names] if pooled else [])},
        plan=plan_summary(padded_tokens(batches, lengths), batch_size),
    )


def _axis(name: str) -> int:
    """The axis a batch's array grows along: tokens for cosines [l, n], else the first."""
    return 1 if name.startswith("cos") else 0


def _joined(pieces: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The halves of a batch split after running out of memory, joined back into the batch."""
    if len(pieces) == 1:
        return pieces[0]
    return {name: pieces[0][name] if name == "shape"
            else np.concatenate([p[name] for p in pieces], axis=_axis(name)) for name in pieces[0]}


class _Parts:
    """Finished batches by their index in the whole run's plan (the same at any process count):
    what a checkpoint saves and a run at another process count resumes from."""

    def __init__(self, batches: list[list[int]], lengths: list[int]):
        self.rows = [len(b) for b in batches]
        self.tokens = [sum(lengths[i] for i in b) for b in batches]
        self.done: dict[int, dict[str, np.ndarray]] = {}  # batch -> name -> array

    def _sizes(self, name: str, batches: list[int]) -> list[int]:
        per = self.rows if name == "order" or name.startswith("pool") else self.tokens
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


def _checkpoint(loaded, texts, interventions, seed, layers, pooled, batches, every):
    """Where this exact measurement's partial results live (see `pecli.runs.io.Checkpoint`): keyed
    by the whole run's batch plan, never by a process's share of it."""
    from pecli.runs.io import Checkpoint

    return Checkpoint("ablate", {"version": VERSION, **loaded.provenance(),
                                 "interventions": interventions, "seed": seed, "layers": layers,
                                 "pooled": pooled, "batches": batches, "saved": "by plan batch"},
                      texts, every)


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


class _progress:
    """A rich progress bar over batches, or nothing."""

    def __init__(self, enabled: bool, total: int, what: str):
        self.enabled, self.total, self.what = enabled, total, what

    def __enter__(self):
        if not self.enabled:
            return lambda: None
        from pecli.runs.progress import progress_bar

        # a terminal gets a bar; piped or captured output, a line every ~10 % or 30 s
        self.bar = progress_bar(transient=True)
        self.bar.__enter__()
        task = self.bar.add_task(f"{self.what} ({self.total} batches)", total=self.total)
        return lambda: self.bar.advance(task)

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.__exit__(*exc)
        return False


# --- in-model baselines: how alike are two different tokens, or one token elsewhere? -----


def sample_baseline_pairs(ids: list[list[int]], special: set[int], pairs: int = BASELINE_PAIRS,
                          seed: int = 0, max_texts: int = BASELINE_TEXTS) -> dict[str, np.ndarray]:
    """Seeded token pairs for the two in-model baselines, as [pairs, 2, 2] (text, position).

    Both sample from at most `max_texts` texts (a seeded subset) and skip special tokens.
    token_pair: a real token drawn uniformly, then a token of another text with another id.
    self_similarity: a token drawn uniformly among those whose id occurs in another text,
    then an occurrence of that id in another text. Token-weighted, like the intervention
    cosines (frequent tokens count more). Fewer self-similarity pairs (even 0) when few ids
    repeat across texts.
    """
    rng = np.random.default_rng([seed, 12])
    chosen = np.sort(rng.permutation(len(ids))[:max_texts])
    real = [(t, p, i) for t in chosen for p, i in enumerate(ids[t]) if i not in special]
    text, pos, tok = np.array(real, np.int64).reshape(-1, 3).T  # [n] each
    out = {"token_pair": np.zeros((0, 2, 2), np.int64), "self_similarity": np.zeros((0, 2, 2), np.int64)}
    if len(np.unique(text)) < 2:
        return out
    found = []
    for _ in range(100):  # rejection: other text and other id (nearly always in one round)
        a, b = rng.integers(0, len(tok), size=(2, 4 * pairs))
        ok = (text[a] != text[b]) & (tok[a] != tok[b])
        found += list(zip(a[ok], b[ok], strict=True))
        if len(found) >= pairs:
            break
    if found:  # none only when every token of every text is the same id
        a, b = np.array(found[:pairs]).T
        out["token_pair"] = np.stack([np.stack([text[a], pos[a]], 1),
                                      np.stack([text[b], pos[b]], 1)], 1)
    texts_of = {}  # token id -> distinct texts it occurs in
    for i, t in zip(tok.tolist(), text.tolist(), strict=True):
        texts_of.setdefault(i, set()).add(t)
    eligible = np.flatnonzero([len(texts_of[i]) > 1 for i in tok.tolist()])
    if eligible.size:
        where = {}  # token id -> indices of its occurrences
        for j in eligible.tolist():
            where.setdefault(int(tok[j]), []).append(j)
        rows = []
        for a in rng.choice(eligible, size=pairs):
            others = [j for j in where[int(tok[a])] if text[j] != text[a]]
            b = others[rng.integers(len(others))]
            rows.append(((text[a], pos[a]), (text[b], pos[b])))
        out["self_similarity"] = np.array(rows, np.int64)
    return out


def baseline_cosines(loaded, ids: list[list[int]], pairs: dict[str, np.ndarray],
                     layers: bool = True) -> dict[str, np.ndarray]:
    """Cosine at every layer between the hidden states (the model's own positions) of each
    pair's two tokens: {baseline: [l, pairs]}. Runs the texts the pairs touch, one batch
    of up to 16 at a time, keeping only the sampled tokens' states."""
    import torch

    from pecli.runs.batching import pad

    wanted = np.concatenate([p.reshape(-1, 2) for p in pairs.values()])
    needed = sorted({int(t) for t in wanted[:, 0]}, key=lambda t: len(ids[t]))  # little padding
    states = {}  # (text, position) -> [l, d] float64
    base = loaded.model.base_model
    with torch.inference_mode():
        for start in range(0, len(needed), 16):
            batch = needed[start:start + 16]
            tensors, mask = pad([ids[t] for t in batch], loaded.tokenizer.pad_token_id,
                                loaded.device, "right")
            out = base(input_ids=tensors, attention_mask=mask, output_hidden_states=layers)
            hidden = out.hidden_states if layers else (out.last_hidden_state,)  # l x [b, t, d]
            for row, t in enumerate(batch):
                positions = sorted(set(wanted[wanted[:, 0] == t, 1].tolist()))
                h = torch.stack([x[row, positions] for x in hidden]).double().cpu()  # [l, k, d]
                for k, p in enumerate(positions):
                    states[(t, p)] = h[:, k]
    result = {}
    for name, pair in pairs.items():
        if len(pair) == 0:
            continue
        a = torch.stack([states[tuple(x)] for x in pair[:, 0].tolist()], 1)  # [l, pairs, d]
        b = torch.stack([states[tuple(x)] for x in pair[:, 1].tolist()], 1)
        result[name] = torch.nn.functional.cosine_similarity(a, b, dim=-1).numpy()  # [l, pairs]
    return result


# --- tables ------------------------------------------------------------------------


def _accuracy(correct: np.ndarray, bootstrap: int, seed: int) -> dict:
    """Accuracy of held-out texts with its interval (test texts resampled)."""
    from pecli.measures.intervals import mean_interval

    low, high = mean_interval(correct.astype(np.float64), n_boot=bootstrap, seed=seed)
    return {"value": float(correct.mean()), "ci_low": low, "ci_high": high}


def probe_accuracy(features: dict[str, np.ndarray], labels, seed: int = 0,
                   bootstrap: int = 1000) -> list[dict]:
    """Held-out accuracy of logistic regression on each condition's features, one seeded,
    stratified split shared by all; also the `learned` probe applied to each condition."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from pecli.runs.errors import DataError

    y = np.asarray(labels)
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2 or counts.min() < 4:
        raise DataError("--probe needs at least 4 rows of each of 2 labels; raise --limit "
                        "or use a labelled dataset (imdb)")
    idx = np.arange(len(y))
    train, test = train_test_split(idx, test_size=PROBE_TEST_FRACTION, random_state=seed,
                                   stratify=y)
    fitted = {}
    rows = []
    for cond, x in features.items():
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
        clf.fit(x[train], y[train])
        fitted[cond] = clf
        rows.append({"intervention": cond, "probe_trained_on": cond, "metric": "probe_accuracy",
                     **_accuracy(clf.predict(x[test]) == y[test], bootstrap, seed)})
    for cond, x in features.items():
        if cond != "learned":
            rows.append({"intervention": cond, "probe_trained_on": "learned",
                         "metric": "probe_accuracy_transfer",
                         **_accuracy(fitted["learned"].predict(x[test]) == y[test], bootstrap, seed)})
    for r in rows:
        r.update(train_rows=len(train), test_rows=len(test), probe="logistic_regression",
                 probe_features="mean-pooled final hidden state (real tokens)")
    return rows


def tables(m: Measured, provenance: dict, *, seed: int, baseline_pairs: int,
           probe_rows: list[dict] | None = None, baselines: dict[str, np.ndarray] | None = None,
           bootstrap: int = 1000) -> dict[str, pd.DataFrame]:
    """Tidy tables from a Measured run; `provenance` (model, data) and versions go on every row.

    `baselines`: {token_pair | self_similarity: cosines [l, pairs]} (see baseline_cosines);
    `bootstrap`: resamples of the intervals (0: none, NaN bounds).
    """
    from pecli.measures.intervals import by_text, ratio_interval
    from pecli.measures.metrics import (
        histogram,
        mean_by_index,
        percentile_of,
        random_pair_cosines,
        summarize,
        z_score,
    )
    from pecli.runs.provenance import row_provenance
    from pecli.runs.tables import validate

    common = {"experiment": NAME, "experiment_version": VERSION, "seed": seed,
              "truncated_texts": m.truncated, "max_length": m.max_length, **m.plan, **row_provenance(),
              **provenance}
    final = m.layers - 1
    rand = random_pair_cosines(m.width, baseline_pairs, seed)
    texts = int(m.text.max()) + 1 if m.text.size else 0
    rows = []
    for name, cos in m.cosine.items():
        for layer in range(m.layers):
            for subset, keep in (("included", np.ones_like(m.special)), ("excluded", ~m.special)):
                s = summarize(cos[layer][keep])
                base = {"intervention": name, "layer": layer, "final_layer": layer == final,
                        "special_tokens": subset, "tokens": s["count"],
                        "aggregation": "over all real tokens of all texts"}
                low, high = ratio_interval(*by_text(cos[layer][keep], m.text[keep], texts),
                                           n_boot=bootstrap, seed=seed)
                rows.append({**base, "metric": "cosine_mean", "value": s["mean"],
                             "ci_low": low, "ci_high": high})
                for stat in ("std", "median"):
                    rows.append({**base, "metric": f"cosine_{stat}", "value": s[stat]})
                rows.append({**base, "metric": "token_count", "value": s["count"]})
                if layer == final:
                    rows.append({**base, "metric": "z_score", "value": z_score(s["mean"], rand),
                                 "aggregation": f"mean cosine vs {baseline_pairs} random pairs"})
                    rows.append({**base, "metric": "percentile",
                                 "value": percentile_of(s["mean"], rand),
                                 "aggregation": f"mean cosine vs {baseline_pairs} random pairs"})
        rows.append({"intervention": name, "layer": final, "final_layer": True,
                     "special_tokens": "included", "tokens": m.tokens,
                     "metric": "truncated_texts", "value": m.truncated,
                     "aggregation": f"texts longer than {m.max_length} tokens, cut"})
    rows += _baseline_rows(baselines or {}, rows, final, seed, bootstrap)
    main = validate(pd.DataFrame([{**common, **r} for r in rows]))

    pos_rows = []
    for name, cos in m.cosine.items():
        keys, means, counts = mean_by_index(cos[final], m.position)
        for k, v, c in zip(keys, means, counts, strict=True):
            pos_rows.append({**common, "intervention": name, "layer": final, "position": int(k),
                             "special_tokens": "included", "metric": "cosine_mean",
                             "value": float(v), "tokens": int(c),
                             "aggregation": "over real tokens at this position index"})
    positions = validate(pd.DataFrame(pos_rows))

    counts, edges = histogram(rand, HIST_BINS)
    rs = summarize(rand)
    rnd = {**common, "intervention": "none", "dim": m.width, "pairs": baseline_pairs,
           "tokens": m.tokens, "aggregation": "random pairs of standard-normal vectors"}
    rand_rows = [{**rnd, "metric": "random_cosine_mean", "value": rs["mean"]},
                 {**rnd, "metric": "random_cosine_std", "value": float(np.std(rand, ddof=1))},
                 {**rnd, "metric": "random_cosine_1_over_sqrt_dim", "value": 1 / np.sqrt(m.width)}]
    rand_rows += [{**rnd, "metric": "random_cosine_hist_count", "value": int(c),
                   "bin_left": float(lo), "bin_right": float(hi)}
                  for c, lo, hi in zip(counts, edges[:-1], edges[1:], strict=True)]
    out = {NAME: main, f"{NAME}_positions": positions,
           f"{NAME}_random": validate(pd.DataFrame(rand_rows))}
    if probe_rows:
        out[f"{NAME}_probe"] = validate(pd.DataFrame(
            [{**common, "layer": final, "tokens": m.tokens, **r} for r in probe_rows]))
    return out


def _baseline_rows(baselines: dict[str, np.ndarray], rows: list[dict], final: int, seed: int,
                   bootstrap: int) -> list[dict]:
    """Rows of the in-model baselines per layer, and where each intervention's mean cosine
    sits between them (`between_baselines`: 0 = token_pair, 1 = self_similarity)."""
    from pecli.measures.intervals import ratio_interval

    metric = {"token_pair": "token_pair_cosine", "self_similarity": "self_similarity"}
    what = {"token_pair": "two different real tokens of different texts",
            "self_similarity": "the same token id in two different texts"}
    out, means = [], {}
    for name, cos in baselines.items():  # cos [l, pairs]
        for layer in range(cos.shape[0]):
            base = {"intervention": "learned", "layer": layer, "final_layer": layer == final,
                    "special_tokens": "excluded", "tokens": 2 * cos.shape[1],
                    "pairs": cos.shape[1], "baseline": name,
                    "aggregation": f"over {cos.shape[1]} seeded pairs of {what[name]}, the "
                                   "model's own positions (interval: pairs resampled)"}
            means[name, layer] = float(cos[layer].mean())
            low, high = ratio_interval(cos[layer], n_boot=bootstrap, seed=seed)
            out.append({**base, "metric": f"{metric[name]}_mean", "value": means[name, layer],
                        "ci_low": low, "ci_high": high})
            out.append({**base, "metric": f"{metric[name]}_std", "value": float(cos[layer].std())})
    for r in rows:
        layer = r.get("layer")
        if r["metric"] != "cosine_mean" or ("token_pair", layer) not in means \
                or ("self_similarity", layer) not in means:
            continue
        lo, hi = means["token_pair", layer], means["self_similarity", layer]
        out.append({**{k: r[k] for k in ("intervention", "layer", "final_layer", "special_tokens",
                                        "tokens")},
                    "metric": "between_baselines", "value": (r["value"] - lo) / (hi - lo),
                    "aggregation": "(mean cosine - token_pair_cosine_mean) / "
                                   "(self_similarity_mean - token_pair_cosine_mean), same layer"})
    return out


def run(options: AblateOptions, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Load the model and data, measure, and return the tables (see the module docstring)."""
    from pecli.data.datasets import load_data
    from pecli.positions.interventions import check_applies
    from pecli.runs.errors import DataError

    o = options
    check_before_loading(o.model, o.intervention)
    data = load_data(o.dataset, o.split, data_dir_=o.data_dir, limit=o.limit, seed=o.seed,
                     text_field=o.text_field, at_most=o.limit_at_most)
    labels = data.labels() if o.probe else None
    if o.probe and labels is None:
        raise DataError(f"--probe needs labels; {data.dataset} has no label column (use imdb)")
    loaded = load(o.model, o)
    for choice in o.intervention:
        check_applies(loaded, choice)
    m = measure(loaded, data.texts(), o.intervention, seed=o.seed, batch_size=o.batch_size,
                layers=o.layers, pooled=o.probe, progress=progress)
    if not parallel.is_main():
        return {}  # launched on N processes: the main one makes and writes the tables
    probe_rows = probe_accuracy(m.pooled, labels, o.seed, o.bootstrap) if o.probe else None
    prov = {**loaded.provenance(), **data.provenance(),
            "text_field": o.text_field or data.text_field}
    return tables(m, prov, seed=o.seed, baseline_pairs=o.baseline_pairs, probe_rows=probe_rows,
                  baselines=in_model_baselines(loaded, data.texts(), o.seed, o.layers),
                  bootstrap=o.bootstrap)


def in_model_baselines(loaded, texts: list[str], seed: int, layers: bool = True
                       ) -> dict[str, np.ndarray]:
    """token_pair and self_similarity cosines [l, pairs] on (a seeded subset of) `texts`."""
    from pecli.runs.batching import encode

    ids = _quiet_encode(encode, loaded, texts).ids
    pairs = sample_baseline_pairs(ids, set(loaded.tokenizer.all_special_ids), seed=seed)
    return baseline_cosines(loaded, ids, pairs, layers)


figures = lazy("pecli.plots.ablate:ablate_figures")


EXPERIMENTS.add(NAME, Experiment(
    NAME, VERSION, run, figures,
    "cosine of features with vs without (or with altered) position information, per layer "
    "and position, against a random baseline; optional linear probe (study E1, E2)",
    AblateOptions,
))
