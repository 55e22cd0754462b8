"""How a model uses position: attention and hidden-state statistics, by layer and query block.

Attention (registry families): `capture(loaded, stats)` installs one attention function in
transformers' attention registry that wraps whatever the condition runs (the model's own
attention, or a pecli mask). Per layer it cuts the queries into blocks of `stats.block`
rows and calls, per block, the model's own eager attention (`eager_attention_forward` of
its modelling module; or the mask's function) on those rows (and, causal, the keys up to
the block's end); the layer's output is the blocks' outputs joined, and each block's
weights [b, h, rows, keys] go to `stats.add` and are dropped. So no layer's full map, and
never every layer's, is held. Families with their own attention code (BLOOM, MPT, T5,
GPT-J) cannot be reached that way: they run with `output_attentions=True` (eager), every
layer's maps at once, and the same `stats.add` reads them (`literal_route`).

Statistics per (text, layer, head) from weights a[q, k] (T queries, rows of the eager
softmax):
    first_token_mass   mean_q a[q, 0]; Gu et al.'s importance score of the first token
                       (their code divides column k's sum by T - k, the queries that see
                       it: T for k = 0)
    sink               first_token_mass > epsilon (0.3 in their code, 64-token prompts);
                       Sink_1^eps is the share of (layer, head) with it, averaged over texts
    entropy            mean_q -sum_k a log a (nats; rows renormalised where a mask scales
                       them), and by query position summed over texts
    mean_distance      mean_q sum_k a[q, k] |q - k|
    distance histogram mass per distance bin [0], [1], [2, 4), [4, 8), ... (mean over q)
    previous_token     mean_{q >= 1} a[q, q - 1];   diagonal  mean_q a[q, q]
Rotary frequency usage (Barbero et al.): per layer, head and rotary pair i, the mean over
tokens of the 2-norm of (q_i, q_{i + r/2}) (rotate-half pairs over the r rotated
dimensions; a rotation keeps each pair's norm, so the rotated q and k give the same norms
as before rotation); keys per key head.
Hidden states (hooks on the blocks): layer 0 is the first block's input (token plus
added position), layer l the output of block l (before any final norm). Per position, the
norm (per text) and the sum over texts (positional vectors, Dong et al.: the per-position
mean minus the mean over positions), and at `probe_at` positions the vectors themselves
(the position probe).
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from pecli.models.architectures import resolve
from pecli.runs.errors import ModelError

EPSILON = 0.3  # Gu et al.'s threshold (sail-sg/Attention-Sink, eval_sink_open_source.py)
GU_LENGTH = 64  # their prompt length in tokens
ROLE_THRESHOLD = 0.5  # a head whose mean previous-token (diagonal) weight exceeds this is named so


def distance_edges(length: int) -> list[int]:
    """Left edges of the distance bins: 0, 1, 2, 4, 8, ... below `length` (bin j is
    [edge_j, edge_{j+1}), the last open to length - 1)."""
    edges, e = [0, 1], 2
    while e < length:
        edges.append(e)
        e *= 2
    return [x for x in edges if x < max(length, 1)]


@dataclass
class Stats:
    """Sums of one condition's statistics over the texts of a run (see the module doc)."""

    texts: int
    layers: int
    heads: int
    length: int
    causal: bool
    block: int = 256
    probe_at: tuple[int, ...] = ()
    device: torch.device | str = "cpu"
    offset: int = 0  # the batch's first text

    def __post_init__(self):
        n, L, H, T = self.texts, self.layers, self.heads, self.length
        z = functools.partial(torch.zeros, dtype=torch.float64, device=self.device)
        self.first, self.entropy, self.distance = z(n, L, H), z(n, L, H), z(n, L, H)
        self.previous, self.diagonal = z(n, L, H), z(n, L, H)
        self.entropy_text = z(n, L, T)  # mean over heads, per text and query position
        self.edges = distance_edges(T)
        self.histogram = z(L, H, len(self.edges))  # summed over texts and queries
        self.q_norm: list[torch.Tensor | None] = [None] * L  # [H, pairs] summed over texts, tokens
        self.k_norm: list[torch.Tensor | None] = [None] * L
        self.hidden_norm: torch.Tensor | None = None  # [n, L+1, T]
        self.hidden_sum: torch.Tensor | None = None  # [L+1, T, d] summed over texts (float32)
        self.probe: torch.Tensor | None = None  # [n, P, L+1, d] at probe_at
        self.frequencies: torch.Tensor | None = None  # [pairs] radians per token
        self.seen_layers: set[int] = set()

    # --- attention ----------------------------------------------------------------------

    def add(self, layer: int, start: int, p: torch.Tensor) -> None:
        """Weights of queries start..start+rows-1 of one layer, p [b, h, rows, keys]: a few
        passes over the block in its own dtype, sums kept in float64."""
        b, h, rows, keys = p.shape
        sl = slice(self.offset, self.offset + b)
        p = p.float()
        dev = p.device
        q = torch.arange(start, start + rows, device=dev)  # absolute query positions
        r = torch.arange(rows, device=dev)
        self.seen_layers.add(layer)
        self.first[sl, layer] += p[..., 0].double().sum(-1)
        s = p.sum(-1)  # [b, h, rows]: 1 for a softmax; a scaled mask's rows are renormalised
        ent = (torch.log(s) - torch.special.xlogy(p, p).sum(-1) / s).double()  # H of p / s
        self.entropy[sl, layer] += ent.sum(-1)
        self.entropy_text[sl, layer, start:start + rows] += ent.mean(1)
        kpos = torch.arange(keys, device=dev, dtype=p.dtype)
        pk = p @ kpos  # [b, h, rows]: sum_k p k
        c = torch.nn.functional.pad(p.cumsum(-1), (1, 0))  # [b, h, rows, keys + 1]
        if self.causal:  # sum_k p (q - k) over the keys up to q
            dist = q.to(p.dtype) * s - pk
        else:  # |q - k|: keys left of q, q(mass) - sum p k, and right of q, sum p k - q(mass)
            at = q.clamp_max(keys).expand(b, h, rows).unsqueeze(-1)
            left_mass = c.gather(-1, at).squeeze(-1)  # sum_{k < q} p
            left_pk = torch.nn.functional.pad((p * kpos).cumsum(-1), (1, 0)).gather(-1, at).squeeze(-1)
            qf = q.to(p.dtype)
            dist = (qf * left_mass - left_pk) + ((pk - left_pk) - qf * (s - left_mass))
        self.distance[sl, layer] += dist.double().sum(-1)
        diag = p[..., r, q.clamp_max(keys - 1)]  # [b, h, rows]
        self.diagonal[sl, layer] += (diag * (q < keys)).double().sum(-1)
        has_prev = (q >= 1) & (q - 1 < keys)
        prev = p[..., r, (q - 1).clamp(0, keys - 1)]
        self.previous[sl, layer] += (prev * has_prev).double().sum(-1)
        # histogram: mass on keys [lo, hi) = C[hi] - C[lo]
        bounds = self.edges + [self.length]
        for j in range(len(self.edges)):
            lo_d, hi_d = bounds[j], bounds[j + 1]
            # left keys: q - hi_d < k <= q - lo_d
            mass = _range_mass(c, q - hi_d + 1, q - lo_d + 1, keys)
            if not self.causal:  # right keys: q + max(lo_d, 1) <= k < q + hi_d
                mass = mass + _range_mass(c, q + max(lo_d, 1), q + hi_d, keys)
            self.histogram[layer, :, j] += mass.double().sum((0, -1))

    def add_qk(self, layer: int, query: torch.Tensor, key: torch.Tensor, pairs: int) -> None:
        """Rotary frequency usage: query [b, h, T, d], key [b, h_kv, T, d], the first 2*pairs
        dimensions rotated as rotate-half pairs (i, i + pairs)."""
        def pair_norms(x):
            x = x[..., : 2 * pairs].double()
            return torch.sqrt(x[..., :pairs] ** 2 + x[..., pairs:] ** 2).sum((0, 2))  # [h, pairs]
        for store, x in ((self.q_norm, query), (self.k_norm, key)):
            s = pair_norms(x)
            store[layer] = s if store[layer] is None else store[layer] + s

    # --- hidden states ------------------------------------------------------------------

    def add_hidden(self, layer: int, h: torch.Tensor, total_layers: int) -> None:
        """Hidden states [b, T, d] of `layer` (0: embeddings)."""
        b, T, d = h.shape
        h = h.float()
        if self.hidden_sum is None:
            z = functools.partial(torch.zeros, dtype=torch.float64, device=self.device)
            self.hidden_norm = z(self.texts, total_layers, T)
            self.hidden_sum = torch.zeros(total_layers, T, d, device=self.device)
            self.probe = torch.zeros(self.texts, len(self.probe_at), total_layers, d)
        sl = slice(self.offset, self.offset + b)
        self.hidden_norm[sl, layer] = h.norm(dim=-1).double()
        self.hidden_sum[layer] += h.sum(0)
        if self.probe_at:
            self.probe[sl, :, layer] = h[:, list(self.probe_at)].float().cpu()

    # --- results ------------------------------------------------------------------------

    def per_text(self) -> dict[str, np.ndarray]:
        """Per (text, layer, head) means: first_token_mass, entropy, mean_distance,
        previous_token_mass, diagonal_mass, sink (0/1)."""
        T = self.length
        first = (self.first / T).cpu().numpy()
        return {"first_token_mass": first,
                "sink": (first > EPSILON).astype(np.float64),
                "entropy": (self.entropy / T).cpu().numpy(),
                "mean_distance": (self.distance / T).cpu().numpy(),
                "previous_token_mass": (self.previous / max(T - 1, 1)).cpu().numpy(),
                "diagonal_mass": (self.diagonal / T).cpu().numpy()}

    def sink_rate(self, epsilon: float = EPSILON) -> np.ndarray:
        """Sink_1^eps per text: the share of (layer, head) whose first-token mass exceeds eps."""
        return ((self.first / self.length) > epsilon).double().mean((1, 2)).cpu().numpy()

    def distance_histogram(self) -> np.ndarray:
        """[L, H, bins]: mean over texts and queries of the weight in each distance bin."""
        return (self.histogram / (self.texts * self.length)).cpu().numpy()

    def frequency_usage(self) -> tuple[np.ndarray, np.ndarray] | None:
        """([L, H, pairs] query norms, [L, H_kv, pairs] key norms), means over tokens."""
        if any(x is None for x in self.q_norm):
            return None
        tokens = self.texts * self.length
        return (torch.stack(self.q_norm).cpu().numpy() / tokens,
                torch.stack(self.k_norm).cpu().numpy() / tokens)

    def positional_vectors(self) -> np.ndarray:
        """[L+1, T, d]: the per-position mean over texts minus its mean over positions."""
        mean = self.hidden_sum.double() / self.texts
        return (mean - mean.mean(1, keepdim=True)).cpu().numpy()


