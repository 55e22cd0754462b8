"""Rope scaling (`--rope-scaling`): a rotary model's frequencies stretched past its context.

transformers computes a rotary module's `inv_freq` (and yarn's attention factor) when the
module is built, so editing `config.rope_parameters` on a loaded model changes nothing.
`rope_scaled` builds fresh rotary modules from a copy of the config carrying the new
rope_parameters, puts them where the old ones were, and puts the old ones back afterwards:
the same objects, so the model is restored bit for bit. Every transformers rope type works,
since transformers' own rotary class computes the frequencies; pecli only resolves what a
user leaves out (rope_theta, and the original context: the model's max_position_embeddings).

The one module of rope scaling: what a user may type and its check before loading (the
options' `RopeScaled`, `Rope`, parsed once), then what needs the model's config (`resolve`)
and the rotary modules (`rope_scaled`). It imports no torch: the options import it for
`--help`.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pecli.runs.errors import ConfigError, ModelError
from pecli.runs.fields import Options, option

if TYPE_CHECKING:
    import torch

# --- what a user types: TYPE:FACTOR or a JSON dict of transformers' rope_parameters ---------

LABEL = "rope_scaling (--rope-scaling)"

ROPE_EXAMPLE = '{"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}'
# Per type: (keys a user must give, keys a user may give), as transformers' _validate_*
# functions take them, less what pecli fills in from the model (rope_theta, the original
# context). rope_theta and partial_rotary_factor may be given to any type.
ROPE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ()),
    "yarn": (("factor",), ("original_max_position_embeddings", "attention_factor", "beta_fast",
                           "beta_slow", "mscale", "mscale_all_dim", "truncate")),
    "longrope": (("short_factor", "long_factor"), ("factor", "attention_factor",
                                                   "original_max_position_embeddings")),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor"), ("original_max_position_embeddings",)),
    "proportional": ((), ()),
}
# transformers' rope types (modeling_rope_utils.ROPE_INIT_FUNCTIONS, less "default") that pecli
# refuses, with the reason. Every type of that table is in ROPE_KEYS or here (tests/unit/
# test_rope_scaling.py); the options check a type against these two before torch is imported.
REFUSED: dict[str, str] = {}
ROPE_FACTOR_TYPES = tuple(t for t, (need, _) in ROPE_KEYS.items() if need == ("factor",))  # TYPE:FACTOR
ROPE_EXTRA_KEYS = {t: tuple(k for k in need if k != "factor")  # what TYPE:FACTOR cannot say
                   for t, (need, _) in ROPE_KEYS.items() if set(need) - {"factor"}}


def _number(v) -> bool:
    """A finite int or float (not a bool, NaN or inf)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _factors(v) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(_number(x) and x > 0 for x in v)


