"""How a model uses position: attention and hidden-state diagnostics under every condition.

Texts: each document tokenised with the tokenizer's default special tokens, as Gu et al.'s
code does; documents with at least `length` tokens are cut to their first `length`
(shorter ones are skipped and counted), drawn in a seeded order until `limit` are found.
With `join`, the documents (no special tokens) joined by EOS (SEP for an encoder
without one) make one stream, cut into
windows that the tokenizer's special tokens then wrap, for lengths no document reaches.
Every text has exactly `length` tokens, so batches need no padding.

For every model and condition (the intact model first; then every intervention x mask x
semantics, each crossed with every --rope-scaling) one pass over the texts feeds
pecli.measures.attention.Stats, and the tables below come out of it. Intervals: 95 %
bootstrap over texts wherever a statistic has one value per text; `attn` also gives every
other condition's difference from intact (`diff_vs_intact`, `diff_ci_low`, `diff_ci_high`),
with a bootstrap that draws the same texts for both (all conditions see the same texts).

    attn            per (layer, head), per layer, per layer type (`layer_type`: transformers'
                    names, pecli.models.architectures.layer_types; scope layer_type, the
                    mean over that type's layers and heads) and for the model: sink_rate
                    (Gu et al.'s Sink_1^eps; per layer the share of its heads),
                    first_token_mass, entropy, mean_distance, previous_token_mass,
                    diagonal_mass; heads named previous-token / diagonal in `role`;
                    high_frequency_share
    attn_positions  by position bucket: entropy (mean over heads) per layer, and the norm
                    of the hidden state per layer (0 = the first block's input)
    attn_distance   mass per distance bin, per (layer, head) and per layer
    attn_frequency  rotary frequency usage: mean norm of q and k per (layer, head, pair)
    attn_positional positional vectors: first two principal components per layer and
                    position; past the context, the cosine with the nearest one inside
    attn_probe      position probe from the whole hidden state and from its norm alone
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from pecli.experiments import CONDITION, Headline, check_before_loading, load, register
from pecli.experiments.options.attn import AttnOptions
from pecli.runs.errors import ConfigError, DataError, ModelError
from pecli.runs.provenance import row_provenance
from pecli.runs.tables import validate

HEAD_METRICS = ("first_token_mass", "entropy", "mean_distance", "previous_token_mass", "diagonal_mass")
MAX_POSITIONAL_ROWS = 512  # positions per layer written to attn_positional (evenly spaced)


# families whose attention the statistics do not describe yet, and why
NO_DIAGNOSTICS = {"gpt_oss": "its learned sink logit per head takes attention mass that no key "
                             "holds, which the statistics (sink rate, entropy, distance) do not "
                             "count yet; attn refuses it rather than describe another softmax"}


def _refuse_undescribed(name: str, family: str) -> None:
    if family in NO_DIAGNOSTICS:
        raise ModelError(f"{name} ({family}): {NO_DIAGNOSTICS[family]}")

def _special_wrap(tokenizer) -> tuple[list[int], list[int]]:
    """The tokenizer's default special tokens: (before, after) the text's own tokens."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    for i in range(len(full) - len(plain) + 1):
        if full[i:i + len(plain)] == plain:
            return full[:i], full[i + len(plain):]
    return [], []