def _range_mass(c: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, keys: int) -> torch.Tensor:
    """sum of p over keys [lo_r, hi_r) per row r, from c = [0, cumsum(p)] ([b, h, rows, keys+1])."""
    lo, hi = lo.clamp(0, keys), hi.clamp(0, keys)
    hi = torch.maximum(hi, lo)
    idx = torch.stack([lo, hi], -1).expand(*c.shape[:2], -1, 2)  # [b, h, rows, 2]
    got = c.gather(-1, idx)
    return got[..., 1] - got[..., 0]


# --- the capture --------------------------------------------------------------------------

_ACTIVE: list[Stats] = []  # the Stats the wrapper feeds (one at a time)
_LAYER_OF: dict[int, int] = {}  # id(attention module) -> layer index


def _own_eager(module):
    """The eager attention function of the module's modelling file (transformers' own)."""
    fn = getattr(importlib.import_module(type(module).__module__), "eager_attention_forward", None)
    if fn is None:
        raise ModelError(f"{type(module).__name__} has no eager_attention_forward to compute "
                         "attention weights with")
    return fn


def stats_attention_forward(module, query, key, value, attention_mask, *args, inner: str,
                            causal: bool, pairs: int, **kwargs):
    """The AttentionInterface signature: `inner` computed block by block, weights to Stats."""
    from transformers import AttentionInterface

    stats = _ACTIVE[-1]
    layer = _LAYER_OF[id(module)]
    fn = AttentionInterface()[inner] if inner.startswith("pecli_") else _own_eager(module)
    if pairs:
        stats.add_qk(layer, query, key, pairs)
    T = query.shape[2]
    outs = []
    for s in range(0, T, stats.block):
        e = min(s + stats.block, T)
        stop = e if causal else key.shape[2]
        mask = None if attention_mask is None else attention_mask[:, :, s:e, :stop]
        out, p = fn(module, query[:, :, s:e], key[:, :, :stop], value[:, :, :stop], mask,
                    *args, **kwargs)
        stats.add(layer, s, p)
        outs.append(out)
        del p
    return torch.cat(outs, dim=1), None


