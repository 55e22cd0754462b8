"""Graded attention masks (study E3): mask shapes, what a non-binary mask means, and an
attention function that applies them inside every attention layer.

A mask *shape* gives a weight m(q, k) in [0, 1] for query q and each key k it may see.
Shapes are written in terms of the distance d = |q - k| (0 at the newest key of a causal
row) and the span D of the row (the largest distance it sees: q - 1 for a causal row), with
positions counted over real tokens only, so left and right padding give the same weights.

A mask *semantics* says what a weight does to attention:
    legacy    logits + (1 - m) * finfo(dtype).min       transformers 4.x with a float mask
    boolean   key visible iff m != 0                     transformers 5.x with a float mask
    log-bias  logits + log m  (softmax renormalises)     a soft reweighting, ALiBi's kin
    scale     softmax(logits) * m, not renormalised      the "mask multiplies" intuition

The names, what they mean and the facts a computation plan reads (a shape `positive` on
every key, one that `rises_to_newest`) are pecli.runs.names.MASKS and MASK_SEMANTICS; this module
keys the functions that compute them by those names (WEIGHTS, PROBS), as
pecli.positions.interventions does; tests/unit/test_names.py checks the two agree.

The attention function (pecli.models.attention, the engine this module's shapes and
semantics run in; pecli-trained ALiBi checkpoints load through it too) is registered through
transformers' own `AttentionInterface` (and its mask factory through `AttentionMaskInterface`, so the model hands it the plain boolean
causal-and-padding mask), under one name per (shape, semantics, mode). `masked_attention`
switches a model to it and back. Two modes:
    relative  each query row weighs its keys by m(q, k) over its own prefix
    keys      every row of a sequence uses the weights of its last real token, m(n, k):
              what one 1-D attention mask does (the study's per-prefix protocol)
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from pecli.models.attention import (  # noqa: F401  (PROBS, alibi_slopes, mask_geometry: as before)
    PROBS,
    Weights,
    alibi_slopes,
    alibi_weights,
    attention_key,
    mask_geometry,
    registered,
)
from pecli.runs.errors import ConfigError, ModelError
from pecli.runs.names import HASH_MARK, MASK_FILE, MASK_FILE_FORMAT, mask_file

OLDEST_WEIGHT = 0.1  # the study's linear mask falls to 0.1 at the oldest key
MODES = ("relative", "keys")

# --- shapes ------------------------------------------------------------------------------


def _fraction(dist: torch.Tensor, span: torch.Tensor) -> torch.Tensor:
    # d / D, with 0 for a row that sees one key (q = 1 gets weight 1).
    return torch.where(span > 0, dist / span.clamp(min=1), torch.zeros_like(dist))


WEIGHTS: dict[str, Weights] = {
    "default": lambda d, s, h: torch.ones_like(d),
    "linear": lambda d, s, h: 1 - (1 - OLDEST_WEIGHT) * _fraction(d, s),
    "exponential": lambda d, s, h: OLDEST_WEIGHT ** _fraction(d, s),
    "alibi": alibi_weights,
    "self": lambda d, s, h: (d == 0).to(d.dtype),
}


def attention_name(mask: str, semantics: str, mode: str = "relative") -> str:
    """Register (once) and return the attention implementation name for this combination.

    `mask` and `semantics` are names of pecli.runs.names.MASKS and MASK_SEMANTICS, already checked
    (an options object or lm_scoring.plan parsed them), or a fitted mask's `file:PATH#sha256:D`
    (pecli.runs.names.mask_file); `mode` is one of MODES.
    """
    if mask.startswith(f"{MASK_FILE.name}:"):
        fitted = load_fitted(mask)
        return registered(f"pecli_file-{fitted.digest}_{semantics}_{mode}", fitted.weights,
                           semantics, mode)
    return registered(attention_key(mask, semantics, mode), WEIGHTS[mask], semantics, mode)


def check_maskable(ref) -> None:
    """A ModelError unless masks can act on `ref`'s attention (a LoadedModel or, before any
    weights load, a pecli.models.sources.ModelRef): pecli installs them in transformers'
    attention registry, which a family with its own attention code never calls."""
    model = getattr(ref, "model", None)
    own = ref.spec.own_attention or (
        model is not None and not getattr(model, "_supports_attention_backend", False))
    if own:
        raise ModelError(
            f"masks do not apply to {ref.name} ({ref.spec.family}): its attention is its own "
            "code, outside transformers' attention registry where pecli installs masks; drop "
            "--mask (and --mask-semantics), or see `pecli models` for the families that take them")


@contextmanager
def masked_attention(model, mask: str, semantics: str, mode: str = "relative") -> Iterator[str]:
    """Run `model` with (mask, semantics, mode) in every attention layer; always restore.
    Entered again inside itself, it changes nothing.

    Yields the attention implementation name in use.
    """
    with _installed(model, lambda: attention_name(mask, semantics, mode)) as name:
        yield name


@contextmanager
def live_attention(model, weights: Weights, semantics: str, mode: str = "relative"
                   ) -> Iterator[str]:
    """Like masked_attention, with weights computed by `weights` on every call (a mask being
    fitted: its parameters change between calls, and gradients flow through them)."""
    name = f"pecli_live_{id(weights)}_{semantics}_{mode}"
    with _installed(model, lambda: registered(name, weights, semantics, mode)) as installed:
        yield installed


@contextmanager
def _installed(model, register: Callable[[], str]) -> Iterator[str]:
    if not getattr(model, "_supports_attention_backend", False):  # it would run unmasked
        raise ModelError(f"masks do not apply to a {type(model).__name__}: its attention is its "
                         "own code, outside transformers' attention registry")
    name = register()
    old = model.config._attn_implementation
    if old.startswith("pecli_remedy"):  # pecli.positions.remedies: it would be replaced, unrotated
        raise ModelError("a mask cannot be installed under a remedy (sinks, lminfinite, "
                         "selfextend, rerope): both replace the attention function")
    if old == name:  # already installed (a condition's whole stack, then its scoring): as is
        yield name
        return
    model.set_attn_implementation(name)
    try:
        yield name
    finally:
        model.set_attn_implementation(old)


def key_weights(mask: str, q: int, heads: int = 1) -> torch.Tensor:
    """m(q, k) for k = 1..q of a causal row q (1-based), as [heads, q]: for display and tests."""
    dist = torch.arange(q - 1, -1, -1, dtype=torch.float32).view(1, 1, 1, q)
    span = torch.full((1, 1, 1, 1), float(q - 1))
    return WEIGHTS[mask](dist, span, heads).expand(1, heads, 1, q)[0, :, 0]


# --- fitted masks (pecli mask fit): a few parameters, saved as a file --------------------

LOG_FLOOR = -80.0  # a fitted bias below this is clamped: exp(-80) ~ 2e-35 stays a normal fp32


def bucket_edges(max_distance: int) -> tuple[int, ...]:
    """Lower edges of the distance buckets up to `max_distance`: 0, 1, 2, 3, 4, 6, 8, 12, 16,
    24, ... (each power of two and its midpoint); the last bucket is open-ended."""
    edges, e = [0, 1, 2, 3], 4
    while e <= max_distance:
        edges.append(e)
        if e + e // 2 <= max_distance:
            edges.append(e + e // 2)
        e *= 2
    return tuple(x for x in edges if x <= max(max_distance, 0))


def form_bias(form: str, values: torch.Tensor, dist: torch.Tensor, span: torch.Tensor,
              edges: tuple[int, ...] = ()) -> torch.Tensor:
    """The additive logit bias log m(q, k) of a fitted form (pecli.runs.names.MASK_FORMS).

    values [rows, n] (rows: 1 = shared, or one per head): bucket biases, slopes s >= 0, or
    oldest weights a in (0, 1); dist, span as mask_geometry gives them ([b,1,q,k], [b,1,q,1]).
    Returns [b, rows, q, k], at most 0 for every key (weights m <= 1), clamped at LOG_FLOOR.
    """
    rows = values.shape[0]
    if form in ("bucket", "bucket-head"):
        ends = torch.tensor(edges, dtype=dist.dtype, device=dist.device)
        idx = torch.bucketize(dist, ends, right=True) - 1  # [b,1,q,k]
        top = values - values.amax(dim=1, keepdim=True)  # [rows, n]: the largest weight is 1
        bias = top[:, idx[:, 0]].transpose(0, 1)  # [b, rows, q, k]
    elif form == "slope":
        bias = -values.view(1, rows, 1, 1) * dist  # ALiBi: -s_h * d
    elif form == "linear":
        oldest = values.view(1, rows, 1, 1)
        bias = torch.log1p(-(1 - oldest) * _fraction(dist, span))  # log(1 - (1 - a) d / D)
    else:
        raise ConfigError(f"unknown mask form {form!r}")
    return bias.clamp(min=LOG_FLOOR)


@dataclasses.dataclass(frozen=True)
class FittedMask:
    """A mask `pecli mask fit` fitted: its form, values and buckets, and what it was fitted on.

    As a mask shape its weights are m = exp(form_bias) in (0, 1] (log-bias: exactly the bias).
    """

    form: str
    values: tuple[tuple[float, ...], ...]  # [rows, n]: rows 1 (shared) or one per head
    heads: int  # the heads of the model it was fitted on
    edges: tuple[int, ...] = ()
    fitted: dict = dataclasses.field(default_factory=dict, compare=False)
    digest: str = ""  # 16 hex digits of the file's sha256 (set when read from a file)

    @property
    def parameters(self) -> int:
        return sum(len(r) for r in self.values)

    def tensor(self) -> torch.Tensor:
        return torch.tensor(self.values, dtype=torch.float32)

    def weights(self, dist: torch.Tensor, span: torch.Tensor, heads: int) -> torch.Tensor:
        rows = len(self.values)
        if rows not in (1, heads):
            raise ModelError(f"this mask was fitted per head for {rows} heads; the model has "
                             f"{heads}: fit it on this model")
        return torch.exp(form_bias(self.form, self.tensor().to(dist.device), dist, span, self.edges))

    def to_json(self) -> dict:
        return {"format": MASK_FILE_FORMAT, "form": self.form, "semantics": "log-bias",
                "heads": self.heads, "parameters": self.parameters, "edges": list(self.edges),
                "values": [list(r) for r in self.values], "fitted": self.fitted}

    def save(self, path) -> str:
        """Write the JSON file; returns its name as a mask (`file:PATH#sha256:D`)."""
        text = json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return str(mask_file(str(path)))


def load_fitted(name: str) -> FittedMask:
    """The FittedMask a mask name `file:PATH#sha256:D` (or a path) names, checked and cached."""
    choice = mask_file(name)  # checks the file and its digest
    path, _, digest = choice.argument.partition(HASH_MARK)
    return _read_fitted(path, digest)


@functools.cache
def _read_fitted(path: str, digest: str) -> FittedMask:
    raw = json.loads(open(path, encoding="utf-8").read())  # noqa: SIM115
    try:
        return FittedMask(raw["form"], tuple(tuple(float(v) for v in r) for r in raw["values"]),
                          int(raw["heads"]), tuple(int(e) for e in raw.get("edges", [])),
                          raw.get("fitted", {}), digest)
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"mask file {path!r} is damaged ({type(err).__name__}: {err}); fit it "
                          "again") from None
