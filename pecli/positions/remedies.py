"""Stretching position without training: attention sinks, LM-Infinite, Self-Extend, ReRoPE,
rotary frequency bands and per-layer surgery (docs/remedies.md).

In a rotary model a logit depends only on the distance assigned to a (query, key) pair. Each
remedy keeps the ordinary distance d = i - j for near pairs (d < W) and assigns far pairs
(d >= W) a distance of its own, by rotating the query at a far position fq(i) and the key at
fk(j); the two score sets are merged before one softmax:

    method               far pairs visible             fq(i)                      fk(j)
    sinks:K:W            j < K (the first K tokens)     min(i, K+W-1)              j
    lminfinite:K:W[:D]   j < K                          D (default W)              0
    selfextend:G:W       every j <= i - W               i // G + W - W / G         j // G
    rerope:W[:k]         every j <= i - W               W  (leaky: i/k + W - W/k)   0  (leaky: j/k)

- sinks (Xiao et al. 2023, §3.2): a rolling cache of K+W keys; positions are those inside the
  cache, contiguous from 0, the query at the last slot: a recent key keeps its distance i - j,
  a sink's is K+W-1-j once the cache is full (i >= K+W-1), i - j before. A cached token's
  keys are those computed when it was processed: in one causal pass, token j's hidden states
  already saw exactly its own cache, so one pass equals the streaming decode.
- lminfinite (Han et al. 2024): the same Λ-shaped mask; a start token outside the window is
  scored at distance D (their code: the query rotated at D, the key unrotated).
- selfextend (Jin et al. 2024): datamllab/LongLM's prefill: neighbour iff i - j < W; grouped
  query position i // G + W - W / G (true division, as their code; W divisible by G makes the
  regions meet exactly), key position j // G.
- rerope (Su 2023, bojone/rerope): near iff d < W; far: the query at W, the key unrotated;
  leaky: the query at (i + W(k-1)) / k, the key at j / k (their linear-scaled second rotary).

How: the model's attention is set to `remedy` (transformers' AttentionInterface); a forward
pre-hook on each chosen attention module hands it the identity rotation (cos 1, sin 0), so the
function receives queries and keys *before* rotation and rotates them itself, at any position,
through the model's own rotary module (its frequencies, rope scaling and attention factor
included). Queries go in blocks; a block's near keys and far keys (only the K sinks for the
windowed methods: memory and work linear in K + W + block) are attended by a fused kernel
that also returns the log-sum-exp, and merged by it: one softmax over both. Layers outside the chosen set get plain SDPA on the model's own
rotation. Where a remedy cannot change any pair at this length (sinks with K+W >= the
sequence, W >= the sequence, Self-Extend with G = 1) the function is exactly the plain one.

Frequency bands (`droplow:F`, `drophigh:F`): the rotary module's cos/sin are set to no
rotation (cos = the attention factor, sin = 0) on the lowest / highest fraction F of the
frequency pairs (Barbero et al. 2024's p-RoPE keeps the highest 1-F). Per-layer surgery
(`X@LAYERS`): X acts in every attention, then the attention modules outside LAYERS get the
model's own rotation back (pecli.positions.interventions).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from pecli.models.architectures import resolve
from pecli.runs.errors import InterventionError, ModelError

ATTENTION = "pecli_remedy"  # the name registered in transformers' AttentionInterface
MASK_BUDGET = 1 << 22  # (query, key) pairs per query block: a 16 MB mask in fp32
WINDOWED = ("sinks", "lminfinite")


@dataclass(frozen=True)
class Remedy:
    """One remedy's parameters (see the module docstring for what each does)."""

    method: str
    window: int  # W: near pairs are d < W
    sinks: int = 0  # K (sinks, lminfinite)
    group: int = 1  # G (selfextend)
    cap: float = 0.0  # D (lminfinite)
    leak: float = 1.0  # k (rerope; 1 = plain ReRoPE)

    @classmethod
    def of(cls, name: str, argument: str) -> Remedy:
        """From a parsed intervention name and its (checked) argument."""
        parts = argument.split(":")
        if name in WINDOWED:
            k, w = int(parts[0]), int(parts[1])
            cap = float(parts[2]) if len(parts) > 2 else float(w)
            return cls(name, w, sinks=k, cap=cap)
        if name == "selfextend":
            return cls(name, int(parts[1]), group=int(parts[0]))
        if name == "rerope":
            return cls(name, int(parts[0]), leak=float(parts[1]) if len(parts) > 1 else 1.0)
        raise AssertionError(name)

    @property
    def windowed(self) -> bool:
        return self.method in WINDOWED

    def changes_nothing(self, length: int) -> bool:
        """Whether, on sequences of `length` tokens, every pair keeps its distance and is seen."""
        if self.method == "sinks":
            return self.sinks + self.window >= length
        if self.method == "selfextend" and self.group == 1:
            return True  # i + W - W - j: the ordinary distance everywhere
        return self.window >= length  # no pair at d >= W

    def far_query(self, pos: torch.Tensor) -> torch.Tensor:
        """fq(i) for query positions `pos` (integers)."""
        w = self.window
        if self.method == "sinks":
            return pos.clamp(max=self.sinks + w - 1)
        if self.method == "lminfinite":
            return torch.full_like(pos, self.cap, dtype=torch.float32)
        if self.method == "selfextend":
            return torch.div(pos, self.group, rounding_mode="floor") + (w - w / self.group)
        if self.leak == 1.0:
            return torch.full_like(pos, w)
        return pos / self.leak + (w - w / self.leak)

    def far_key(self, pos: torch.Tensor) -> torch.Tensor:
        """fk(j) for key positions `pos`."""
        if self.method == "sinks":
            return pos
        if self.method == "selfextend":
            return torch.div(pos, self.group, rounding_mode="floor")
        if self.method == "rerope" and self.leak != 1.0:
            return pos / self.leak
        return torch.zeros_like(pos)

    def far_visible(self, key_pos: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
        """Which pairs at distance `dist` >= 0 are seen through the far scores."""
        far = dist >= self.window
        return far & (key_pos < self.sinks) if self.windowed else far


# --- rotation, as the model's own apply_rotary_pos_emb computes it ------------------------


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, h, t, d] rotated by cos/sin [b, t, r] on its first r dims (partial rotary keeps the
    rest), with the model's operations in the model's order (Llama, GPT-NeoX, Phi)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return (x * cos) + (_rotate_half(x) * sin)
    turned, kept = x[..., :r], x[..., r:]
    return torch.cat(((turned * cos) + (_rotate_half(turned) * sin), kept), dim=-1)


