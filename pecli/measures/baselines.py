"""In-model baselines of ablate's cosines: is a cosine high?

Besides random Gaussian vectors (the study's baseline), two baselines per layer with the
model's own positions (intervention `intact`) on the same texts: `token_pair_cosine` (two
different real tokens of different texts: the model's anisotropy floor, Ethayarajh 2019) and
`self_similarity` (the same token id in two different texts). Their pairs are drawn, seeded,
over all evaluated texts (`sample_baseline_pairs`); the states come from the own-position pass
that the cosines need anyway (`kept_positions`, `pair_cosines`). `baseline_rows` also places
each intervention's mean cosine on that scale (`between_baselines`: 0 = as alike as two
different tokens, 1 = as alike as the same token in another context). Every interval
resamples texts (pecli.measures.intervals): a pair counts as often as both its texts are drawn.
"""

from __future__ import annotations

import numpy as np

from pecli.runs.names import INTACT

BASELINE_PAIRS = 1000  # pairs per in-model baseline


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


def kept_positions(pairs: dict[str, np.ndarray], texts: int) -> dict[int, list[int]]:
    """Each text's token positions that some baseline pair uses, sorted."""
    both = np.concatenate([p.reshape(-1, 2) for p in pairs.values()])
    both = np.unique(both, axis=0) if len(both) else both  # sorted by text, then position
    kept: dict[int, list[int]] = {}
    for t, p in both.tolist():
        kept.setdefault(t, []).append(p)
    return kept


def pair_cosines(pairs: dict[str, np.ndarray], where: list[tuple[int, int]], states: np.ndarray
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


def baseline_rows(baselines: dict[str, tuple[np.ndarray, np.ndarray]], rows: list[dict],
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
