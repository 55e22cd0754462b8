"""Position interventions: context managers that change where position comes from, then restore.

    with intervene(loaded, "zero"):
        outputs = loaded.model(**batch)

A name is `<intervention>` or `<intervention>:<argument>` (`shift:3`, `swap:random:bert`).
How each position kind (pecli.models.architectures.POSITION_KINDS) is changed:

- learned: the embedding table's storage is swapped for a copy made once in `prepare`
  with its rows (after `spec.pos_offset`) replaced; the model's own storage comes back in
  `finally`;
- relative bias: the same for the rows of T5's bias table [buckets, heads];
- rotary and partial rotary: forward hooks on the module at `spec.rotary` (its cos/sin, or
  the position ids it is given), removed in `finally`; partial rotary's cos/sin cover only
  the rotated dimensions, so `zero` leaves the others as they are;
- alibi: forward pre-hooks on every block rewrite the bias tensor it receives (keyword
  `spec.bias`), removed in `finally`.

Mapping conventions shared by the kinds (N = the model's positions):

- `reverse`: position p gets what position N-1-p had;
- `shift:K`: position p gets what position p+K had (learned rows past the end repeat the
  last/first row; rotary ids just move, so only relative offsets matter);
- `shuffle`: position p gets what position perm[p] had, perm a seeded permutation of N.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from pecli.models.architectures import (
    ALIBI,
    LEARNED,
    RELATIVE_BIAS,
    position_embedding,
    resolve,
    resolve_in,
)
from pecli.positions.sinusoid import sinusoidal_at
from pecli.runs import names
from pecli.runs.errors import InterventionError
from pecli.runs.names import INTERVENTIONS, Choice


@dataclass(frozen=True)
class Implementation:
    """How one intervention (a name in pecli.runs.names.INTERVENTIONS) acts on each position kind."""

    learned: Callable | None  # (loaded, weight_rows[n, d], arg, seed) -> new rows[n, d]
    rotary: Callable | None  # (loaded, arg, seed) -> contextmanager installing hooks
    alibi: Callable | None = None  # (bias[b*h | h, ..., k], heads, arg, seed) -> new bias
    relative: Callable | None = None  # as `learned`, on the bias table's rows [buckets, heads]


# Why a name means nothing for a kind, where more can be said than the kinds it needs.
WHY_NOT = {
    ("shift", ALIBI): "ALiBi's bias depends only on the distance between two tokens, which a "
                      "shift keeps: nothing would change",
    ("shift", RELATIVE_BIAS): "a relative bias depends only on the distance between two tokens, "
                              "which a shift keeps: nothing would change",
    ("reverse", RELATIVE_BIAS): "its buckets are distances, not positions: there is no N-1-p to "
                                "map a bucket to (shuffle permutes the buckets)",
}


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
        why = WHY_NOT.get((choice.name, loaded.spec.position))
        if why is None and LEARNED in kinds and len(kinds) == 1:
            why = "it replaces embedding rows, and these positions have none"
        raise InterventionError(
            f"intervention {choice.name!r} does not apply to {loaded.name} ({loaded.spec.family}, "
            f"{loaded.spec.position} positions): {why or 'it has no meaning there'}; it applies "
            f"to {', '.join(kinds)} positions"
        )
    if choice.layers is not None and loaded.spec.position not in ("rotary", "partial rotary"):
        raise InterventionError(
            f"{choice}: per-layer surgery applies to rotary positions, which act inside every "
            f"attention; {loaded.name} has {loaded.spec.position} positions, which enter once "
            "(drop the @LAYERS)")
    if choice.layers is not None and isinstance(loaded, ModelRef):  # loaded: remedies count them
        names.layer_set(choice.layers, loaded.layer_count())  # a layer past the model's: refused
    if choice.layers is not None or choice.name in ACTS_IN_ATTENTION:
        from pecli.positions.remedies import check_causal, check_supported

        if choice.name in REMEDIES:
            check_causal(loaded, choice.name)
        check_supported(loaded)
    n = getattr(loaded, "max_positions", None)  # known once weights load
    if choice.name == "shift" and loaded.spec.position == LEARNED and n \
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
    iv, arg, spec = IMPLEMENTATIONS[choice.name], choice.argument, loaded.spec
    if choice.name == names.INTACT:  # the baseline: nothing installed, nothing copied
        return nullcontext
    if choice.layers is not None:
        return _layered(loaded, choice, iv, seed)
    if spec.rotates:
        return lambda: iv.rotary(loaded, arg, seed)
    if spec.position == ALIBI:
        return lambda: _alibi_hooks(loaded, iv.alibi, arg, seed)
    if spec.position == RELATIVE_BIAS:
        table, offset, edit = resolve(loaded.model, spec, spec.bias), 0, iv.relative
    else:
        table, offset, edit = position_embedding(loaded.model, spec), spec.pos_offset, iv.learned
    rows = table.weight.detach()[offset:]  # [n, d], a view on the real position rows
    new = edit(loaded, rows, arg, seed)
    if new is None:  # nothing to change
        return nullcontext
    full = table.weight.detach().clone()  # the whole table once, its position rows replaced
    full[offset:] = new.to(rows.device, rows.dtype)

    @contextmanager
    def apply() -> Iterator[None]:
        # The parameter's storage is swapped, not written: nothing is copied per batch, and the
        # model's own tensor comes back untouched.
        own = table.weight.data
        try:
            table.weight.data = full
            yield
        finally:
            table.weight.data = own

    return apply


def _layered(loaded, choice: Choice, iv: Implementation, seed: int):
    """Per-layer surgery: `choice` acting only in the attention layers it names."""
    from pecli.positions import remedies

    layers = names.layer_set(choice.layers, len(remedies.attention_modules(loaded)))
    if choice.name in REMEDIES:
        remedy = remedies.Remedy.of(choice.name, choice.argument)
        return lambda: remedies.remedied(loaded, remedy, layers)

    @contextmanager
    def apply() -> Iterator[None]:
        with iv.rotary(loaded, choice.argument, seed), remedies.only_in(loaded, layers):
            yield

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
        if kind == names.INTACT:
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


def _sincos_at(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """GPT-J's [sin | cos] table rows (its create_sinusoidal_positions) at any integer positions."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))  # [dim/2]
    angles = positions.to(torch.int64).float()[:, None] * inv_freq  # [n, dim/2]
    return torch.cat((torch.sin(angles), torch.cos(angles)), dim=1)  # [n, dim]