def _cos_sin(rotary, like: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary module's cos/sin at `pos` [b, t] (any real positions), without its hooks."""
    return rotary.forward(like, pos)


# --- the attention function ---------------------------------------------------------------


def _positions(attention_mask, b: int, k_len: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Key positions [b, k] counting real tokens (as pecli and generate give position ids) and
    the real-key mask [b, k] (None: every key is real)."""
    if attention_mask is None:
        return torch.arange(k_len, device=device).expand(b, k_len), None
    real = attention_mask.bool()[:, -k_len:]
    return (real.long().cumsum(-1) - 1).clamp(min=0), real


def _plain(module, query, key, value, real, scaling, dropout):
    """transformers' SDPA attention on already-rotated queries and keys (causal, padding)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mask = None
    if real is not None and not bool(real.all()):
        q_len, k_len = query.shape[2], key.shape[2]
        causal = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(k_len - q_len)
        mask = causal & real[:, None, None, :]  # [b, 1, q, k]
        # a padding query still sees itself: no empty row, no NaN to multiply by zero later
        qi = torch.arange(k_len - q_len, k_len, device=query.device)
        mask = mask | (qi[:, None] == torch.arange(k_len, device=query.device)[None, :])
    return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling)


def remedy_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The AttentionInterface function: query [b, h, q, d], key/value [b, h_kv, k, d] (unrotated
    in a remedied layer); returns (output [b, q, h, d], None)."""
    state = getattr(module, "pecli_remedy", None)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    b, _, q_len, _ = query.shape
    k_len = key.shape[2]
    key_pos, real = _positions(attention_mask, b, k_len, query.device)
    if state is None:  # a layer outside the chosen set: its own rotation was applied
        return _plain(module, query, key, value, real, scaling, dropout)
    remedy, rotary = state
    cos, sin = _cos_sin(rotary, value, key_pos)
    k_near = rotate(key, cos, sin)
    q_near = rotate(query, cos[:, k_len - q_len:], sin[:, k_len - q_len:])
    if remedy.changes_nothing(int(key_pos.max()) + 1) and not state_literal(module):
        return _plain(module, q_near, k_near, value, real, scaling, dropout)
    return blocked(module, remedy, rotary, query, key, value, q_near, k_near, key_pos, real, scaling), None


def state_literal(module) -> bool:
    """Tests set `pecli_remedy_literal` on a module to skip the exact shortcut."""
    return bool(getattr(module, "pecli_remedy_literal", False))


def _attend(q, k, v, bias, scaling) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of q [b, h, B, d] over k/v [b, h, n, d] with an additive `bias`
    ([B, n] or [b, 1, B, n], 0 or -inf; None: every pair): (output [b, h, B, d], log-sum-exp
    of the scores [b, h, B], -inf on a row that sees nothing). On the CPU, ATen's fused flash
    kernel (memory linear in n); elsewhere the scores written out."""
    if q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16, torch.float16):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=bias, scale=scaling)
    else:
        scores = (q @ k.transpose(-1, -2)).float() * scaling
        if bias is not None:
            scores = scores + bias.float()
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.softmax(scores, dim=-1).nan_to_num(0.0).to(v.dtype) @ v
    lse = lse.float()
    if bias is not None:  # the kernel gives a row that sees nothing lse 0: it must weigh nothing
        lse = lse.masked_fill(~(bias > -math.inf).any(-1), -math.inf)
    return out, lse