_POSITIVE = (lambda v: _number(v) and v > 0, "a finite positive number")
# What each key's value must be: (check, what it must be)
ROPE_VALUES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "factor": (lambda v: _number(v) and v >= 1, "a finite number of at least 1 (the stretch)"),
    "rope_theta": (lambda v: _number(v) and v > 1, "a finite number greater than 1 (the base)"),
    "partial_rotary_factor": (lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "original_max_position_embeddings": (
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a positive integer"),
    "truncate": (lambda v: isinstance(v, bool), "true or false"),
    **dict.fromkeys(("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                     "low_freq_factor", "high_freq_factor"), _POSITIVE),
    **dict.fromkeys(("short_factor", "long_factor"), (
        _factors, "a non-empty list of finite positive numbers (one per rotated frequency)")),
}


def split_rope_scalings(value) -> list[str]:
    """"yarn:2,{...}" or a list -> the items, split at commas outside JSON braces."""
    items = [value] if isinstance(value, str) else list(value or [])
    out = []
    for item in items:
        if isinstance(item, dict):
            out.append(json.dumps(item, sort_keys=True))
            continue
        depth, start, text = 0, 0, str(item)
        for i, ch in enumerate(text):
            depth += (ch in "{[") - (ch in "}]")
            if ch == "," and depth == 0:
                out.append(text[start:i].strip())
                start = i + 1
        out.append(text[start:].strip())  # the last item (or unbalanced JSON, refused later)
    return list(dict.fromkeys(s for s in out if s))


def rope_parameters(text: str) -> dict[str, Any]:
    """One --rope-scaling item -> the rope_parameters it sets (what the model's config does not
    already say: rope_theta and the original context are filled in from the model).

    `yarn:2` -> {"rope_type": "yarn", "factor": 2.0}; a JSON dict -> its rope_parameters.
    Both spellings end in `check_rope_parameters`: the same keys and values are refused
    whichever way they were written."""
    label = LABEL
    if text.startswith("{"):
        try:  # NaN, Infinity and 1e400 parse to floats that the value checks refuse
            params = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{label}: {text!r} is not valid JSON ({err.msg}); e.g. "
                              f"'{ROPE_EXAMPLE}'") from None
        if not isinstance(params, dict):
            raise ConfigError(f"{label}: {text!r} must be a JSON object of rope_parameters")
        if "type" in params and "rope_type" in params:
            raise ConfigError(f"{label}: {text!r} gives both type and rope_type; give rope_type")
        kind = params.get("rope_type", params.get("type"))
        if not isinstance(kind, str) or kind not in ROPE_KEYS:
            raise ConfigError(f"{label}: rope_type {kind!r} {_not_checked(kind)}")
        return check_rope_parameters(
            {"rope_type": kind, **{k: v for k, v in params.items() if k not in ("type", "rope_type")}})
    kind, colon, factor = text.partition(":")
    if kind in REFUSED:
        raise ConfigError(f"{label}: rope type {kind!r} {_not_checked(kind)}")
    if kind in ROPE_EXTRA_KEYS:
        raise ConfigError(f"{label}: {kind} needs {' and '.join(ROPE_EXTRA_KEYS[kind])} besides a "
                          f"factor; give a JSON dict of rope_parameters, e.g. '{ROPE_EXAMPLE}'")
    if kind in ROPE_KEYS and kind not in ROPE_FACTOR_TYPES:
        raise ConfigError(f"{label}: {kind} takes a JSON dict of rope_parameters (see "
                          "transformers' modeling_rope_utils), not TYPE:FACTOR")
    if kind not in ROPE_FACTOR_TYPES:
        close = difflib.get_close_matches(kind, list(ROPE_KEYS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{label}: unknown rope type {kind!r}{hint}; write TYPE:FACTOR with "
                          f"TYPE one of {', '.join(ROPE_FACTOR_TYPES)} (e.g. yarn:2), or a JSON "
                          "dict of rope_parameters for any type")
    if not colon or not factor.strip():
        raise ConfigError(f"{label}: {text!r} needs a factor: {kind}:FACTOR, e.g. {kind}:2")
    try:
        value: Any = float(factor)
    except ValueError:
        value = factor
    return check_rope_parameters({"rope_type": kind, "factor": value})


def _not_checked(kind) -> str:
    """Why a rope type is refused (REFUSED), or that it is not one pecli checks."""
    if kind in REFUSED:
        return f"is refused: {REFUSED[kind]}"
    return f"is not one of the rope types pecli checks (transformers' own): {', '.join(ROPE_KEYS)}"


def check_rope_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """The one check of a rope scaling's parameters, however they were spelt: the keys its
    type requires are there, no key it does not take, every value of its kind and finite
    (factor at least 1, rope_theta above 1, ...), and the pairs in order (high_freq_factor
    above low_freq_factor, beta_fast above beta_slow). What needs the model (the length of
    longrope's lists) is checked against its config (`resolve`, below)."""
    label = f"{LABEL}: {params['rope_type']}"
    required, optional = ROPE_KEYS[params["rope_type"]]
    missing = [k for k in required if k not in params]
    if missing:
        raise ConfigError(f"{label} needs {' and '.join(missing)}; e.g. '{ROPE_EXAMPLE}'")
    takes = {"rope_type", *required, *optional, "rope_theta", "partial_rotary_factor"}
    unknown = sorted(set(params) - takes)
    if unknown:
        raise ConfigError(f"{label} takes no {', '.join(unknown)}; it takes "
                          f"{', '.join(sorted(takes - {'rope_type'}))}")
    for key, value in params.items():
        if key == "rope_type":
            continue
        ok, what = ROPE_VALUES[key]
        if not ok(value):
            raise ConfigError(f"{label}: {key} {value!r} must be {what}")
    for low, high in (("low_freq_factor", "high_freq_factor"), ("beta_slow", "beta_fast")):
        if low in params and high in params and not params[high] > params[low]:
            raise ConfigError(f"{label}: {high} ({params[high]}) must be greater than {low} "
                              f"({params[low]})")
    return params


@dataclass(frozen=True)
class Rope:
    """One --rope-scaling item, parsed once: the text as typed (its name in rows and labels),
    transformers' rope type and the rope_parameters it sets (`parameters`, a dict; kept here
    as sorted JSON so that the value is frozen and hashable)."""

    text: str
    type: str
    params: str  # json.dumps(parameters, sort_keys=True)

    @classmethod
    def parse(cls, text: str) -> Rope:
        parameters = rope_parameters(text)
        return cls(text, parameters["rope_type"], json.dumps(parameters, sort_keys=True))

    @property
    def parameters(self) -> dict[str, Any]:
        return json.loads(self.params)

    def __str__(self) -> str:
        return self.text


ROPE_SCALING_ON = ("every", "intact")


@dataclass(frozen=True)
class RopeScaled(Options):
    """Options of an experiment on a causal LM that `--rope-scaling` can stretch (length,
    passkey, lm-eval): each item a condition after the unscaled model."""

    rope_scaling: tuple[Rope | str | dict, ...] | str | None = option(  # "yarn:2,dynamic:2", a list, JSON dicts
        None, flag={"type": list[str] | None, "decls": ("--rope-scaling",)},
        help="Rope scaling(s), each a condition after the unscaled model: linear:S, dynamic:S, "
             "yarn:S (original context: the model's own), or a JSON dict of rope_parameters for "
             "any transformers type, e.g. '{\"rope_type\": \"llama3\", \"factor\": 8, "
             "\"low_freq_factor\": 1, \"high_freq_factor\": 4}' (repeat or a,b; docs/length.md).")
    rope_scaling_on: str = option(
        "every", choices=ROPE_SCALING_ON, flag={"default": None},
        help="Which conditions each rope scaling is crossed with: every (default: each "
             "intervention, mask and semantics, unscaled and scaled) or intact (the unmodified "
             "model only: the scalings as baselines beside training-free remedies, "
             "docs/remedies.md).")

    def check(self) -> None:
        super().check()
        items = self.rope_scaling
        if not (isinstance(items, tuple) and all(isinstance(r, Rope) for r in items)):
            items = tuple(Rope.parse(item) for item in split_rope_scalings(items))
        object.__setattr__(self, "rope_scaling", items)
        if self.rope_scaling_on != "every" and not items:
            raise ConfigError(f"rope_scaling_on (--rope-scaling-on): {self.rope_scaling_on} says which "
                              "conditions each rope scaling is crossed with, and none is given; "
                              "add --rope-scaling (e.g. yarn:2) or drop it")

    def rope_conditions(self) -> list[tuple[str, dict[str, Any] | None]]:
        """(name, rope_parameters) per condition, the unscaled model ("none", None) first."""
        return [("none", None), *((r.text, r.parameters) for r in self.rope_scaling)]


# --- what needs the model: its config and rotary modules -----------------------------------

# keys of the model's own rope_parameters that a scaling keeps (the base, the rotated share)
KEPT = ("rope_theta", "partial_rotary_factor")
NEEDS_ORIGINAL = tuple(t for t, (_, may) in ROPE_KEYS.items()  # types that read the original context
                       if "original_max_position_embeddings" in may)


def resolve(config, parameters: dict[str, Any]) -> dict[str, Any]:
    """The full rope_parameters of `config`'s model scaled by `parameters` (a --rope-scaling
    item): the model's rope_theta (and partial_rotary_factor) kept, the original context the
    model's own max_position_embeddings, checked by transformers' own validation."""
    own = getattr(config, "rope_parameters", None)
    if not own or "rope_theta" not in own:
        raise ModelError(f"{config.model_type} has no rotary rope_parameters; --rope-scaling "
                         "applies to rotary models (e.g. smollm2, random:llama)")
    resolved = {**{k: own[k] for k in KEPT if k in own}, **parameters}
    if resolved["rope_type"] == "longrope":  # one factor per rotated frequency of a head
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        half = int(head_dim * resolved.get("partial_rotary_factor", 1.0)) // 2
        for key in ("short_factor", "long_factor"):
            if len(resolved[key]) != half:
                raise ConfigError(f"rope_scaling (--rope-scaling): longrope: {key} has "
                                  f"{len(resolved[key])} values; {config.model_type}'s heads "
                                  f"rotate {half} frequencies, one value each")
    if resolved["rope_type"] in NEEDS_ORIGINAL:
        resolved.setdefault("original_max_position_embeddings", config.max_position_embeddings)
    scaled = _config_with(config, resolved)
    try:
        scaled.validate_rope()
    except (KeyError, ValueError) as err:
        raise ConfigError(f"rope_scaling (--rope-scaling): {resolved['rope_type']}: "
                          f"{str(err).strip(chr(34) + chr(39))}") from None
    return dict(scaled.rope_parameters)


def check_scalings(config, scalings) -> None:
    """Every rope scaling of a run (rope_parameters, None: unscaled) resolved against the
    model's config: what only the config decides is refused before any condition is scored."""
    for parameters in scalings:
        if parameters is not None:
            resolve(config, parameters)


def _config_with(config, rope_parameters: dict[str, Any]):
    scaled = copy.deepcopy(config)
    scaled.rope_parameters = copy.deepcopy(rope_parameters)
    return scaled


def rotary_modules(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """(parent, attribute, module) of every rotary-embedding module: those holding `inv_freq`."""
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if "inv_freq" in dict(child.named_buffers(recurse=False)):
                found.append((parent, name, child))
    return found


@contextmanager
def rope_scaled(model: torch.nn.Module, parameters: dict[str, Any] | None, *,
                resolved: dict[str, Any] | None = None) -> Iterator[dict | None]:
    """Within the block, `model`'s rotary modules are built from rope_parameters scaled by
    `parameters` (None: unchanged); yields the resolved rope_parameters (for provenance).
    `resolved`: `resolve(model.config, parameters)` already done (a condition's check did it).

    The new modules are transformers' own classes, built from a copy of the config, on the
    old modules' device; the model's config says the new rope_parameters during the block."""
    if parameters is None:
        yield None
        return
    config = model.config
    resolved = resolved or resolve(config, parameters)
    scaled = _config_with(config, resolved)
    found = rotary_modules(model)
    if not found:
        raise ModelError(f"{config.model_type} has no rotary-embedding module (no inv_freq "
                         "buffer); --rope-scaling applies to rotary models")
    hooked = [type(old).__name__ for _, _, old in found if old._forward_hooks or old._forward_pre_hooks]
    if hooked:  # they would stay on the replaced module and silently stop acting
        raise ModelError(f"{hooked[0]} has hooks (an intervention?); enter rope_scaled before "
                         "installing them, so they act on the scaled module")
    new = {}
    for _, _, old in found:
        kwargs = {"device": old.inv_freq.device} if "device" in inspect.signature(type(old)).parameters else {}
        try:
            # the old buffers' device and dtype, as model.to(...) left them
            new[id(old)] = type(old)(scaled, **kwargs).to(device=old.inv_freq.device,
                                                           dtype=old.inv_freq.dtype)
        except TypeError as err:
            raise ModelError(f"cannot rebuild {type(old).__name__} from a config ({err}); "
                             "--rope-scaling supports rotary modules built from the config alone") from None
    own_parameters = config.rope_parameters
    try:
        for parent, name, old in found:
            setattr(parent, name, new[id(old)])
        config.rope_parameters = resolved
        yield resolved
    finally:
        for parent, name, old in found:
            setattr(parent, name, old)
        config.rope_parameters = own_parameters


def provenance(name: str, resolved: dict[str, Any] | None, config=None) -> dict[str, str]:
    """The row columns of a rope-scaling condition: its name as typed ("none" unscaled) and the
    resolved rope_parameters as JSON (unscaled: the model's own, when `config` is given)."""
    own = getattr(config, "rope_parameters", None) if resolved is None else resolved
    return {"rope_scaling": name, "rope_parameters": json.dumps(own, sort_keys=True) if own else ""}