@contextmanager
def _sincos_tables(loaded, kind: str, arg, seed) -> Iterator[None]:
    """Rotary kept as a table in every attention (GPT-J): the rows are remapped, as the ids of
    a rotary module would be; `zero` makes every row sin 0, cos 1 (the identity rotation)."""
    parent, _, name = loaded.spec.sincos.rpartition(".")
    owners = [resolve_in(block, parent) for block in resolve(loaded.model, loaded.spec, loaded.spec.layers)]
    saved = [getattr(owner, name) for owner in owners]
    old = saved[0]  # [n, rot]: the same table in every block
    n, rot = old.shape
    ids = torch.arange(n)
    if kind == "zero":
        new = torch.cat([torch.zeros(n, rot // 2), torch.ones(n, rot // 2)], dim=1)
    elif kind == "reverse":
        new = old.flip(0)
    elif kind == "shuffle":
        new = old[_permutation(n, seed).to(old.device)]
    elif kind == "shift":
        new = _sincos_at(ids + _shift_amount(arg), rot)
    else:
        raise AssertionError(kind)
    new = new.to(old)
    try:
        for owner in owners:
            setattr(owner, name, new)
        yield
    finally:
        for owner, table in zip(owners, saved, strict=True):
            setattr(owner, name, table)


def _rotary(kind: str):
    @contextmanager
    def install(loaded, arg, seed):
        if kind == names.INTACT:
            yield
            return
        if loaded.spec.sincos:
            with _sincos_tables(loaded, kind, arg, seed):
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


# --- alibi: the bias every block receives, rewritten on its way in ---------------------


def _heads(loaded) -> int:
    config = loaded.model.config
    return int(getattr(config, "num_attention_heads", None) or config.n_heads)


@contextmanager
def _alibi_hooks(loaded, edit, arg, seed) -> Iterator[None]:
    key, heads = loaded.spec.bias, _heads(loaded)

    def pre_hook(mod, args, kwargs):
        if kwargs.get(key) is not None:
            kwargs = {**kwargs, key: edit(kwargs[key], heads, arg, seed)}
        return args, kwargs

    blocks = resolve(loaded.model, loaded.spec, loaded.spec.layers)
    with _hooks(*[b.register_forward_pre_hook(pre_hook, with_kwargs=True) for b in blocks]):
        yield


def _alibi(kind: str):
    def edit(bias, heads, arg, seed):
        if kind == names.INTACT:
            return bias
        if kind == "zero":  # every slope 0
            return torch.zeros_like(bias)
        if kind == "reverse":  # slope -m: farther keys weigh more, by as much
            return -bias
        if kind == "shuffle":  # head h gets head perm[h]'s slope
            perm = _permutation(heads, seed).to(bias.device)
            return bias.view(-1, heads, *bias.shape[1:])[:, perm].reshape(bias.shape)
        raise AssertionError(kind)

    return edit


# --- remedies and frequency bands (pecli.positions.remedies) ---------------------------

REMEDIES = ("sinks", "lminfinite", "selfextend", "rerope")
ACTS_IN_ATTENTION = (*REMEDIES, "droplow", "drophigh")


def _remedy(name: str):
    def install(loaded, arg, seed):
        from pecli.positions.remedies import Remedy, remedied

        return remedied(loaded, Remedy.of(name, arg))

    return install


def _bands(which: str):
    def install(loaded, arg, seed):
        from pecli.positions.remedies import bands_removed

        return bands_removed(loaded, which, float(arg))

    return install


# Keyed by the names of pecli.runs.names.INTERVENTIONS (which says what each does and where it
# applies); tests/unit/test_names.py checks the two agree (KIND_FIELDS: which field serves a kind).
KIND_FIELDS = {"learned": "learned", "rotary": "rotary", "partial rotary": "rotary",
               "alibi": "alibi", "relative bias": "relative"}
IMPLEMENTATIONS: dict[str, Implementation] = {
    "intact": Implementation(_learned("intact"), _rotary("intact"), _alibi("intact"),
                             _learned("intact")),
    "zero": Implementation(_learned("zero"), _rotary("zero"), _alibi("zero"), _learned("zero")),
    "shuffle": Implementation(_learned("shuffle"), _rotary("shuffle"), _alibi("shuffle"),
                              _learned("shuffle")),
    "reverse": Implementation(_learned("reverse"), _rotary("reverse"), _alibi("reverse")),
    "shift": Implementation(_learned("shift"), _rotary("shift")),
    "sinusoidal": Implementation(_learned_sinusoidal, None),
    "random": Implementation(_learned_random, None),
    "swap": Implementation(_learned_swap, None),
    **{name: Implementation(None, _remedy(name)) for name in REMEDIES},
    "droplow": Implementation(None, _bands("low")),
    "drophigh": Implementation(None, _bands("high")),
}
