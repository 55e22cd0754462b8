"""Experiment `pe-recover`: is adding position embeddings harmless, and can it be undone?

For a model with learned absolute positions, x(v, p) is what its first block receives for
token v alone at position p: the model's own sum E_tok[v] + E_pos[p] (+ token type 0 where
there is one) and its own normalisation (BERT's LayerNorm; none in GPT-2), taken from the
input of the first block, so no model is special-cased. On a seeded sample of real tokens,
each at every position:

1. token from x: nearest vocabulary row (cosine) among x(u, no position) for all u;
   the ceiling is the same decoding of x(v, no position);
2. position from x: the linear regression probe of `pe probe` (folds over tokens);
3. token known: x - x(v, no position) against E_pos[p]; neither known: token, then position;
4. controls: the model's tokens with random rows (`random` intervention, about the learned
   rows' norm) through the same normalisation; Gaussian tokens at the model's token scale
   plus the sinusoid of the same width, plain sum (the original Transformer's input).

And in hidden states: a ridge probe from every layer to token identity over the top-K
frequent tokens of real text, with the model's positions and without (`zero`).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from pecli.experiments import data_of, load, preflight, register
from pecli.experiments.options.recover import RecoverOptions
from pecli.measures import recovery as rc
from pecli.measures.intervals import ratio_interval
from pecli.measures.pe_analysis import embedding_rows, hidden_states, model_texts
from pecli.runs.names import INTACT
from pecli.runs.tables import frame as _frame
from pecli.runs.tables import validate

# What each kind that adds nothing to the token embedding does instead.
NOT_ADDED = {"rotary": "rotations of queries and keys",
             "partial rotary": "rotations of part of each query and key",
             "alibi": "a fixed bias on attention scores by distance",
             "relative bias": "a learned bias on attention scores by distance bucket",
             "disentangled relative": "attention terms between content and embeddings of "
                                      "distance buckets"}
SIMILARITY = ("cosine: nearest vocabulary row by cosine similarity (a LayerNorm output has "
              "about the same norm for every row, and without a norm a dot product favours "
              "long rows whatever the direction)")
# Placeholder rows that no text produces: BERT's [unused12], [PAD]...; GPT-2's <|endoftext|>.
_PLACEHOLDER = re.compile(r"^\[(unused\d+|[A-Z]+)\]$|^<\|[^|]*\|>$")
CONDITIONS = {  # condition -> what x is made of
    "learned": "the model's token rows + its position rows, its own normalisation",
    "none": "the model's token rows, position rows zeroed: the ceiling",
    "random": "the model's token rows + Gaussian rows (the learned rows' mean and std), its normalisation",
    "sinusoidal": "Gaussian token rows (the model's token std) + the sinusoid of the same width, plain sum",
}


def real_vocabulary(tokenizer, rows: int) -> np.ndarray:
    """Token ids a text can produce: not special, not added, not a placeholder row."""
    n = min(len(tokenizer), rows)
    skip = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    names = tokenizer.convert_ids_to_tokens(list(range(n)))
    return np.array([i for i, t in enumerate(names)
                     if i not in skip and t is not None and not _PLACEHOLDER.match(t)])


class _Stop(Exception):
    pass


def embedding_stage(loaded, ids: np.ndarray, positions: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """x [n, d]: what the first block receives for token ids[i] alone at position positions[i]."""
    import torch

    from pecli.models.architectures import resolve

    base = getattr(loaded.model, "base_model", loaded.model)
    first = resolve(loaded.model, loaded.spec, loaded.spec.layers)[0]
    seen = []

    def grab(module, args, kwargs):
        seen.append(args[0] if args else kwargs["hidden_states"])  # [b, 1, d]
        raise _Stop

    out = []
    handle = first.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.inference_mode():
            for s in range(0, len(ids), chunk):
                tok = torch.as_tensor(ids[s:s + chunk], device=loaded.device)[:, None]  # [b, 1]
                pos = torch.as_tensor(positions[s:s + chunk] + loaded.spec.position_ids_offset,
                                      device=loaded.device)[:, None]  # [b, 1]
                try:
                    base(input_ids=tok, position_ids=pos, attention_mask=torch.ones_like(tok))
                except _Stop:
                    pass
                out.append(seen.pop()[:, 0].float().cpu().numpy())
    finally:
        handle.remove()
    return np.concatenate(out)


def _interval(correct: np.ndarray, n_boot: int, seed: int) -> tuple[float, float]:
    """Bootstrap over the sampled tokens (items): correct [T] or [T, P]."""
    c = correct.reshape(len(correct), -1)
    return ratio_interval(c.sum(1), np.full(len(c), c.shape[1]), n_boot=n_boot, seed=seed)


def _condition(name: str, x, candidates, token_rows, position_rows, sample, folds, seed, n_boot):
    """Every number of one condition: (per-position rows, summary rows)."""
    import pecli.measures.pe_analysis as pa

    t, p, d = x.shape
    decoded = rc.decode_tokens(x, candidates)  # [T, P]
    correct = decoded == sample[:, None]
    ceiling = rc.nearest(candidates[sample], candidates) == sample  # [T]: x(v, no position)
    joint = correct & (rc.token_then_position(x, decoded, candidates, position_rows)
                       == np.arange(p)[None])
    known = rc.extract_known_token(x, candidates[sample], position_rows)
    # Ridge, not least squares: held-out tokens put their whole row into x, and unshrunk
    # least squares turns that into errors past chance (MiniLM: MAE 279 against chance 128).
    reg = pa.position_regression(x.reshape(t * p, d), np.tile(np.arange(p), t), folds=folds,
                                 seed=seed, groups=np.repeat(sample, p), regressor="ridge")
    cols = {"condition": name, "condition_meaning": CONDITIONS[name]}
    by_position = []
    for pos in range(p):
        low, high = _interval(correct[:, pos], n_boot, seed)
        by_position.append({"metric": "token_accuracy", "value": correct[:, pos].mean(),
                            "pos": pos, "ci_low": low, "ci_high": high, **cols})
    summary = [
        {"metric": "token_accuracy", "value": correct.mean(), "ci": _interval(correct, n_boot, seed)},
        {"metric": "token_accuracy_ceiling", "value": ceiling.mean(), "ci": _interval(ceiling, n_boot, seed)},
        {"metric": "token_accuracy_worst_position", "value": correct.mean(0).min()},
        {"metric": "joint_accuracy", "value": joint.mean(), "ci": _interval(joint, n_boot, seed),
         "evaluation": "token by nearest row, then the position row nearest (cosine) to x minus "
                     "that token's row; both right"},
        {"metric": "position_probe_mae", "value": reg.mae, "evaluation":
         f"ridge regression x -> p (alpha by leave-one-token-out), {folds}-fold CV over "
         "sampled tokens, MAE of round(prediction)"},
        {"metric": "position_probe_chance_mae", "value": reg.chance_mae},
        {"metric": "known_token_max_abs_error", "value": known.max_abs_error, "evaluation":
         "max |(x - x(v, no position)) - E_pos[p]|: 0 up to float32 rounding without a normalisation"},
        {"metric": "known_token_relative_error", "value": known.relative_error},
        {"metric": "known_token_position_accuracy", "value": known.row_accuracy, "evaluation":
         "nearest position row (cosine) to x - x(v, no position)"},
        {"metric": "mean_position_row_norm", "value": float(np.linalg.norm(position_rows, axis=1).mean())},
        {"metric": "mean_token_row_norm", "value": float(np.linalg.norm(token_rows, axis=1).mean()),
         "evaluation": "the token table's rows, before any normalisation"},
    ]
    for r in summary:
        low, high = r.pop("ci", (np.nan, np.nan))
        r.update(ci_low=low, ci_high=high, **cols)
    return by_position, summary


def input_level(loaded, tokens: int, folds: int, seed: int, n_boot: int, say) -> tuple[list, list]:
    """The sum at the input: every condition on one seeded token sample."""
    from pecli.positions.interventions import intervene

    vocab = loaded.model.get_input_embeddings().weight.detach().float().cpu().numpy()  # [V, d]
    learned_rows = embedding_rows(loaded)  # [P, d]
    (v, d), p = vocab.shape, len(learned_rows)
    real = real_vocabulary(loaded.tokenizer, v)
    sample = np.sort(np.random.default_rng(seed).choice(real, min(tokens, len(real)), replace=False))
    ids, pos = np.repeat(sample, p), np.tile(np.arange(p), len(sample))  # pair i = (ids[i], pos[i])
    say(f"{loaded.name}: {len(sample)} tokens x {p} positions through the embedding stage")
    with intervene(loaded, "zero"):
        candidates = embedding_stage(loaded, np.arange(v), np.zeros(v, dtype=np.int64))  # [V, d]
    x = {"learned": embedding_stage(loaded, ids, pos).reshape(len(sample), p, d)}
    with intervene(loaded, "random", seed=seed):
        x["random"] = embedding_stage(loaded, ids, pos).reshape(len(sample), p, d)
        random_rows = embedding_rows(loaded).copy()  # a view on the table, restored on exit
    syn_tokens, sinusoid = rc.sinusoid_control(v, p, d, float(vocab.std()), seed)
    cases = [("learned", x["learned"], candidates, vocab, learned_rows),
             ("random", x["random"], candidates, vocab, random_rows),
             ("sinusoidal", syn_tokens[sample][:, None] + sinusoid[None], syn_tokens, syn_tokens,
              sinusoid)]
    by_position, summary = [], []
    common = {"tokens_sampled": len(sample), "positions": p, "vocabulary_rows": v,
              "real_vocabulary": len(real), "chance_accuracy": 1 / v, "similarity": SIMILARITY,
              "dataset": "vocabulary", "split": "", "rows": len(sample), "tokens": len(ids),
              "interval": "95 % percentile bootstrap over the sampled tokens"}
    for name, xs, cands, token_rows, rows in cases:
        say(f"{loaded.name}: decoding ({name})")
        a, b = _condition(name, xs, cands, token_rows, rows, sample, folds, seed, n_boot)
        iv = {"learned": INTACT, "random": "random", "sinusoidal": "none (synthetic control)"}[name]
        by_position += [{**r, **common, "intervention": iv} for r in a]
        summary += [{**r, **common, "intervention": iv} for r in b]
    # The ceiling per position: the same decoding without positions (one value for all p).
    ceiling = [r for r in summary if r["metric"] == "token_accuracy_ceiling"
               and r["condition"] == "learned"][0]
    by_position += [{**common, "metric": "token_accuracy", "value": ceiling["value"], "pos": q,
                     "ci_low": ceiling["ci_low"], "ci_high": ceiling["ci_high"], "condition": "none",
                     "condition_meaning": CONDITIONS["none"], "intervention": "zero"}
                    for q in range(p)]
    # Before any normalisation the sum is exact arithmetic: (E_tok + E_pos) - E_tok = E_pos.
    raw = vocab[sample][:, None].astype(np.float64) + learned_rows[None]  # [T, P, d]
    exact = float(np.abs(raw - vocab[sample][:, None] - learned_rows[None]).max())
    summary.append({**common, "metric": "raw_sum_max_abs_error", "value": exact,
                    "condition": "learned", "condition_meaning": "E_tok[v] + E_pos[p] in float64 "
                    "from the float32 tables, minus E_tok[v], against E_pos[p]",
                    "intervention": INTACT, "ci_low": np.nan, "ci_high": np.nan})
    return by_position, summary


def hidden_level(loaded, ids: list[list[int]], top_k: int, folds: int, seed: int, n_boot: int,
                 batch_size: int | None, say) -> list[dict]:
    """Per-layer token-identity probe over the top-K frequent real tokens, intact and zero."""
    real = set(real_vocabulary(loaded.tokenizer, loaded.model.get_input_embeddings().num_embeddings))
    rows = []
    for iv in (INTACT, "zero"):
        say(f"{loaded.name}: hidden-state token probe ({iv})")
        states, positions, texts = hidden_states(loaded, ids, iv, seed, batch_size)
        labels = np.array([ids[t][q] for t, q in zip(texts, positions, strict=True)])
        counts = pd.Series(labels[np.isin(labels, list(real))]).value_counts()
        keep = np.isin(labels, counts.index[:top_k].to_numpy())
        for layer, h in enumerate(states):
            probe = rc.ridge_classify(h[keep], labels[keep], groups=texts[keep], folds=folds, seed=seed)
            per_text = np.bincount(texts[keep], minlength=len(ids))  # tokens per text
            common = {"layer": layer, "intervention": iv, "classes": int(min(top_k, len(counts))),
                      "probe_rows": int(keep.sum()), "regressor": "one-vs-rest RidgeLOO on one-hot",
                      "folds": folds, "evaluation": f"{folds}-fold CV over texts, accuracy of the largest score",
                      "interval": "95 % percentile bootstrap over texts"}
            for metric, hits in [("token_probe_accuracy", probe.correct),
                                 ("token_probe_chance_accuracy", probe.chance)]:
                num = np.bincount(texts[keep], weights=hits, minlength=len(ids))
                low, high = ratio_interval(num, per_text, n_boot=n_boot, seed=seed)
                rows.append({"metric": metric, "value": hits.mean(), "ci_low": low, "ci_high": high,
                             **common})
    return rows


def not_applicable(kind: str) -> str:
    return f"not applicable: {kind} positions are {NOT_ADDED[kind]}, not added to the token embedding"


def refuse_if_nothing_is_added(models) -> None:
    """Before loading: if no model adds positions to its token embedding (as their configs
    say), nothing here applies. A mixed list runs, with a "not applicable" row per such model."""
    from pecli.models.sources import peek
    from pecli.runs.errors import ModelError

    refs = [peek(name) for name in models]
    if all(ref is not None and ref.spec.position != "learned" for ref in refs):
        raise ModelError("; ".join(f"{ref.name}: {not_applicable(ref.spec.position)}" for ref in refs))


def run_recover(options: RecoverOptions, announce=None) -> dict[str, pd.DataFrame]:
    """Token and position recovery from the sum, at the input and in hidden states.

    Tables: `by_position` (token accuracy per position and condition, with the ceiling),
    `summary` (overall accuracies, position probe, extraction, joint decoding, norms; a
    "not applicable" row for rotary models), `hidden` (token probe accuracy per layer,
    learned and zero positions).

    Options (RecoverOptions): tokens sampled from the real vocabulary, each placed at every
    position; limit, max_length: texts of `dataset` for the hidden-state probe and tokens per
    text; top_k: the probe's classes, the most frequent real tokens of those texts;
    bootstrap: resamples of every interval (0: none).
    """

    o = options
    preflight(o.models)
    refuse_if_nothing_is_added(o.models)
    say = announce or (lambda _msg: None)
    data = data_of(o)
    texts = data.texts()
    by_position, summary, hidden = [], [], []
    for name in o.models:
        loaded = load(name, o)
        model_cols = loaded.provenance()
        if loaded.spec.position != "learned":
            why = not_applicable(loaded.spec.position)
            say(f"{name}: {why}")
            summary.append({**model_cols, "metric": "not_applicable", "value": np.nan,
                            "note": why, "dataset": "vocabulary", "split": "",
                            "rows": 0, "tokens": 0, "intervention": "none", "condition": "learned"})
            continue
        a, b = input_level(loaded, o.tokens, o.folds, o.seed, o.bootstrap, say)
        by_position += [{**model_cols, **r} for r in a]
        summary += [{**model_cols, "note": "", **r} for r in b]
        enc, data_cols = model_texts(loaded, data, texts, o.max_length)
        hidden += [{**data_cols, **r} for r in hidden_level(
            loaded, enc.ids, o.top_k, o.folds, o.seed, o.bootstrap, o.batch_size, say)]
        del loaded
    tables = {"summary": validate(_frame(summary, "pe-recover", o.seed))}
    if by_position:
        tables["by_position"] = validate(_frame(by_position, "pe-recover", o.seed))
        tables["hidden"] = validate(_frame(hidden, "pe-recover", o.seed))
    from pecli.positions.conditions import labelled

    return {name: labelled(df) for name, df in tables.items()}  # summary has its own `condition`


# version 2: column `protocol` (how a number is evaluated) -> `evaluation`, as in pe-probe
register("pe-recover", 2, run_recover, RecoverOptions, "pecli.plots.recover:recover_figures",
         "Token and position recovered from x = E_tok + E_pos at the input (nearest row, linear "
         "probe, exact extraction, joint decoding, sinusoid and random controls) and a per-layer "
         "token-identity probe with and without positions")
