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
  mean-pooled final features, with the model's positions and with each intervention.

Is a cosine high? Besides random Gaussian vectors (the study's baseline), two in-model
baselines per layer, with the model's own positions (intervention `intact`) on the same
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

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pecli.experiments import EXPERIMENTS, Experiment, check_before_loading, lazy, load
from pecli.positions.conditions import labelled
from pecli.runs import parallel
from pecli.runs.names import INTACT, Choice
from pecli.runs.options import AblateOptions

NAME = "ablate"
VERSION = 3  # 3: in-model baselines over all texts, text-resampled intervals (2: 32 texts, pairs)
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
    batches = parallel.spread(
        length_batches(lengths, 0, max_batch=batch_size) if batch_size
        else tight_batches(lengths, default_token_budget(loaded.device, CPU_HIDDEN_STATE_BUDGET)))
    special_ids = np.array(sorted(set(loaded.tokenizer.all_special_ids)), dtype=np.int64)
    pairs = sample_baseline_pairs(enc.ids, set(special_ids.tolist()), baseline_pairs, seed)
    kept = _kept_positions(pairs, len(lengths))  # text -> sorted positions whose states we keep
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
        at = [(row, p) for row, t in enumerate(rows) for p in kept.get(t, ())]
        rows_at = torch.tensor([r for r, _ in at], dtype=torch.long)
        pos_at = torch.tensor([p for _, p in at], dtype=torch.long)
        out["states"] = torch.stack([h[rows_at, pos_at] for h in ref]).float().cpu().numpy()  # [l, k, d]
        if pooled:
            out["pool0"] = _mean_pool(ref[-1], mask)
        for k, apply in enumerate(applied.values()):
            with apply():
                h = hidden(ids, mask)  # l x [b, t, d]
            out[f"cos{k}"] = cosine_by_layer(ref, h, mask).cpu().numpy()  # [l, n_b]
            if pooled:
                out[f"pool{k + 1}"] = _mean_pool(h[-1], mask)
        return out

    parts = _Parts(batches, lengths, [sum(len(kept.get(t, ())) for t in b) for b in batches])
    checkpoint = None
    if checkpoint_every is not None and parallel.is_main():  # the main process alone saves
        checkpoint = _checkpoint(loaded, texts, interventions, seed, layers, pooled, batches,
                                 checkpoint_every, baseline_pairs)
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
                for k, name in enumerate([INTACT, *names] if pooled else [])},
        baselines=_pair_cosines(pairs, [(t, p) for b in batches for t in b for p in kept.get(t, ())],
                                parts.joined("states")),
        plan=plan_summary(padded_tokens(batches, lengths), batch_size),
    )


def _kept_positions(pairs: dict[str, np.ndarray], texts: int) -> dict[int, list[int]]:
    """Each text's token positions that some baseline pair uses, sorted."""
    both = np.concatenate([p.reshape(-1, 2) for p in pairs.values()])
    both = np.unique(both, axis=0) if len(both) else both  # sorted by text, then position
    kept: dict[int, list[int]] = {}
    for t, p in both.tolist():
        kept.setdefault(t, []).append(p)
    return kept