def select_texts(tokenizer, texts: list[str], length: int, limit: int, seed: int,
                 join: bool) -> tuple[torch.Tensor, dict]:
    """[n, length] token ids and what the rows say about them (see the module doc)."""
    if join:
        from pecli.runs.batching import encode

        before, after = _special_wrap(tokenizer)
        inner = length - len(before) - len(after)
        if inner < 1:
            raise DataError(f"--length {length} leaves no room beside the tokenizer's special tokens")
        sep = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
        if sep is None:
            raise DataError("the tokenizer has neither an EOS nor a SEP token to join documents with; "
                            "drop --join")
        stream: list[int] = []
        for first in range(0, len(texts), 64):  # only as many documents as the windows need
            for i, ids in enumerate(encode(tokenizer, texts[first:first + 64], max_length=10**12,
                                           add_special_tokens=False).ids, start=first):
                stream += ([sep] if i else []) + list(ids)
            if len(stream) >= limit * inner:
                break
        windows = [before + stream[i:i + inner] + after
                   for i in range(0, len(stream) - inner + 1, inner)][:limit]
        if len(windows) < 2:
            raise DataError(f"the joined documents give {len(windows)} window(s) of {length} tokens; "
                            "two are needed for an interval: use more documents or a shorter --length")
        return torch.tensor(windows), {"texts_from": "joined", "skipped_short": 0,
                                       "stream_tokens": len(stream)}
    order = np.random.default_rng(seed).permutation(len(texts))
    kept, short = [], 0
    for i in order:
        ids = tokenizer(texts[i], verbose=False)["input_ids"]
        if len(ids) >= length:
            kept.append(ids[:length])
            if len(kept) == limit:
                break
        else:
            short += 1
    if len(kept) < 2:
        raise DataError(f"{len(kept)} document(s) have at least {length} tokens (with the "
                        f"tokenizer's special tokens); two are needed: use a shorter --length, "
                        "more documents, or --join (windows of the documents joined by EOS)")
    return torch.tensor(kept), {"texts_from": "documents", "skipped_short": short,
                                "stream_tokens": 0}


def run(options: AttnOptions, progress: Callable[[int, int], None] | None = None,
        loaded=None) -> dict[str, pd.DataFrame]:
    """The attn tables (module doc); `loaded` replaces loading the one model (tests)."""
    from pecli.data.datasets import load_data
    from pecli.models.sources import peek
    from pecli.positions.conditions import grid as conditions

    o = options
    grid = conditions(o)  # the intact model first, then intervention x mask x rope scaling
    remedies = sorted({str(h.intervention) for h in grid if "attention" in h.intervention.term.traits})
    if remedies:  # they replace the attention function with their own, which the capture cannot cut
        raise ConfigError(f"intervention (--intervention) {', '.join(remedies)}: attn does not compute "
                          "the remedies' own attention block by block yet; drop them (interventions "
                          "on the positions themselves, masks and rope scaling work)")
    for name in o.model if loaded is None else ():
        check_before_loading(name, grid)
        ref = peek(name)
        if ref is not None:
            _refuse_undescribed(name, ref.spec.family)
        rows = ref.table_rows() if ref is not None else None
        if rows is not None and o.length > rows:  # every row would be "not applicable"
            raise ConfigError(f"--length {o.length}: {name} has a table of {rows} positions and no "
                              f"row past them; use --length {rows} or less")
    data = load_data(o.dataset, o.split, data_dir_=o.data_dir, seed=o.seed, text_field=o.text_field)
    tables: dict[str, list] = {}
    for name in o.model:
        model = loaded or load(name, o)
        _refuse_undescribed(model.name, model.spec.family)  # GGUF aliases: known once loaded
        for table, rows in _tables_for(model, data, grid, o, progress, len(o.model)).items():
            tables.setdefault(table, []).extend(rows)
        del model
    prov = row_provenance()
    return {k: validate(pd.DataFrame(v).assign(**prov)) for k, v in tables.items() if v}


