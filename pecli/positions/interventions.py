"""Position interventions: context managers that change where position comes from, then restore.

    with intervene(loaded, "zero"):
        outputs = loaded.model(**batch)

A name is `<intervention>` or `<intervention>:<argument>` (`shift:3`, `swap:random:bert`).
Learned-absolute families (spec.position == "learned") are edited in their embedding table
(rows after `spec.pos_offset`); the original tensor is copied and put back in `finally`.
Rotary families are changed through forward hooks on the module at `spec.rotary`, removed
in `finally`. Mapping conventions shared by both kinds (N = the model's positions):

- `reverse`: position p gets what position N-1-p had;
- `shift:K`: position p gets what position p+K had (learned rows past the end repeat the
  last/first row; rotary ids just move, so only relative offsets matter);
- `shuffle`: position p gets what position perm[p] had, perm a seeded permutation of N.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from pecli.models.architectures import position_embedding, resolve
from pecli.positions.sinusoid import sinusoidal_at
from pecli.runs import names
from pecli.runs.errors import InterventionError
from pecli.runs.names import INTERVENTIONS, Choice


@dataclass(frozen=True)
class Implementation:
    """How one intervention (a name in pecli.runs.names.INTERVENTIONS) acts on each position kind."""

    learned: Callable | None  # (loaded, weight_rows[n, d], arg, seed) -> new rows[n, d]
    rotary: Callable | None  # (loaded, arg, seed) -> contextmanager installing hooks


def intervention_names() -> list[str]:
    """Names as a user types them (`shift:K`, `swap:MODEL`), for listings and help."""
    return [term.shown() for _, term in INTERVENTIONS.items()]


def parse(name: str | Choice) -> Choice:
    """`shift:3` -> Choice(<shift>, "3"); a Choice passes through (options have parsed it)."""
    return name if isinstance(name, Choice) else names.parse(INTERVENTIONS, name)


def check_applies(loaded, name: str | Choice) -> Choice:
    """The parsed intervention, or an InterventionError if it cannot act on this model's
    positions. `loaded` may be a LoadedModel or, before any weights load, a loading.ModelRef:
    then `swap:MODEL` is also checked against MODEL's config (its positions and width)."""
    from pecli.models.loading import ModelRef, peek

    choice = parse(name)
    kinds = choice.term.applies_to
    if loaded.spec.position not in kinds:
        raise InterventionError(
            f"intervention {choice.name!r} does not apply to {loaded.name} ({loaded.spec.family}, "
            f"{loaded.spec.position} positions); it needs {' or '.join(kinds)} positions"
        )
    n = getattr(loaded, "max_positions", None)  # known once weights load
    if choice.name == "shift" and loaded.spec.position == "learned" and n \
            and abs(_shift_amount(choice.argument)) >= n:
        raise InterventionError(
            f"shift:{choice.argument} reaches past all {n} learned positions of {loaded.name} "
            f"(every position would read the same clamped row); use |K| < {n}")
    if choice.name == "swap" and isinstance(loaded, ModelRef):
        donor = peek(choice.argument)
        if donor is not None:
            _check_donor(choice.argument, donor.spec.position, donor.width, loaded.name, loaded.width)
    return choice


def _check_donor(name: str, position: str, width: int | None, model: str,
                 model_width: int | None) -> None:
    """swap:NAME needs a learned-position donor of the model's width (None: not known yet)."""
    if position != "learned":
        raise InterventionError(
            f"swap:{name}: {name} has {position} positions, no embedding rows to lend; "
            "swap with a learned-position model (bert, roberta, gpt2 families)"
        )
    if width is not None and model_width is not None and width != model_width:
        raise InterventionError(
            f"swap:{name}: width {width} does not match {model}'s width {model_width}; swap "
            "with a model of the same hidden size"
        )


def intervene(loaded, name: str | Choice, seed: int = 0):
    """Apply intervention `name` to `loaded.model` inside the block; restore it exactly on exit."""
    return prepare(loaded, name, seed)()


def prepare(loaded, name: str | Choice, seed: int = 0) -> Callable[[], AbstractContextManager]:
    """Do the slow part once (new rows, a donor model); return a cheap context-manager factory.

    A loop over batches enters `prepare(...)()` per batch without recomputing anything.
    Errors (does not apply, bad argument, width mismatch) are raised here, before any change.
    """
    choice = check_applies(loaded, name)
    iv, arg = IMPLEMENTATIONS[choice.name], choice.argument
    if loaded.spec.position == "rotary":
        return lambda: iv.rotary(loaded, arg, seed)
    table = position_embedding(loaded.model, loaded.spec)
    offset = loaded.spec.pos_offset
    rows = table.weight.detach()[offset:]  # [n, d], a view on the real position rows
    new = iv.learned(loaded, rows, arg, seed)
    new = None if new is None else new.to(rows.dtype).clone()  # [n, d]

    @contextmanager
    def apply() -> Iterator[None]:
        if new is None:  # `learned`: nothing to change
            yield
            return
        saved = table.weight.detach().clone()
        try:
            with torch.no_grad():
                table.weight[offset:].copy_(new)
            yield
        finally:
            with torch.no_grad():
                table.weight.copy_(saved)

    return apply