def _pair_cosines(pairs: dict[str, np.ndarray], where: list[tuple[int, int]], states: np.ndarray
                  ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{baseline: (cosine of each pair's two states at every layer [l, pairs], the pair's texts
    [pairs, 2])}; `states[:, i]` is the state at where[i] = (text, position)."""
    row = {tp: i for i, tp in enumerate(where)}
    out = {}
    for name, pair in pairs.items():
        if len(pair) == 0:
            continue
        a, b = ([row[tuple(x)] for x in pair[:, k].tolist()] for k in (0, 1))
        u, v = states[:, a].astype(np.float64), states[:, b].astype(np.float64)  # [l, pairs, d]
        cos = (u * v).sum(-1) / (np.linalg.norm(u, axis=-1) * np.linalg.norm(v, axis=-1))
        out[name] = (cos, pair[:, :, 0].copy())
    return out


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

    def __init__(self, batches: list[list[int]], lengths: list[int], kept: list[int]):
        self.rows = [len(b) for b in batches]
        self.tokens = [sum(lengths[i] for i in b) for b in batches]
        self.kept = kept  # states kept for the in-model baselines, per batch
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


def _checkpoint(loaded, texts, interventions, seed, layers, pooled, batches, every, pairs):
    """Where this exact measurement's partial results live (see `pecli.runs.io.Checkpoint`): keyed
    by the whole run's batch plan, never by a process's share of it."""
    from pecli.runs.io import Checkpoint

    return Checkpoint("ablate", {"version": VERSION, **loaded.provenance(),
                                 "interventions": interventions, "seed": seed, "layers": layers,
                                 "pooled": pooled, "batches": batches, "baseline_pairs": pairs,
                                 "saved": "by plan batch"},
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
                          seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded token pairs for the two in-model baselines, as [pairs, 2, 2] (text, position),
    drawn over all texts, special tokens skipped.

    token_pair: a real token drawn uniformly, then a token of another text with another id.
    self_similarity: a token drawn uniformly among those whose id occurs in another text,
    then uniformly one of that id's occurrences in other texts. Token-weighted, like the
    intervention cosines (frequent tokens count more). Fewer self-similarity pairs (even 0)
    when no id repeats across texts; none of either from fewer than 2 texts.
    """
    rng = np.random.default_rng([seed, 12])
    empty = np.zeros((0, 2, 2), np.int64)
    out = {"token_pair": empty, "self_similarity": empty}
    lengths = [len(x) for x in ids]
    text = np.repeat(np.arange(len(ids), dtype=np.int64), lengths)
    pos = np.concatenate([np.arange(k, dtype=np.int64) for k in lengths]) if ids else text
    tok = np.concatenate([np.asarray(x, np.int64) for x in ids]) if ids else text
    real = ~np.isin(tok, np.array(sorted(special), np.int64))
    text, pos, tok = text[real], pos[real], tok[real]
    if pairs == 0 or len(np.unique(text)) < 2:
        return out

    def as_pairs(a, b):
        return np.stack([np.stack([text[a], pos[a]], 1), np.stack([text[b], pos[b]], 1)], 1)

    found_a, found_b, have = [], [], 0
    for _ in range(100):  # rejection: another text and another id (nearly always one round)
        a, b = rng.integers(0, len(tok), size=(2, 4 * pairs))
        ok = (text[a] != text[b]) & (tok[a] != tok[b])
        found_a.append(a[ok])
        found_b.append(b[ok])
        have += int(ok.sum())
        if have >= pairs:
            break
    if have:  # none only when every real token of every text is the same id
        out["token_pair"] = as_pairs(np.concatenate(found_a)[:pairs], np.concatenate(found_b)[:pairs])

    by_id = np.lexsort((text, tok))  # occurrences grouped by id, then by text
    tok_s, text_s = tok[by_id], text[by_id]
    first = np.searchsorted(tok_s, tok_s, "left")  # each occurrence's id: its group [first, last)
    last = np.searchsorted(tok_s, tok_s, "right")
    own_first = np.searchsorted(tok_s * (len(ids) + 1) + text_s, tok_s * (len(ids) + 1) + text_s, "left")
    own_last = np.searchsorted(tok_s * (len(ids) + 1) + text_s, tok_s * (len(ids) + 1) + text_s, "right")
    others = (last - first) - (own_last - own_first)  # occurrences of the id in other texts
    eligible = np.flatnonzero(others > 0)  # in sorted order
    if eligible.size == 0:
        return out
    a = eligible[rng.integers(0, eligible.size, size=pairs)]
    k = rng.integers(0, others[a])  # the k-th occurrence of the id outside a's own text
    before = own_first[a] - first[a]  # occurrences of the id in texts before a's own
    b = first[a] + np.where(k < before, k, k + (own_last[a] - own_first[a]))
    out["self_similarity"] = as_pairs(by_id[a], by_id[b])
    return out


# --- tables ------------------------------------------------------------------------


def _accuracy(correct: np.ndarray, bootstrap: int, seed: int) -> dict:
    """Accuracy of held-out texts with its interval (test texts resampled)."""
    from pecli.measures.intervals import mean_interval

    low, high = mean_interval(correct.astype(np.float64), n_boot=bootstrap, seed=seed)
    return {"value": float(correct.mean()), "ci_low": low, "ci_high": high}


def check_probe_labels(labels) -> np.ndarray:
    """The labels as an array, once they are fit for a probe: present, of one type (numbers or
    strings), at least 4 rows of each of at least 2 labels. Checked before any forward pass."""
    from pecli.runs.errors import DataError

    if labels is None:
        raise DataError("--probe needs labels; this data has no label column (use imdb, or a "
                        "file with a 'label' column)")
    missing = [i for i, v in enumerate(labels) if v is None or v != v]
    if missing:
        raise DataError(f"--probe: {len(missing)} row(s) have no label (first: row {missing[0] + 1}); "
                        "drop or fill them")
    kinds = {"number" if isinstance(v, int | float | np.number) and not isinstance(v, bool)
             else "string" if isinstance(v, str) else type(v).__name__ for v in labels}
    if len(kinds) > 1 or kinds - {"number", "string"}:
        raise DataError(f"--probe: labels must all be numbers or all strings, not "
                        f"{' and '.join(sorted(kinds))}; fix the label column")
    y = np.asarray(labels)
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2 or counts.min() < 4:
        raise DataError(f"--probe needs at least 4 rows of each of 2 labels (got "
                        f"{dict(zip(classes.tolist(), counts.tolist(), strict=True))}); raise "
                        "--limit or use a labelled dataset (imdb)")
    return y


def probe_accuracy(features: dict[str, np.ndarray], labels, seed: int = 0,
                   bootstrap: int = 1000) -> list[dict]:
    """Held-out accuracy of logistic regression on each condition's features, one seeded,
    stratified split shared by all; also the `intact` probe applied to each condition."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    y = check_probe_labels(labels)
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
        if cond != INTACT:
            rows.append({"intervention": cond, "probe_trained_on": INTACT,
                         "metric": "probe_accuracy_transfer",
                         **_accuracy(fitted[INTACT].predict(x[test]) == y[test], bootstrap, seed)})
    for r in rows:
        r.update(train_rows=len(train), test_rows=len(test), probe="logistic_regression",
                 probe_features="mean-pooled final hidden state (real tokens)")
    return rows


def tables(m: Measured, provenance: dict, *, seed: int, baseline_pairs: int,
           probe_rows: list[dict] | None = None, bootstrap: int = 1000) -> dict[str, pd.DataFrame]:
    """Tidy tables from a Measured run; `provenance` (model, data) and versions go on every row.

    `baseline_pairs`: random Gaussian pairs of the random baseline; `bootstrap`: resamples of
    the intervals (0: none, NaN bounds).
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
    rows, per_text = [], {}  # (intervention, layer, subset) -> per-text (sums, counts)
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
                                 "aggregation": f"mean cosine vs {baseline_pairs} random pairs"})
                    rows.append({**base, "metric": "percentile",
                                 "value": percentile_of(s["mean"], rand),
                                 "aggregation": f"mean cosine vs {baseline_pairs} random pairs"})
        rows.append({"intervention": name, "layer": final, "final_layer": True,
                     "special_tokens": "included", "tokens": m.tokens,
                     "metric": "truncated_texts", "value": m.truncated,
                     "aggregation": f"texts longer than {m.max_length} tokens, cut"})
    rows += _baseline_rows(m.baselines, rows, per_text, texts, final, seed, bootstrap)
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
    return {name: labelled(df) for name, df in out.items()}