def _merged(parts) -> torch.Tensor:
    """The softmax over the union of disjoint key sets, from each set's (output, lse)."""
    total = torch.logsumexp(torch.stack([lse for _, lse in parts]), dim=0)
    acc = None
    for out, lse in parts:
        term = out.float() * torch.exp(lse - total).nan_to_num(0.0)[..., None]
        acc = term if acc is None else acc + term
    return acc


def band_tiles(qa: int, qe: int, lo: int, hi: int | None) -> list[tuple[int, int, str]]:
    """The keys j that queries i in [qa, qe) see with lo <= i - j < hi (hi None: no upper
    edge), all indices, as tiles (start, stop, pattern): 'all' (every pair), 'causal' (column
    c <= row r) or 'anti' (c >= r), r and c counted from the tile's corner; a tile may start
    below key 0 (its first columns do not exist). Needs hi - lo >= qe - qa."""
    n = qe - qa
    tiles = [(qa - lo, qe - lo, "causal")]  # j <= i - lo, on the diagonal band
    if hi is None:
        return [(0, qa - lo, "all"), *tiles]
    return [(qa - hi + 1, qa - hi + 1 + n, "anti"), (qa - hi + 1 + n, qa - lo, "all"), *tiles]


def _tiled(q, k, v, tiles, triangles, scaling) -> list:
    """(output, lse) of each non-empty tile, cut at key 0; the triangles' biases precomputed."""
    parts = []
    rows = q.shape[2]
    for start, stop, pattern in tiles:
        if stop <= max(start, 0):
            continue
        cut = max(0, -start)
        bias = None if pattern == "all" else triangles[pattern][:rows, cut:stop - start]
        parts.append(_attend(q, k[:, :, start + cut:stop], v[:, :, start + cut:stop], bias, scaling))
    return parts