def _registered(inner: str, causal: bool, pairs: int) -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    name = f"pecli_stats_{'causal' if causal else 'bidirectional'}_{pairs}__{inner}"
    if name not in AttentionInterface():
        AttentionInterface.register(name, functools.partial(
            stats_attention_forward, inner=inner, causal=causal, pairs=pairs))
        factory = AttentionMaskInterface()[inner] if inner.startswith("pecli_") else eager_mask
        AttentionMaskInterface.register(name, factory)
    return name


def rotary_pairs(loaded) -> tuple[int, np.ndarray | None]:
    """(rotated pairs per head, their frequencies in radians per token) of a rotary model
    whose rotation reaches the registry (not GPT-J's tables); (0, None) otherwise."""
    spec = loaded.spec
    if not spec.rotates or spec.rotary is None or spec.sincos:
        return 0, None
    module = resolve(loaded.model, spec, spec.rotary)
    inv = getattr(module, "inv_freq", None)
    if inv is None:  # ModernBERT: one table per layer type; the global layers' stands for all
        inv = getattr(module, "full_attention_inv_freq", None)
        if inv is None:
            inv = next((b for n, b in module.named_buffers() if n.endswith("inv_freq")), None)
    if inv is None:
        return 0, None
    return int(inv.numel()), inv.detach().double().cpu().numpy()