def _baseline_rows(baselines: dict[str, tuple[np.ndarray, np.ndarray]], rows: list[dict],
                   per_text: dict, texts: int, final: int, seed: int, bootstrap: int) -> list[dict]:
    """Rows of the in-model baselines per layer, and where each intervention's mean cosine
    sits between them (`between_baselines`: 0 = token_pair, 1 = self_similarity). Every
    interval resamples texts; between_baselines recomputes all three means per resample."""
    from pecli.measures.intervals import pair_weighted_mean, percentile_interval, resampled

    metric = {"token_pair": "token_pair_cosine", "self_similarity": "self_similarity"}
    what = {"token_pair": "two different real tokens of different texts",
            "self_similarity": "the same token id in two different texts"}
    out, means, stats = [], {}, {}
    for name, (cos, pair_texts) in baselines.items():  # cos [l, pairs], pair_texts [pairs, 2]
        for layer in range(cos.shape[0]):
            base = {"intervention": INTACT, "layer": layer, "final_layer": layer == final,
                    "special_tokens": "excluded", "tokens": 2 * cos.shape[1],
                    "pairs": cos.shape[1], "baseline": name,
                    "aggregation": f"over {cos.shape[1]} seeded pairs of {what[name]} drawn over "
                                   "all texts, the model's own positions (interval: texts "
                                   "resampled, a pair weighted by both its texts' draws)"}
            means[name, layer] = float(cos[layer].mean())
            stats[name, layer] = pair_weighted_mean(cos[layer], *pair_texts.T)
            low, high = percentile_interval(resampled(stats[name, layer], texts, bootstrap, seed))
            out.append({**base, "metric": f"{metric[name]}_mean", "value": means[name, layer],
                        "ci_low": low, "ci_high": high})
            out.append({**base, "metric": f"{metric[name]}_std", "value": float(cos[layer].std())})
    for r in rows:
        layer = r.get("layer")
        if r["metric"] != "cosine_mean" or ("token_pair", layer) not in means \
                or ("self_similarity", layer) not in means:
            continue
        lo, hi = means["token_pair", layer], means["self_similarity", layer]
        sums, counts = per_text[r["intervention"], layer, r["special_tokens"]]
        floor, ceiling = stats["token_pair", layer], stats["self_similarity", layer]

        def between(w, sums=sums, counts=counts, floor=floor, ceiling=ceiling):
            low_w = floor(w)
            return ((w @ sums) / (w @ counts) - low_w) / (ceiling(w) - low_w)

        low, high = percentile_interval(resampled(between, texts, bootstrap, seed))
        out.append({**{k: r[k] for k in ("intervention", "layer", "final_layer", "special_tokens",
                                        "tokens")},
                    "metric": "between_baselines", "value": (r["value"] - lo) / (hi - lo),
                    "ci_low": low, "ci_high": high,
                    "aggregation": "(mean cosine - token_pair_cosine_mean) / "
                                   "(self_similarity_mean - token_pair_cosine_mean), same layer "
                                   "(interval: texts resampled, all three means recomputed)"})
    return out


def run(options: AblateOptions, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Load the model and data, measure, and return the tables (see the module docstring)."""
    from pecli.data.datasets import load_data
    from pecli.positions.conditions import check_all, grid

    o = options
    conditions = grid(o)  # the intact model (the baseline), then each intervention
    check_before_loading(o.model, conditions)
    data = load_data(o.dataset, o.split, data_dir_=o.data_dir, limit=o.limit, seed=o.seed,
                     text_field=o.text_field, at_most=o.limit_at_most)
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


EXPERIMENTS.add(NAME, Experiment(
    NAME, VERSION, run, figures,
    "cosine of features with vs without (or with altered) position information, per layer "
    "and position, against a random baseline; optional linear probe (study E1, E2)",
    AblateOptions,
))