def _tables_for(loaded, data, grid, o: AttnOptions, progress, models: int = 1) -> dict[str, list[dict]]:
    from pecli.measures.attention import Stats, capture, heads_of, rotary_pairs, run_batch
    from pecli.models.architectures import layer_types
    from pecli.positions.conditions import check_all
    from pecli.positions.extension import extended
    from pecli.positions.rope_scaling import provenance as rope_columns

    check_all(grid, loaded)
    ids, how_texts = select_texts(loaded.tokenizer, data.texts(), o.length, o.limit, o.seed, o.join)
    n = len(ids)
    layers = len(_blocks(loaded))
    types = layer_types(loaded.model.config)
    types = types if len(types) == layers else ["full_attention"] * layers  # configs that name no layers
    heads = heads_of(loaded)
    context = loaded.max_positions
    probes = min(32, o.length) if o.probe_positions is None else o.probe_positions
    probe_at = tuple(sorted(set(np.linspace(0, o.length - 1, probes).round().astype(int).tolist()))) \
        if o.hidden and probes else ()
    batch = o.batch_size or max(1, min(n, 8192 // o.length))
    common = {"experiment": "attn", "seed": o.seed, **loaded.provenance(), **data.provenance(),
              "text_field": data.text_field, "rows": n, "tokens": n * o.length, "length": o.length,
              "context": context, "causal": loaded.spec.causal, "epsilon": o.epsilon, **how_texts}
    _, frequencies = rotary_pairs(loaded)
    out: dict[str, list[dict]] = {k: [] for k in ("attn", "attn_positions", "attn_distance",
                                                 "attn_frequency", "attn_positional", "attn_probe")}
    total = len(grid) * n * models  # texts x conditions over the run (other models: as many texts)
    reference = None  # intact's head values (grid's first), once measured
    for how in grid:
        cond = {"condition": how.label, **how.names, "computation": how.computation}
        rope = rope_columns(str(how.rope or "none"), how.rope and how.rope.parameters, None)
        why = how.reason(loaded, o.length, "the text's")
        if why is not None:
            out["attn"].append({**common, **cond, **rope, "scope": "model", "layer": -1, "head": -1,
                                "metric": "sink_rate", "value": float("nan"), "ci_low": float("nan"),
                                "ci_high": float("nan"), "role": "", "note": why})
            continue
        stats = Stats(n, layers, heads, o.length, loaded.spec.causal, o.block, probe_at, loaded.device)
        with torch.inference_mode(), extended(loaded, o.length), how.applied(loaded, o.seed), \
                capture(loaded, stats, hidden=o.hidden):
            for start in range(0, n, batch):
                stats.offset = start
                run_batch(loaded, stats, ids[start:start + batch])
                if progress:
                    progress(min(batch, n - start), total)
        if len(stats.seen_layers) != layers:
            raise ModelError(f"{loaded.name}: attention statistics reached {len(stats.seen_layers)} "
                             f"of its {layers} layers; its attention bypassed the capture")
        columns = how.columns(loaded)
        row = {**common, **cond, **{k: columns[k] for k in ("rope_scaling", "rope_parameters")},
               "note": ""}
        values = head_values(stats, o)
        probes = probe_values(stats, o) if o.hidden else []
        if how.intact:  # grid's first: every other condition is paired with it, text by text
            reference, probe_reference = values, probes
        out["attn"] += head_rows(stats, row, o, types, values, None if how.intact else reference)
        out["attn_positions"] += position_rows(stats, row, o, context)
        out["attn_distance"] += distance_rows(stats, row)
        out["attn_frequency"] += frequency_rows(stats, row, frequencies)
        if o.hidden:
            out["attn_positional"] += positional_rows(stats, row, context)
            out["attn_probe"] += probe_rows(probes, row, o, None if how.intact else probe_reference)
    return out


def _blocks(loaded):
    from pecli.models.architectures import resolve

    return list(resolve(loaded.model, loaded.spec, loaded.spec.layers))


def _interval(values: np.ndarray, o: AttnOptions) -> tuple[float, float]:
    from pecli.measures.intervals import mean_interval

    return mean_interval(values, n_boot=o.bootstrap, seed=o.seed)


def head_values(stats, o: AttnOptions) -> dict[str, np.ndarray]:
    """Each head statistic per text, [texts, layers, heads]; `sink` (1 where the first token
    takes more than epsilon) beside them."""
    per = stats.per_text()
    per["sink"] = (per["first_token_mass"] > o.epsilon).astype(np.float64)
    return per


def head_rows(stats, row: dict, o: AttnOptions, types: list[str], per: dict[str, np.ndarray],
              reference: dict[str, np.ndarray] | None = None) -> list[dict]:
    """The `attn` table (module doc); `types`: each layer's type (layer_types); `per`: this
    condition's head_values; `reference`: intact's on the same texts, for each row's paired
    difference (None: this is intact, whose difference columns are blank)."""
    from pecli.measures.attention import ROLE_THRESHOLD
    from pecli.measures.intervals import diff_columns

    rows = []

    def add(scope, layer, head, metric, select, role="", kind="all"):
        values = select(per["sink" if metric == "sink_rate" else metric])
        low, high = _interval(values, o)
        diff = diff_columns(reference_row=True) if reference is None else diff_columns(
            values, select(reference["sink" if metric == "sink_rate" else metric]),
            n_boot=o.bootstrap, seed=o.seed)
        rows.append({**row, "scope": scope, "layer": layer, "head": head, "layer_type": kind,
                     "metric": metric, "value": float(values.mean()), "ci_low": low,
                     "ci_high": high, **diff, "role": role})

    for metric in ("sink_rate", *HEAD_METRICS):
        add("model", -1, -1, metric, lambda v: v.mean((1, 2)))
    for kind in dict.fromkeys(types):  # in the order the layers first name them
        of = [i for i, t in enumerate(types) if t == kind]
        for metric in ("sink_rate", *HEAD_METRICS):
            add("layer_type", -1, -1, metric, lambda v, of=of: v[:, of].mean((1, 2)), kind=kind)
    L, H = per["sink"].shape[1:]
    for layer in range(L):
        for metric in ("sink_rate", *HEAD_METRICS):
            add("layer", layer, -1, metric, lambda v, layer=layer: v[:, layer].mean(1), kind=types[layer])
    for layer in range(L):
        for head in range(H):
            for metric in HEAD_METRICS:
                v = per[metric][:, layer, head]
                role = ""
                if metric == "previous_token_mass" and v.mean() > ROLE_THRESHOLD:
                    role = "previous-token head"
                elif metric == "diagonal_mass" and v.mean() > ROLE_THRESHOLD:
                    role = "diagonal head"
                elif metric == "first_token_mass" and v.mean() > o.epsilon:
                    role = "sink head"
                add("head", layer, head, metric, lambda x, layer=layer, head=head: x[:, layer, head],
                    role, types[layer])
    usage = stats.frequency_usage()
    if usage is not None:
        q, k = usage  # [L, H, pairs], [L, H_kv, pairs]
        groups = q.shape[1] // k.shape[1]
        prod = q * np.repeat(k, groups, axis=1)
        fast = max(1, q.shape[2] // 4)  # pair 0 turns fastest: the highest frequencies first
        share = prod[..., :fast].sum(-1) / np.maximum(prod.sum(-1), 1e-300)
        for layer in range(L):
            for head in range(H):
                rows.append({**row, "scope": "head", "layer": layer, "head": head,
                             "layer_type": types[layer], "metric": "high_frequency_share", "value": float(share[layer, head]),
                             "ci_low": float("nan"), "ci_high": float("nan"),
                             **diff_columns(reference_row=True), "role": ""})  # no per-text values
    return rows


def _buckets(length: int, count: int) -> list[tuple[int, int]]:
    edges = np.unique(np.linspace(0, length, min(count, length) + 1).round().astype(int))
    return list(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True))


def position_rows(stats, row: dict, o: AttnOptions, context: int) -> list[dict]:
    """The `attn_positions` table: entropy (mean over heads) and hidden-state norms by bucket."""
    from pecli.measures.attention import entropy_ceiling

    rows = []
    ceiling = entropy_ceiling(o.length, stats.causal)
    ent = stats.entropy_text.cpu().numpy()  # [n, L, T]
    series = [("entropy", ent, ceiling)]
    if stats.hidden_norm is not None:
        series.append(("hidden_norm", stats.hidden_norm.cpu().numpy(), None))
    for metric, values, ref in series:
        for layer in range(values.shape[1]):
            for lo, hi in _buckets(o.length, o.buckets):
                per_text = values[:, layer, lo:hi].mean(-1)
                low, high = _interval(per_text, o)
                rows.append({**row, "metric": metric, "layer": layer, "position_start": lo,
                             "position_end": hi, "past_context": lo >= context,
                             "value": float(per_text.mean()), "ci_low": low, "ci_high": high,
                             "uniform_entropy": float(ref[lo:hi].mean()) if ref is not None else float("nan")})
    return rows


def distance_rows(stats, row: dict) -> list[dict]:
    hist = stats.distance_histogram()  # [L, H, bins]
    bounds = stats.edges + [stats.length]
    rows = []
    for layer in range(hist.shape[0]):
        for head in [*range(hist.shape[1]), -1]:
            mass = hist[layer].mean(0) if head == -1 else hist[layer, head]
            for j, m in enumerate(mass):
                rows.append({**row, "metric": "distance_mass", "layer": layer, "head": head,
                             "distance_low": bounds[j], "distance_high": bounds[j + 1], "value": float(m)})
    return rows


def frequency_rows(stats, row: dict, frequencies) -> list[dict]:
    usage = stats.frequency_usage()
    if usage is None:
        return []
    q, k = usage
    groups = q.shape[1] // k.shape[1]
    rows = []
    for layer in range(q.shape[0]):
        for head in range(q.shape[1]):
            for pair in range(q.shape[2]):
                rows.append({**row, "metric": "qk_norm", "layer": layer, "head": head, "pair": pair,
                             "frequency": float(frequencies[pair]) if frequencies is not None else float("nan"),
                             "q_norm": float(q[layer, head, pair]),
                             "k_norm": float(k[layer, head // groups, pair]),
                             "value": float(q[layer, head, pair] * k[layer, head // groups, pair])})
    return rows


def positional_rows(stats, row: dict, context: int) -> list[dict]:
    from pecli.measures.attention import nearest_inside_cosine, principal_components

    pv = stats.positional_vectors()  # [L+1, T, d]
    T = pv.shape[1]
    keep = np.unique(np.linspace(0, T - 1, min(T, MAX_POSITIONAL_ROWS)).round().astype(int))
    rows = []
    for layer in range(pv.shape[0]):
        scores, ratio = principal_components(pv[layer])
        near = nearest_inside_cosine(pv[layer], context)
        for t in keep:
            rows.append({**row, "metric": "positional_vector", "layer": layer, "position": int(t),
                         "pc1": float(scores[t, 0]), "pc2": float(scores[t, 1]) if scores.shape[1] > 1 else 0.0,
                         "explained_pc1": float(ratio[0]), "explained_pc2": float(ratio[1]) if len(ratio) > 1 else 0.0,
                         "value": float(np.linalg.norm(pv[layer, t])),
                         "nearest_inside_cosine": float(near[t - context]) if t >= context else float("nan")})
    return rows


def probe_values(stats, o: AttnOptions) -> list[dict]:
    """Position probe at each layer: ridge regression from the whole hidden state and from
    its norm alone (a cubic in the standardised norm) to the position, folds over texts; per
    layer each text's held-out MAE under each (`vector`, `norm`) and under chance (`chance`),
    [texts] arrays, with the number of probed positions and folds."""
    from pecli.measures.pe_analysis import position_regression

    if stats.probe is None or not stats.probe_at:
        return []
    x = stats.probe.numpy().astype(np.float64)  # [n, P, L+1, d]
    n, P = x.shape[:2]
    folds = min(5, n)
    y = np.tile(np.asarray(stats.probe_at), n)
    groups = np.repeat(np.arange(n), P)
    layers = []
    for layer in range(x.shape[2]):
        h = x[:, :, layer].reshape(n * P, -1)
        norm = np.linalg.norm(h, axis=-1)
        z = (norm - norm.mean()) / max(norm.std(), 1e-12)
        feats = {"vector": h, "norm": np.stack([z, z ** 2, z ** 3], -1)}
        res = {k: position_regression(v, y, folds=folds, seed=o.seed, groups=groups, regressor="ridge")
               for k, v in feats.items()}
        layers.append({**{k: r.errors.reshape(n, P).mean(1) for k, r in res.items()},
                       "chance": res["vector"].chance_errors.reshape(n, P).mean(1),
                       "positions": P, "folds": folds})
    return layers


def probe_rows(layers: list[dict], row: dict, o: AttnOptions, reference: list[dict] | None = None) -> list[dict]:
    """The `attn_probe` table from probe_values: each layer's MAE from the whole vector and
    from the norm, and the norm's share = (chance - norm) / (chance - vector), NaN where the
    whole vector's probe does not beat chance (its interval reaches the chance MAE); with
    `reference` (intact's probe_values on the same texts) each row's paired difference from
    intact (DIFF_COLUMNS; blank where either share is NaN)."""
    from pecli.measures.intervals import (
        DIFF_COLUMNS,
        diff_columns,
        percentile_interval,
        proper,
        resampled,
    )

    def share(v: dict, counts: np.ndarray) -> np.ndarray:
        return (counts @ (v["chance"] - v["norm"])) / (counts @ (v["chance"] - v["vector"]))

    def beats(v: dict) -> bool:  # a share of nothing means nothing
        chance, high = float(v["chance"].mean()), _interval(v["vector"], o)[1]
        gain = (v["chance"] - v["vector"]).sum()
        return gain > 0 and (high < chance if high == high else v["vector"].mean() < chance)

    rows = []
    for layer, v in enumerate(layers):
        ref = reference[layer] if reference is not None else None
        common = {**row, "layer": layer, "chance_mae": float(v["chance"].mean()), "positions": v["positions"],
                  "folds": v["folds"]}
        for k in ("vector", "norm"):
            low, high = _interval(v[k], o)
            diff = diff_columns(reference_row=True) if ref is None else diff_columns(
                v[k], ref[k], n_boot=o.bootstrap, seed=o.seed)
            rows.append({**common, "metric": "probe_mae", "features": k, "value": float(v[k].mean()),
                         "ci_low": low, "ci_high": high, **diff})
        n = len(v["vector"])
        whole = np.ones(n)
        value = float(share(v, whole)) if beats(v) else float("nan")
        low, high = percentile_interval(resampled(lambda c, v=v: share(v, c), n, o.bootstrap, o.seed)) \
            if value == value else (float("nan"), float("nan"))
        diff = diff_columns(reference_row=True)
        if ref is not None and value == value and beats(ref):
            stats = resampled(lambda c, v=v, ref=ref: share(v, c) - share(ref, c), n, o.bootstrap, o.seed)
            diff = dict(zip(DIFF_COLUMNS, (value - float(share(ref, whole)), *proper(*percentile_interval(stats))),
                            strict=True))
        rows.append({**common, "metric": "norm_share", "features": "norm / vector", "value": value,
                     "ci_low": low, "ci_high": high, **diff})
    return rows


register("attn", 1, run, AttnOptions, "pecli.plots.attn:figures",
         "Attention and hidden-state diagnostics by layer and head (sink rate, entropy, "
         "distance, rotary frequency usage, positional vectors, position probe)",
         headlines=(Headline("sink_rate", "attention sink rate (Gu et al.'s Sink_1^eps: share of heads)",
                             {"scope": "model"}, CONDITION,
                             axis="share of heads whose mean attention to the first token > eps"),))
