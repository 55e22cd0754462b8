"""A rope scaling meets transformers: its rope types and their keys, read from transformers'
own table (`rope_keys`, checked by `check_type` before any model loads), the scaling resolved
against a model's config (`resolve`, transformers' validation), and the model's rotary modules
rebuilt from it for the length of a block (`rope_scaled`).

transformers computes a rotary module's `inv_freq` (and yarn's attention factor) when the
module is built, so editing `config.rope_parameters` on a loaded model changes nothing.
`rope_scaled` builds fresh rotary modules from a copy of the config carrying the new
rope_parameters, puts them where the old ones were, and puts the old ones back afterwards:
the same objects, so the model is restored bit for bit. Every transformers rope type works,
since transformers' own rotary class computes the frequencies; pecli only resolves what a
user leaves out (rope_theta, and the original context: the model's max_position_embeddings).

What a user types is parsed, torch-free, by `pecli.positions.rope_scaling`.
"""

from __future__ import annotations

import copy
import difflib
import functools
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pecli.positions.rope_scaling import LABEL, ROPE_EXAMPLE, ROPE_VALUES, Rope
from pecli.runs.errors import ConfigError, ModelError

if TYPE_CHECKING:
    import torch

# What pecli fills in from the model, so that a user need not give it.
FILLED = ("rope_type", "rope_theta", "original_max_position_embeddings")
# transformers' rope types that pecli refuses, with the reason (none today): a type is
# refused here before its keys are read.
REFUSED: dict[str, str] = {}


class _Heard(Exception):
    """What one of transformers' `_validate_<type>_rope_parameters` asks of its keys."""


class _Listener:
    """Stands in for a config in transformers' validation: hears the key sets it checks."""

    @staticmethod
    def _check_received_keys(rope_type, received_keys, required_keys, optional_keys=None,
                             ignore_keys=None):
        raise _Heard(set(required_keys), set(optional_keys or ()))


@functools.cache
def rope_keys() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """transformers' rope types (`ROPE_INIT_FUNCTIONS`, less "default": the unscaled model),
    each with (keys a user must give, keys a user may give), as transformers' own validation
    of that type checks them, less what pecli fills in from the model (FILLED). rope_theta
    and partial_rotary_factor may be given to any type.

    A type whose validation does not name its keys (a change in transformers) is left out,
    so it is refused in one line, never applied unchecked."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin

    keys = {}
    for kind in ROPE_INIT_FUNCTIONS:
        validate = getattr(RotaryEmbeddingConfigMixin, f"_validate_{kind}_rope_parameters", None)
        if kind == "default" or kind in REFUSED or validate is None:
            continue
        try:
            validate(_Listener(), {"rope_type": kind}, ignore_keys=None)
        except _Heard as heard:
            required, optional = heard.args
            may = (optional | required | {"rope_theta", "partial_rotary_factor"}) - {"rope_type"}
            must = required - set(FILLED)
            keys[kind] = (_ordered(must), _ordered(may - must))
        except Exception:  # noqa: BLE001 -- a validation pecli cannot read: the type is left out
            continue
    return keys


def _ordered(keys: set[str]) -> tuple[str, ...]:
    """Keys in the order pecli describes them (ROPE_VALUES: low before high), then by name."""
    order = list(ROPE_VALUES)
    return tuple(sorted(keys, key=lambda k: (order.index(k) if k in order else len(order), k)))


def factor_types() -> tuple[str, ...]:
    """The types TYPE:FACTOR can say: those whose only key a user must give is the factor."""
    return tuple(t for t, (need, _) in rope_keys().items() if need == ("factor",))


def check_type(rope: Rope) -> None:
    """A parsed scaling against transformers' rope types: the type is one of them (or refused,
    REFUSED), TYPE:FACTOR only for a type whose one required key is the factor, the keys its
    type requires all given, none it does not take. Run by the condition's check before any
    model loads (`Condition.check`), one line per fault."""
    params, kind, known = rope.parameters, rope.type, rope_keys()
    if kind in REFUSED:
        raise ConfigError(f"{LABEL}: rope type {kind!r} is refused: {REFUSED[kind]}")
    if kind not in known:
        close = difflib.get_close_matches(kind, list(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if rope.shorthand:
            raise ConfigError(f"{LABEL}: unknown rope type {kind!r}{hint}; write TYPE:FACTOR with "
                              f"TYPE one of {', '.join(factor_types())} (e.g. yarn:2), or a JSON "
                              "dict of rope_parameters for any type")
        raise ConfigError(f"{LABEL}: rope_type {kind!r}{hint} is not one of transformers' rope "
                          f"types: {', '.join(known)}")
    required, optional = known[kind]
    if rope.shorthand and required != ("factor",):
        extra = [k for k in required if k != "factor"]  # what TYPE:FACTOR cannot say
        if extra:
            raise ConfigError(f"{LABEL}: {kind} needs {' and '.join(extra)} besides a factor; "
                              f"give a JSON dict of rope_parameters, e.g. '{ROPE_EXAMPLE}'")
        raise ConfigError(f"{LABEL}: {kind} takes a JSON dict of rope_parameters (see "
                          "transformers' modeling_rope_utils), not TYPE:FACTOR")
    label = f"{LABEL}: {kind}"
    missing = [k for k in required if k not in params]
    if missing:
        raise ConfigError(f"{label} needs {' and '.join(missing)}; e.g. '{ROPE_EXAMPLE}'")
    takes = {"rope_type", *required, *optional}
    unknown = sorted(set(params) - takes)
    if unknown:
        raise ConfigError(f"{label} takes no {', '.join(unknown)}; it takes "
                          f"{', '.join(sorted(takes - {'rope_type'}))}")


# --- a scaling resolved against a model's config, and applied to its rotary modules ------

# keys of the model's own rope_parameters that a scaling keeps (the base, the rotated share)
KEPT = ("rope_theta", "partial_rotary_factor")


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
    if "original_max_position_embeddings" in rope_keys()[resolved["rope_type"]][1]:  # read by the type
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