def _masked(q, k, v, keys: slice, seen, scaling) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, lse) over keys `keys` where `seen` [b, B, n]."""
    bias = torch.zeros(seen.shape, dtype=q.dtype, device=q.device).masked_fill_(~seen, -math.inf)
    return _attend(q, k[:, :, keys], v[:, :, keys], bias[:, None], scaling)


def blocked(module, remedy: Remedy, rotary, query, key, value, q_near, k_near, key_pos, real,
            scaling) -> torch.Tensor:
    """The remedy's attention, query block by query block: output [b, q, h, d]. A block's near
    keys (d < W) and far keys are attended in tiles, each by a fused kernel, and the tiles
    merged by their log-sum-exp: one softmax over all. Without padding, a pair's distance is
    its index difference, so the near band and the far region (d >= W) are full rectangles
    and two triangles, the same for every block; with padding, masks from the positions."""
    from transformers.integrations.sdpa_attention import repeat_kv

    b, h, q_len, d = query.shape
    h_kv, k_len = key.shape[1], key.shape[2]
    g = h // h_kv
    first = k_len - q_len  # key index of the first query
    q_pos = key_pos[:, first:]
    cq, sq = _cos_sin(rotary, value, remedy.far_query(q_pos))
    q_far = rotate(query, cq, sq)
    ck, sk = _cos_sin(rotary, value, remedy.far_key(key_pos))
    k_far = repeat_kv(rotate(key, ck, sk), g)  # grouped-query attention: kv head j serves j*g..
    k_near, v = repeat_kv(k_near, g), repeat_kv(value, g)
    w = remedy.window
    if real is not None and bool(real.all()):
        real = None
    tiles = real is None and w >= 2  # positions are indices: tiles; else masks from positions
    pads = 0 if real is None else int((~real).sum(-1).max())
    far_keys = min(remedy.sinks + pads, k_len) if remedy.windowed else k_len
    span = w + far_keys if remedy.windowed else k_len
    block = max(16, min(q_len, MASK_BUDGET // max(b * (span + 1), 1)))
    if tiles:
        block = min(q_len, w - 1, max(w // 2, 64))  # a near band wider than a block
        r = torch.arange(block, device=query.device)
        cut = torch.zeros(block, block, dtype=query.dtype, device=query.device)
        triangles = {"causal": cut.masked_fill(r[None] > r[:, None], -math.inf),
                     "anti": cut.masked_fill(r[None] < r[:, None], -math.inf)}
    out = torch.empty(b, h, q_len, value.shape[-1], dtype=value.dtype, device=value.device)
    idx = torch.arange(k_len, device=query.device)
    for a in range(0, q_len, block):
        e = min(a + block, q_len)
        qa, qe = first + a, first + e  # key indices of the block's queries
        qn, qf = q_near[:, :, a:e], q_far[:, :, a:e]
        if tiles:
            parts = _tiled(qn, k_near, v, band_tiles(qa, qe, 0, w), triangles, scaling)
            if not remedy.windowed:
                parts += _tiled(qf, k_far, v, band_tiles(qa, qe, w, None), triangles, scaling)
        else:
            near = slice(max(0, qa - w + 1), qe)
            dist = q_pos[:, a:e, None] - key_pos[:, None, near]  # [b, B, n]
            seen = _causal(idx, qa, qe, near, real) & (dist < w)
            parts = [_masked(qn, k_near, v, near, seen, scaling)]
            if not remedy.windowed and qe - w > 0:
                far = slice(0, qe - w)
                dist = q_pos[:, a:e, None] - key_pos[:, None, far]
                seen = _causal(idx, qa, qe, far, real) & remedy.far_visible(key_pos[:, None, far], dist)
                parts.append(_masked(qf, k_far, v, far, seen, scaling))
        if remedy.windowed and min(far_keys, qe) > 0:  # the sinks: a few keys, by mask
            far = slice(0, min(far_keys, qe))
            dist = q_pos[:, a:e, None] - key_pos[:, None, far]
            seen = _causal(idx, qa, qe, far, real) & remedy.far_visible(key_pos[:, None, far], dist)
            parts.append(_masked(qf, k_far, v, far, seen.expand(b, -1, -1), scaling))
        out[:, :, a:e] = _merged(parts).to(out.dtype)
    return out.transpose(1, 2).contiguous()


def _causal(idx, qa: int, qe: int, keys: slice, real) -> torch.Tensor:
    """[b or 1, B, n]: key index <= query index, and (with padding) a real key or the query itself."""
    qi = idx[qa:qe, None]
    seen = (idx[None, keys] <= qi)[None]
    if real is not None:
        seen = seen & (real[:, None, keys] | (idx[None, keys] == qi)[None])
    return seen


def _mask_factory(*args, attention_mask=None, **kwargs):
    """The model's 2-D padding mask as it is (or None): the function builds its own masks."""
    return attention_mask


def register() -> str:
    """Register (once) the remedy attention in transformers' registries; return its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if ATTENTION not in AttentionInterface():
        AttentionInterface.register(ATTENTION, remedy_attention)
        AttentionMaskInterface.register(ATTENTION, _mask_factory)
    return ATTENTION


# --- installing: hooks on attention modules, the attention implementation ------------------


def attention_modules(loaded) -> list[torch.nn.Module]:
    """Each block's attention module: the one that takes `position_embeddings`."""
    found = []
    for block in resolve(loaded.model, loaded.spec, loaded.spec.layers):
        for module in block.modules():
            if module is not block and "position_embeddings" in inspect.signature(module.forward).parameters:
                found.append(module)
                break
        else:
            raise ModelError(f"{loaded.name}: no attention module taking position_embeddings in "
                             f"{type(block).__name__}; remedies need a rotary decoder whose "
                             "attention transformers' registry runs (e.g. smollm2, random:llama)")
    return found


def check_supported(loaded) -> None:
    """An InterventionError unless pecli can act inside this model's attention (a LoadedModel
    or a ModelRef): a rotary module and transformers' attention registry."""
    spec = loaded.spec
    if spec.sincos or spec.own_attention or not spec.rotary:
        raise InterventionError(
            f"{loaded.name} ({spec.family}) computes its attention and rotation in its own code "
            "(outside transformers' attention registry and a rotary module): remedies, bands and "
            "per-layer surgery need a Llama- or GPT-NeoX-style rotary model (e.g. smollm2, "
            "random:llama, random:pythia)")
    model = getattr(loaded, "model", None)
    layered = loaded.rope_per_layer_type() if model is None and hasattr(loaded, "rope_per_layer_type") \
        else model is not None and not hasattr(resolve(model, spec, spec.rotary), "inv_freq")
    if layered:
        raise InterventionError(
            f"{loaded.name} ({spec.family}) has one rotation per layer type (no single inv_freq): "
            "remedies, bands and per-layer surgery need one rotary module (e.g. smollm2, "
            "random:llama, random:pythia)")


