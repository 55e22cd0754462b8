"""Rope scaling (`--rope-scaling`): what a user may type, parsed once.

An item is TYPE:FACTOR (`yarn:2`) or a JSON dict of transformers' rope_parameters for any
type. `Rope.parse` reads its syntax and checks the values of the keys it knows (a factor at
least 1, a finite base, pairs in order); whether transformers has the type and takes the keys
is read from transformers' own table by `pecli.positions.rotary.check_type`, which the
condition's check runs before any model loads. This module imports no torch or transformers:
the options import it for `--help`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pecli.runs.errors import ConfigError
from pecli.runs.fields import Options, option

# --- what a user types: TYPE:FACTOR or a JSON dict of transformers' rope_parameters ---------

LABEL = "rope_scaling (--rope-scaling)"

ROPE_EXAMPLE = '{"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}'
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

    `yarn:2` -> {"rope_type": "yarn", "factor": 2.0}; a JSON dict -> its rope_parameters. Both
    spellings end in `check_rope_values`: the same values are refused whichever way they were
    written. The type and its keys are `rotary.check_type`'s (transformers' own table)."""
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
        if not isinstance(kind, str) or not kind.strip():
            raise ConfigError(f"{label}: {text!r} needs rope_type, a string naming one of "
                              f"transformers' rope types; e.g. '{ROPE_EXAMPLE}'")
        return check_rope_values(
            {"rope_type": kind, **{k: v for k, v in params.items() if k not in ("type", "rope_type")}})
    kind, colon, factor = text.partition(":")
    if not kind.strip():
        raise ConfigError(f"{label}: {text!r} names no rope type: write TYPE:FACTOR (e.g. yarn:2) "
                          "or a JSON dict of rope_parameters")
    if not colon or not factor.strip():
        raise ConfigError(f"{label}: {text!r} needs a factor: {kind}:FACTOR, e.g. {kind}:2 (or a "
                          "JSON dict of rope_parameters)")
    try:
        value: Any = float(factor)
    except ValueError:
        value = factor
    return check_rope_values({"rope_type": kind, "factor": value})


def check_rope_values(params: dict[str, Any]) -> dict[str, Any]:
    """The values of a rope scaling's parameters, however they were spelt: each key pecli
    knows (ROPE_VALUES) of its kind and finite (factor at least 1, rope_theta above 1, ...),
    and the pairs in order (high_freq_factor above low_freq_factor, beta_fast above
    beta_slow). Which keys a type requires or takes is transformers' (`rotary.check_type`);
    what needs the model (the length of longrope's lists), its config's (`rotary.resolve`)."""
    label = f"{LABEL}: {params['rope_type']}"
    for key, value in params.items():
        ok, what = ROPE_VALUES.get(key, (lambda _: True, ""))  # other keys: transformers checks them
        if key != "rope_type" and not ok(value):
            raise ConfigError(f"{label}: {key} {value!r} must be {what}")
    for low, high in (("low_freq_factor", "high_freq_factor"), ("beta_slow", "beta_fast")):
        if _number(params.get(low)) and _number(params.get(high)) and not params[high] > params[low]:
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

    @property
    def shorthand(self) -> bool:
        """Typed as TYPE:FACTOR, not as a JSON dict."""
        return not self.text.startswith("{")

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


def provenance(name: str, resolved: dict[str, Any] | None, config=None) -> dict[str, str]:
    """The row columns of a rope-scaling condition: its name as typed ("none" unscaled) and the
    resolved rope_parameters as JSON (unscaled: the model's own, when `config` is given)."""
    own = getattr(config, "rope_parameters", None) if resolved is None else resolved
    return {"rope_scaling": name, "rope_parameters": json.dumps(own, sort_keys=True) if own else ""}