# --- learned tables: new rows from old ---------------------------------------------


def _shift_amount(arg: str) -> int:
    return int(arg)  # checked when parsed (pecli.runs.names)


def _permutation(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=gen)  # [n]


def _index_rows(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return rows[index.to(rows.device)]  # [n, d]


def sinusoidal_table(n: int, d: int) -> torch.Tensor:
    """Vaswani et al. (2017): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...).
    [n, d] float64, pecli.positions.sinusoid's one sinusoid."""
    return torch.from_numpy(sinusoidal_at(np.arange(n), d))


def _learned_sinusoidal(loaded, rows, arg, seed):
    pe = sinusoidal_table(*rows.shape).to(rows.device)  # [n, d], row norms sqrt(d/2)
    target = rows.double().norm(dim=1).mean()
    return pe * (target / pe.norm(dim=1).mean())


def _learned_random(loaded, rows, arg, seed):
    gen = torch.Generator().manual_seed(seed)
    flat = rows.double()
    noise = torch.randn(rows.shape, generator=gen, dtype=torch.float64)  # [n, d]
    return (noise * flat.std() + flat.mean()).to(rows.device)


def load_donor(name: str, seed: int):
    """The model whose position rows `swap:NAME` borrows (monkeypatched in tests)."""
    from pecli.models.loading import load_model

    return load_model(name, device="cpu", seed=seed)


def _learned_swap(loaded, rows, arg, seed):
    donor = load_donor(arg, seed)
    _check_donor(arg, donor.spec.position, None, loaded.name, None)
    theirs = position_embedding(donor.model, donor.spec).weight.detach()[donor.spec.pos_offset:]
    _check_donor(arg, "learned", theirs.shape[1], loaded.name, rows.shape[1])
    new = torch.zeros_like(rows)  # positions the donor does not have get zero rows
    n = min(len(rows), len(theirs))
    new[:n] = theirs[:n].to(rows.device, rows.dtype)
    return new


def _learned(kind: str):
    def edit(loaded, rows, arg, seed):
        n = len(rows)
        if kind == "learned":
            return None
        if kind == "zero":
            return torch.zeros_like(rows)
        if kind == "reverse":
            return rows.flip(0)
        if kind == "shuffle":
            return _index_rows(rows, _permutation(n, seed))
        if kind == "shift":
            k = _shift_amount(arg)
            return _index_rows(rows, (torch.arange(n) + k).clamp(0, n - 1))
        raise AssertionError(kind)

    return edit


# --- rotary: hooks on the rotary-embedding module ----------------------------------


@contextmanager
def _hooks(*handles) -> Iterator[None]:
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _rotary_module(loaded):
    return resolve(loaded.model, loaded.spec, loaded.spec.rotary)


def _rotary(kind: str):
    @contextmanager
    def install(loaded, arg, seed):
        if kind == "learned":
            yield
            return
        module = _rotary_module(loaded)
        if kind == "zero":
            # Identity rotation: cos = 1, sin = 0 leaves queries and keys unrotated.
            def out_hook(mod, args, output):
                cos, sin = output  # [b, t, head_dim] each
                return torch.ones_like(cos), torch.zeros_like(sin)

            with _hooks(module.register_forward_hook(out_hook)):
                yield
            return
        n = int(loaded.max_positions)
        if kind == "reverse":
            remap = lambda ids: (n - 1) - ids  # noqa: E731
        elif kind == "shift":
            k = _shift_amount(arg)
            remap = lambda ids: ids + k  # noqa: E731
        elif kind == "shuffle":
            perm = _permutation(n, seed)

            def remap(ids):
                return perm.to(ids.device)[ids]
        else:
            raise AssertionError(kind)

        def pre_hook(mod, args, kwargs):
            # The base model calls rotary_emb(hidden, position_ids=ids[b, t]); rewrite the ids.
            if "position_ids" in kwargs:
                kwargs = {**kwargs, "position_ids": remap(kwargs["position_ids"])}
            else:
                args = (args[0], remap(args[1]), *args[2:])
            return args, kwargs

        with _hooks(module.register_forward_pre_hook(pre_hook, with_kwargs=True)):
            yield

    return install


# Keyed by the names of pecli.runs.names.INTERVENTIONS (which says what each does and where it
# applies); tests/unit/test_names.py checks the two agree.
IMPLEMENTATIONS: dict[str, Implementation] = {
    "learned": Implementation(_learned("learned"), _rotary("learned")),
    "zero": Implementation(_learned("zero"), _rotary("zero")),
    "shuffle": Implementation(_learned("shuffle"), _rotary("shuffle")),
    "reverse": Implementation(_learned("reverse"), _rotary("reverse")),
    "shift": Implementation(_learned("shift"), _rotary("shift")),
    "sinusoidal": Implementation(_learned_sinusoidal, None),
    "random": Implementation(_learned_random, None),
    "swap": Implementation(_learned_swap, None),
}