def check_causal(loaded, what: str) -> None:
    """Remedies stretch a causal LM's context: an encoder is refused (a LoadedModel or a ModelRef)."""
    if not loaded.spec.causal:
        raise InterventionError(f"{what} does not apply to {loaded.name} ({loaded.spec.family}), "
                                "an encoder: it bounds what a causal LM's tokens see of the past")


@contextmanager
def remedied(loaded, remedy: Remedy, layers: tuple[int, ...] | None = None) -> Iterator[None]:
    """`loaded.model` under `remedy` in `layers` (None: every layer) within the block."""
    check_supported(loaded)
    check_causal(loaded, remedy.method)
    model = loaded.model
    if not getattr(model, "_supports_attention_backend", False):
        raise ModelError(f"{loaded.name}: its attention is its own code; remedies need "
                         "transformers' attention registry")
    old = model.config._attn_implementation
    if old.startswith("pecli_"):
        raise ModelError(f"{loaded.name} already runs pecli's {old!r} attention (a mask or another "
                         "remedy): one condition at a time")
    rotary = resolve(model, loaded.spec, loaded.spec.rotary)  # the scaled one under rope_scaled
    modules = attention_modules(loaded)
    chosen = [m for i, m in enumerate(modules) if layers is None or i in layers]

    def identity(mod, args, kwargs):
        cos, sin = kwargs["position_embeddings"]
        return args, {**kwargs, "position_embeddings": (torch.ones_like(cos), torch.zeros_like(sin))}

    handles = [m.register_forward_pre_hook(identity, with_kwargs=True) for m in chosen]
    for m in chosen:
        m.pecli_remedy = (remedy, rotary)
    model.set_attn_implementation(register())
    try:
        yield
    finally:
        model.set_attn_implementation(old)
        for m, handle in zip(chosen, handles, strict=True):
            handle.remove()
            del m.pecli_remedy


# --- frequency bands and per-layer surgery --------------------------------------------------


def band_columns(pairs: int, which: str, fraction: float) -> torch.Tensor:
    """Indices of the frequency pairs removed: `low` the last round(F * pairs) (inv_freq falls
    with the index), `high` the first."""
    n = int(round(fraction * pairs))
    return torch.arange(pairs - n, pairs) if which == "low" else torch.arange(n)


@contextmanager
def bands_removed(loaded, which: str, fraction: float) -> Iterator[None]:
    """The rotary module's output without rotation on the chosen frequency pairs."""
    check_supported(loaded)
    rotary = resolve(loaded.model, loaded.spec, loaded.spec.rotary)
    pairs = rotary.inv_freq.shape[0]
    cols = band_columns(pairs, which, fraction)
    cols = torch.cat([cols, cols + pairs])  # cos/sin are [freqs, freqs]
    scale = float(getattr(rotary, "attention_scaling", 1.0))

    def hook(mod, args, output):
        if not len(cols):
            return output
        cos, sin = output
        cos, sin = cos.clone(), sin.clone()
        cos[..., cols] = scale
        sin[..., cols] = 0
        return cos, sin

    handle = rotary.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def only_in(loaded, layers: tuple[int, ...]) -> Iterator[None]:
    """Attention modules outside `layers` get the model's own rotation back: cos/sin from the
    rotary module's forward without hooks, at the position ids the layer is given. Enter it
    inside an intervention that changes the rotary module's output for every layer."""
    check_supported(loaded)
    rotary = resolve(loaded.model, loaded.spec, loaded.spec.rotary)
    modules = attention_modules(loaded)
    cache: dict[int, tuple] = {}

    def own(mod, args, kwargs):
        ids = kwargs.get("position_ids")
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if ids is None:
            ids = torch.arange(hidden.shape[1], device=hidden.device)[None]
        key = (id(ids), ids.shape)
        if key not in cache:
            cache.clear()
            cache[key] = (ids, rotary.forward(hidden, ids))  # ids kept: its id stays unique
        return args, {**kwargs, "position_embeddings": cache[key][1]}

    handles = [m.register_forward_pre_hook(own, with_kwargs=True)
               for i, m in enumerate(modules) if i not in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        cache.clear()
