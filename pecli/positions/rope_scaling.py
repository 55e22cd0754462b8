"""Rope scaling (`--rope-scaling`): a rotary model's frequencies stretched past its context.

transformers computes a rotary module's `inv_freq` (and yarn's attention factor) when the
module is built, so editing `config.rope_parameters` on a loaded model changes nothing.
`rope_scaled` builds fresh rotary modules from a copy of the config carrying the new
rope_parameters, puts them where the old ones were, and puts the old ones back afterwards:
the same objects, so the model is restored bit for bit. Every transformers rope type works,
since transformers' own rotary class computes the frequencies; pecli only resolves what a
user leaves out (rope_theta, and the original context: the model's max_position_embeddings).

The options parse what a user types (pecli.runs.options.rope_parameters); this module needs
the model's config.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from pecli.runs.errors import ConfigError, ModelError

# keys of the model's own rope_parameters that a scaling keeps (the base, the rotated share)
KEPT = ("rope_theta", "partial_rotary_factor")
NEEDS_ORIGINAL = ("yarn", "llama3", "longrope")  # types that read original_max_position_embeddings


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
def rope_scaled(model: torch.nn.Module, parameters: dict[str, Any] | None) -> Iterator[dict | None]:
    """Within the block, `model`'s rotary modules are built from rope_parameters scaled by
    `parameters` (None: unchanged); yields the resolved rope_parameters (for provenance).

    The new modules are transformers' own classes, built from a copy of the config, on the
    old modules' device; the model's config says the new rope_parameters during the block."""
    if parameters is None:
        yield None
        return
    config = model.config
    resolved = resolve(config, parameters)
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
    import json

    own = getattr(config, "rope_parameters", None) if resolved is None else resolved
    return {"rope_scaling": name, "rope_parameters": json.dumps(own, sort_keys=True) if own else ""}
