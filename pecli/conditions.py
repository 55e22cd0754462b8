"""pecli's conditions on your own model, in your own loop (docs/api.md).

    import pecli.conditions as pc

    with pc.applied(model, "selfextend:4:1024"):           # any transformers model pecli supports
        out = model.generate(**inputs, max_new_tokens=20)   # the KV cache works under a remedy
    with pc.applied(model, pc.build("rerope", window=1024)):
        loss = model(**inputs, labels=inputs["input_ids"]).loss

- `parse(text)`: a condition from the text `--intervention` takes (`selfextend:4:1024`,
  `zero@even`), optionally with a rope scaling (`rope="yarn:2"`), a mask and its semantics;
  the one parser the command line uses (pecli.runs.names), giving the one value the commands
  use (pecli.positions.conditions.Condition).
- `build(name, *args, **params)`: the same from typed arguments (`build("selfextend",
  group=4, window=1024)`; a remedy's parameter names are its entry's in
  pecli.positions.remedies.METHODS), written as text and parsed by `parse`.
- `applied(model, condition)`: the model under the condition for the block, through
  `Condition.applied`, the path every command takes; checked first (a one-line error where it
  has no meaning, before anything changes); on exit the model is exactly as it was (weights,
  buffers, hooks, its attention implementation, transformers' attention registries).

`model` is a transformers model (its config's model_type picks pecli's ArchSpec) or a
pecli LoadedModel (`pecli.models.loading.load_model`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pecli.positions.conditions import Condition, plan
from pecli.runs.errors import InterventionError

__all__ = ["Condition", "applied", "build", "loaded_of", "parse"]


def parse(text: str, *, rope: str | None = None, mask: str = "default",
          mask_semantics: str = "legacy", protocol: str = "relative") -> Condition:
    """The condition `text` names (an intervention, as `--intervention` takes it), with an
    optional rope scaling (as `--rope-scaling` takes one item) and mask."""
    from pecli.positions.rope_scaling import Rope

    return plan(mask, mask_semantics, protocol, intervention=text,
                rope=Rope.parse(rope) if rope else None)


def build(name: str, *args, layers: str | None = None, rope: str | None = None, **params) -> Condition:
    """A condition from typed arguments: positional ones in the name's order (`build("shift",
    3)`), or a remedy's parameters by name (`build("selfextend", group=4, window=1024)`);
    `layers` restricts it (`@LAYERS`). Written as the text `parse` reads."""
    values = list(args)
    if params:
        from pecli.positions.remedies import METHODS

        method = METHODS.get(name)
        if method is None:
            raise InterventionError(f"{name} takes no named parameters; give its argument "
                                    "positionally, e.g. build('shift', 3)")
        known = [p.name for p in method.params]
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise InterventionError(f"{name} has no parameter {', '.join(unknown)}; its "
                                    f"parameters: {', '.join(known)}")
        given = dict(zip(known, values, strict=False)) | params
        values = []
        for key in known:  # in the entry's order, up to the first left out
            if key not in given:
                break
            values.append(given.pop(key))
        if given:
            raise InterventionError(f"{name}: give {known[len(values)]} too (its parameters, in "
                                    f"order: {', '.join(known)})")
    text = ":".join([name, *(f"{v:g}" if isinstance(v, float) else str(v) for v in values)])
    return parse(text + (f"@{layers}" if layers else ""), rope=rope)


def loaded_of(model):
    """A pecli LoadedModel for `model` (one already is); a transformers model pecli does not
    support is a one-line ModelError."""
    if hasattr(model, "spec") and hasattr(model, "model"):
        return model
    import torch

    from pecli.models.architectures import spec_for_model_type
    from pecli.models.loading import LoadedModel

    config = model.config
    spec = spec_for_model_type(getattr(config, "model_type", "unknown"))
    name = getattr(config, "_name_or_path", "") or spec.family
    first = next(model.parameters())
    return LoadedModel(model, None, spec, name, name, "user", "", first.device, first.dtype
                       if first.is_floating_point() else torch.float32)


@contextmanager
def applied(model, condition: str | Condition, *, seed: int = 0) -> Iterator[object]:
    """`model` under `condition` (a Condition or its text) inside the block; yields pecli's
    LoadedModel of it. Checked before anything changes; restored exactly on exit."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    loaded = loaded_of(model)
    c = parse(condition) if isinstance(condition, str) else condition
    c.check(loaded)
    # pecli registers its attention functions once per process; leave the registries as found
    registries = [(r, dict(r._global_mapping)) for r in (AttentionInterface, AttentionMaskInterface)]
    try:
        with c.applied(loaded, seed):
            yield loaded
    finally:
        for registry, before in registries:
            registry._global_mapping.clear()
            registry._global_mapping.update(before)