def _layer_modules(loaded) -> list[torch.nn.Module]:
    return list(resolve(loaded.model, loaded.spec, loaded.spec.layers))


def literal_route(loaded) -> bool:
    """Whether this model's attention is its own code (no registry): output_attentions then."""
    return loaded.spec.own_attention or not getattr(loaded.model, "_supports_attention_backend", False)


@contextmanager
def capture(loaded, stats: Stats, hidden: bool = True) -> Iterator[None]:
    """Inside the block, every forward of `loaded.model` feeds `stats` (attention through the
    registry wrapper; hidden states through hooks on the blocks); the model's attention
    implementation and hooks are restored on exit. Enter it inside the condition (an
    intervention, a mask, a rope scaling) so that it wraps what the condition runs."""
    model = loaded.model
    blocks = _layer_modules(loaded)
    handles = []
    if hidden:
        total = len(blocks) + 1

        def pre(_module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            stats.add_hidden(0, h, total)

        handles.append(blocks[0].register_forward_pre_hook(pre, with_kwargs=True))
        for i, block in enumerate(blocks):
            def post(_module, _args, out, i=i):
                stats.add_hidden(i + 1, out[0] if isinstance(out, tuple) else out, total)
            handles.append(block.register_forward_hook(post))
    old = model.config._attn_implementation
    if literal_route(loaded):
        if old != "eager":  # output_attentions needs the eager path (T5 runs sdpa by default)
            model.set_attn_implementation("eager")
    else:
        for i, block in enumerate(blocks):
            for sub in block.modules():
                _LAYER_OF[id(sub)] = i
        pairs, _ = rotary_pairs(loaded)
        model.set_attn_implementation(_registered(old, loaded.spec.causal, pairs))
    _ACTIVE.append(stats)
    try:
        yield
    finally:
        _ACTIVE.pop()
        for hnd in handles:
            hnd.remove()
        if model.config._attn_implementation != old:
            model.set_attn_implementation(old)


def run_batch(loaded, stats: Stats, input_ids: torch.Tensor) -> None:
    """One forward of texts stats.offset.. (input_ids [b, T], no padding) under `capture`."""
    kwargs = {"input_ids": input_ids.to(loaded.device),
              "attention_mask": torch.ones_like(input_ids, device=loaded.device)}
    base = getattr(loaded.model, "base_model", loaded.model)
    if literal_route(loaded):
        out = base(**kwargs, output_attentions=True)
        for layer, p in enumerate(out.attentions):
            stats.add(layer, 0, p)
    else:
        base(**kwargs)


def hidden_size_of(loaded) -> int:
    return _config_int(loaded, ("hidden_size", "d_model", "n_embd", "dim"), "hidden size")


def heads_of(loaded) -> int:
    return _config_int(loaded, ("num_attention_heads", "n_head", "num_heads", "n_heads"),
                       "number of attention heads")


def _config_int(loaded, keys: tuple[str, ...], what: str) -> int:
    """The first of `keys` the model's config gives as an int (families spell it differently)."""
    for key in keys:
        if isinstance(getattr(loaded.model.config, key, None), int):
            return getattr(loaded.model.config, key)
    raise ModelError(f"{loaded.name}: its config gives no {what}")


def log_bins(values: np.ndarray) -> np.ndarray:  # pragma: no cover - small helper for plots
    return np.log2(np.maximum(values, 1))


def nearest_inside_cosine(vectors: np.ndarray, context: int) -> np.ndarray:
    """For each position t >= context of vectors [T, d], the largest cosine with a vector at a
    position < context (Dong et al.'s comparison past the context)."""
    v = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-30)
    inside, past = v[:context], v[context:]
    if not len(past):
        return np.empty(0)
    return (past @ inside.T).max(-1)


def principal_components(vectors: np.ndarray, k: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(scores [T, k], explained variance ratios [k]) of vectors [T, d] (already centred)."""
    u, s, _ = np.linalg.svd(vectors - vectors.mean(0), full_matrices=False)
    var = s ** 2
    k = min(k, len(s))
    return u[:, :k] * s[:k], var[:k] / max(var.sum(), 1e-300)


def entropy_ceiling(length: int, causal: bool) -> np.ndarray:
    """log of the keys each query sees: the entropy of uniform attention, per position."""
    return np.log(np.arange(1, length + 1)) if causal else np.full(length, math.log(length))
