"""Position interventions: context managers that change where position comes from, then restore.

    with intervene(loaded, "zero"):
        outputs = loaded.model(**batch)

A name is `<intervention>` or `<intervention>:<argument>` (`shift:3`, `swap:random:bert`).
Each remapping (reverse, shift, shuffle) is written once, as a map of positions (MAPS: position
p gets what position map(p) had), and the same map serves every kind that has positions:

- learned: the embedding table's storage is swapped for a copy made once in `prepare` with its
  rows (after `spec.pos_offset`) replaced by rows[map(p)] (clamped: a shift past the end
  repeats the last/first row); the model's own storage comes back in `finally`;
- relative bias: the same for the rows of T5's bias table [buckets, heads] (shuffle permutes
  the buckets);
- rotary and partial rotary: a forward pre-hook on the module at `spec.rotary` gives it map(ids)
  for the position ids ids (so a shift keeps every relative offset); `zero` is a forward hook
  returning cos 1, sin 0 (partial rotary's cos/sin cover only the rotated dimensions);
- GPT-J's [sin | cos] table in every attention (SINCOS): its rows become the rows of positions
  map(p), computed by GPT-J's formula where the map reaches past the table;
- alibi: forward pre-hooks on every block rewrite the bias tensor it receives (keyword
  `spec.bias`): zero, negated (reverse), heads permuted (shuffle).

Implementations are found in ONE table, IMPLEMENTATIONS, keyed by (name, kind) (as transformers
keys ROPE_INIT_FUNCTIONS by rope type): `prepare` looks up (name, kind_of(spec)) and nothing
dispatches again inside. Whether a name applies is decided before (check_applies, called by
pecli.positions.conditions' one check); shuffle past the positions is that check's row note.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import numpy as np
import torch

from pecli.models.architectures import (
    ALIBI,
    DISENTANGLED,
    LEARNED,
    RELATIVE_BIAS,
    ROTARY,
    ROTARY_KINDS,
    layer_groups,
    position_embedding,
    resolve,
    resolve_in,
)
from pecli.positions.remedies import METHODS
from pecli.positions.sinusoid import sinusoidal_at
from pecli.runs import names
from pecli.runs.errors import InterventionError
from pecli.runs.names import INTERVENTIONS, Choice

# Why a name means nothing for a kind, where more can be said than the kinds it needs.
WHY_NOT = {
    ("shift", ALIBI): "ALiBi's bias depends only on the distance between two tokens, which a "
                      "shift keeps: nothing would change",
    ("shift", RELATIVE_BIAS): "a relative bias depends only on the distance between two tokens, "
                              "which a shift keeps: nothing would change",
    ("reverse", RELATIVE_BIAS): "its buckets are distances, not positions: there is no N-1-p to "
                                "map a bucket to (shuffle permutes the buckets)",
    **{(name, DISENTANGLED): "DeBERTa's position terms read log-bucketed distances inside its "
                             "own attention code; only `zero` (every pair at distance 0) is defined"
       for name in ("shuffle", "reverse", "shift")},
}


def intervention_names() -> list[str]:
    """Names as a user types them (`shift:K`, `swap:MODEL`), for listings and help."""
    return [term.shown() for _, term in INTERVENTIONS.items()]


def parse(name: str | Choice) -> Choice:
    """`shift:3` -> Choice(<shift>, "3"); a Choice passes through (options have parsed it)."""
    return name if isinstance(name, Choice) else names.parse(INTERVENTIONS, name)


def check_applies(loaded, name: str | Choice) -> Choice:
    """The parsed intervention, or an InterventionError if it cannot act on this model's
    positions. `loaded` may be a LoadedModel or, before any weights load, a sources.ModelRef:
    then `swap:MODEL` is also checked against MODEL's config (its positions and width)."""
    from pecli.models.sources import ModelRef, peek

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
        # a layer past the model's, a layer type it does not have: refused
        names.layer_set(choice.layers, loaded.layer_count(), loaded.groups)
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
    """Apply intervention `name` to `loaded.model` inside the block; restore it exactly on exit.
    Checked first (`check_applies`): a direct call (tests, benchmarks) has no grid checked
    before it; experiments apply a checked Condition instead (Condition.applied)."""
    return prepare(loaded, check_applies(loaded, name), seed)()


def kind_of(spec) -> str:
    """The key under which `spec`'s implementations are found: its position kind, or SINCOS for
    rotary kept as a sin/cos table in every attention (GPT-J)."""
    return SINCOS if spec.sincos else spec.position


def prepare(loaded, name: str | Choice, seed: int = 0) -> Callable[[], AbstractContextManager]:
    """Do the slow part once (new rows, a donor model); return a cheap context-manager factory.

    A loop over batches enters `prepare(...)()` per batch without recomputing anything. Not
    checked again here: `Condition.check` decided before loading and on the loaded model
    (`intervene` checks a direct call).
    """
    choice = parse(name)
    if choice.layers is not None:
        return _layered(loaded, choice, seed)
    return IMPLEMENTATIONS[choice.name, kind_of(loaded.spec)](loaded, choice.argument, seed)


def _layered(loaded, choice: Choice, seed: int):
    """Per-layer surgery: `choice` acting only in the attention layers it names."""
    from pecli.positions import remedies

    layers = names.layer_set(choice.layers, len(remedies.attention_modules(loaded)),
                             layer_groups(loaded.model.config))
    if choice.name in REMEDIES:
        remedy = remedies.Remedy.of(choice.name, choice.argument)
        return lambda: remedies.remedied(loaded, remedy, layers)
    everywhere = IMPLEMENTATIONS[choice.name, kind_of(loaded.spec)](loaded, choice.argument, seed)

    @contextmanager
    def apply() -> Iterator[None]:
        with everywhere(), remedies.only_in(loaded, layers):
            yield

    return apply


# --- the maps of positions: written once, for every kind that has positions to map -------
# A map takes positions (any integer tensor) to the positions whose rows / rotation they get.


def _permutation(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=gen)  # [n]


def _reverse(n: int, arg, seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda p: (n - 1) - p


def _shift(n: int, arg, seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    k = _shift_amount(arg)
    return lambda p: p + k


def _shuffle(n: int, arg, seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    perm = _permutation(n, seed)
    return lambda p: perm.to(p.device)[p]


# name -> (n, argument, seed) -> the map of n positions
MAPS = {"reverse": _reverse, "shift": _shift, "shuffle": _shuffle}


def _shift_amount(arg: str) -> int:
    return int(arg)  # checked when parsed (pecli.runs.names)


# --- tables of rows (learned positions; T5's bias buckets): new rows from old ------------
# An edit is (loaded, rows[n, d], arg, seed) -> new rows [n, d], or None for no change.


def _table(loaded):
    """The position table and where its position rows start."""
    spec = loaded.spec
    if spec.position == RELATIVE_BIAS:
        return resolve(loaded.model, spec, spec.bias), 0  # [buckets, heads]
    return position_embedding(loaded.model, spec), spec.pos_offset  # [offset + n, d]


def _rows(edit: Callable):
    """An implementation that swaps the table's position rows for `edit`'s, made once."""

    def implementation(loaded, arg, seed):
        table, offset = _table(loaded)
        rows = table.weight.detach()[offset:]  # [n, d], a view on the real position rows
        new = edit(loaded, rows, arg, seed)
        full = table.weight.detach().clone()  # the whole table once, its position rows replaced
        full[offset:] = new.to(rows.device, rows.dtype)

        @contextmanager
        def apply() -> Iterator[None]:
            # The parameter's storage is swapped, not written: nothing is copied per batch, and
            # the model's own tensor comes back untouched.
            own = table.weight.data
            try:
                table.weight.data = full
                yield
            finally:
                table.weight.data = own

        return apply

    return implementation


def _mapped_rows(position_map):
    """Row p becomes row map(p); positions the map sends past the end read the last/first row."""

    def edit(loaded, rows, arg, seed):
        n = len(rows)
        index = position_map(n, arg, seed)(torch.arange(n)).clamp(0, n - 1)  # [n]
        return rows[index.to(rows.device)]

    return edit


def _zero_rows(loaded, rows, arg, seed):
    return torch.zeros_like(rows)


def sinusoidal_table(n: int, d: int) -> torch.Tensor:
    """Vaswani et al. (2017): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...).
    [n, d] float64, pecli.positions.sinusoid's one sinusoid."""
    return torch.from_numpy(sinusoidal_at(np.arange(n), d))


def _sinusoidal_rows(loaded, rows, arg, seed):
    pe = sinusoidal_table(*rows.shape).to(rows.device)  # [n, d], row norms sqrt(d/2)
    target = rows.double().norm(dim=1).mean()
    return pe * (target / pe.norm(dim=1).mean())


def _random_rows(loaded, rows, arg, seed):
    gen = torch.Generator().manual_seed(seed)
    flat = rows.double()
    noise = torch.randn(rows.shape, generator=gen, dtype=torch.float64)  # [n, d]
    return (noise * flat.std() + flat.mean()).to(rows.device)


def load_donor(name: str, seed: int):
    """The model whose position rows `swap:NAME` borrows (monkeypatched in tests)."""
    from pecli.models.loading import load_model

    return load_model(name, device="cpu", seed=seed)


def _swapped_rows(loaded, rows, arg, seed):
    donor = load_donor(arg, seed)
    _check_donor(arg, donor.spec.position, None, loaded.name, None)
    theirs = position_embedding(donor.model, donor.spec).weight.detach()[donor.spec.pos_offset:]
    _check_donor(arg, "learned", theirs.shape[1], loaded.name, rows.shape[1])
    new = torch.zeros_like(rows)  # positions the donor does not have get zero rows
    n = min(len(rows), len(theirs))
    new[:n] = theirs[:n].to(rows.device, rows.dtype)
    return new


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


def _identity_rotation(loaded, arg, seed):
    """No rotation: sin = 0, cos = the rotary module's attention factor (1; YaRN's scales
    queries and keys by it at every position: the rotation goes, the factor stays), as if every
    frequency were 0. The mask and windows keep the true order; NoPE layers never read it."""

    from pecli.positions.remedies import attention_factor

    def out_hook(mod, args, kwargs, output):
        cos, sin = output  # [b, t, head_dim] each
        layer_type = args[2] if len(args) > 2 else kwargs.get("layer_type")  # Gemma 3, ModernBERT
        return torch.full_like(cos, attention_factor(mod, layer_type)), torch.zeros_like(sin)

    return lambda: _hooks(_rotary_module(loaded).register_forward_hook(out_hook, with_kwargs=True))


def _mapped_ids(position_map):
    """The rotary module is given map(ids) for the position ids ids [b, t]."""

    def implementation(loaded, arg, seed):
        def install():
            # n is read on entry: a rope scaling entered first (Condition.applied) changes it
            remap = position_map(int(loaded.max_positions), arg, seed)

            def pre_hook(mod, args, kwargs):
                # The base model calls rotary_emb(hidden, position_ids=ids[b, t]): rewrite them.
                if "position_ids" in kwargs:
                    kwargs = {**kwargs, "position_ids": remap(kwargs["position_ids"])}
                else:
                    args = (args[0], remap(args[1]), *args[2:])
                return args, kwargs

            return _hooks(_rotary_module(loaded).register_forward_pre_hook(pre_hook, with_kwargs=True))

        return install

    return implementation


# --- rotary kept as a [sin | cos] table in every attention (GPT-J) -------------------------


def _sincos_at(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """GPT-J's [sin | cos] table rows (its create_sinusoidal_positions) at any integer positions."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))  # [dim/2]
    angles = positions.to(torch.int64).float()[:, None] * inv_freq  # [n, dim/2]
    return torch.cat((torch.sin(angles), torch.cos(angles)), dim=1)  # [n, dim]


def _sincos(edit: Callable):
    """An implementation that sets every block's table to `edit(old[n, rot], arg, seed)`."""

    def implementation(loaded, arg, seed):
        parent, _, name = loaded.spec.sincos.rpartition(".")
        blocks = resolve(loaded.model, loaded.spec, loaded.spec.layers)
        owners = [resolve_in(block, parent) for block in blocks]

        @contextmanager
        def apply() -> Iterator[None]:
            saved = [getattr(owner, name) for owner in owners]
            # [n, rot]: the same table in every block, read on entry (the model moves it to
            # the device of its inputs on its first call)
            new = edit(saved[0], arg, seed).to(saved[0])
            try:
                for owner in owners:
                    setattr(owner, name, new)
                yield
            finally:
                for owner, table in zip(owners, saved, strict=True):
                    setattr(owner, name, table)

        return apply

    return implementation


def _identity_sincos(old, arg, seed):
    n, rot = old.shape  # every row sin 0, cos 1: the identity rotation
    return torch.cat([torch.zeros(n, rot // 2), torch.ones(n, rot // 2)], dim=1)


def _mapped_sincos(position_map):
    """Row p becomes the row of position map(p): read from the table, or computed by GPT-J's
    formula where the map reaches past it (a shift)."""

    def edit(old, arg, seed):
        n, rot = old.shape
        index = position_map(n, arg, seed)(torch.arange(n))  # [n]
        if bool(((index >= 0) & (index < n)).all()):
            return old[index.to(old.device)]
        return _sincos_at(index, rot)

    return edit


# --- alibi: the bias every block receives, rewritten on its way in ---------------------
# An edit is (bias [b*h | h, ..., k], heads, arg, seed) -> new bias.


def _heads(loaded) -> int:
    config = loaded.model.config
    return int(getattr(config, "num_attention_heads", None) or config.n_heads)


def _same_distance(loaded, arg, seed):
    """DeBERTa: the encoder is given every pair's relative position as 0, so both position
    terms (content-to-position, position-to-content) read the distance-0 embedding everywhere."""

    def pre_hook(mod, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        n = hidden.shape[1]
        return args, {**kwargs, "relative_pos": torch.zeros(n, n, dtype=torch.long, device=hidden.device)}

    encoder = resolve(loaded.model, loaded.spec, loaded.spec.bias)
    return lambda: _hooks(encoder.register_forward_pre_hook(pre_hook, with_kwargs=True))


def _alibi(edit: Callable):
    def implementation(loaded, arg, seed):
        return lambda: _alibi_hooks(loaded, edit, arg, seed)

    return implementation


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


def _zero_bias(bias, heads, arg, seed):  # every slope 0
    return torch.zeros_like(bias)


def _negated_bias(bias, heads, arg, seed):  # slope -m: farther keys weigh more, by as much
    return -bias


def _shuffled_heads(bias, heads, arg, seed):  # head h gets head perm[h]'s slope
    perm = _permutation(heads, seed).to(bias.device)
    return bias.view(-1, heads, *bias.shape[1:])[:, perm].reshape(bias.shape)


# --- remedies and frequency bands (pecli.positions.remedies) ---------------------------

REMEDIES = tuple(METHODS)  # pecli.positions.remedies' table, one entry per remedy
ACTS_IN_ATTENTION = (*REMEDIES, "droplow", "drophigh")


def _remedy(name: str):
    def implementation(loaded, arg, seed):
        from pecli.positions.remedies import Remedy, remedied

        return lambda: remedied(loaded, Remedy.of(name, arg))

    return implementation


def _bands(which: str):
    def implementation(loaded, arg, seed):
        from pecli.positions.remedies import bands_removed

        return lambda: bands_removed(loaded, which, float(arg))

    return implementation


def _nothing(loaded, arg, seed):  # intact: nothing installed, nothing copied
    return nullcontext


# --- the one dispatch table ---------------------------------------------------------------

# Rotary kept as a sin/cos table in every block (GPT-J; kind_of): a rotary kind of its own here.
SINCOS = "rotary (sin/cos table)"
# How a map of positions acts on each kind that has positions to map.
MAPPED = {LEARNED: lambda m: _rows(_mapped_rows(m)), RELATIVE_BIAS: lambda m: _rows(_mapped_rows(m)),
          **dict.fromkeys(ROTARY_KINDS, _mapped_ids), SINCOS: lambda m: _sincos(_mapped_sincos(m))}


def _kinds(name: str) -> tuple[str, ...]:
    """The keys `name` is implemented under: the kinds it applies to (pecli.runs.names), and
    SINCOS with the rotary kinds where it does not act inside the attention (GPT-J's own)."""
    kinds = INTERVENTIONS.get(name).applies_to
    sincos = ROTARY in kinds and name not in ACTS_IN_ATTENTION
    return (*kinds, SINCOS) if sincos else tuple(kinds)


# (name, kind) -> implementation (loaded, argument, seed) -> a context-manager factory; names
# are pecli.runs.names.INTERVENTIONS's, kinds POSITION_KINDS + SINCOS (as transformers keys
# ROPE_INIT_FUNCTIONS by rope type). tests/unit/test_names.py checks every name is implemented
# for exactly the kinds it claims.
IMPLEMENTATIONS: dict[tuple[str, str], Callable[..., Callable[[], AbstractContextManager]]] = {
    **{("intact", kind): _nothing for kind in _kinds("intact")},
    ("zero", LEARNED): _rows(_zero_rows), ("zero", RELATIVE_BIAS): _rows(_zero_rows),
    **dict.fromkeys((("zero", kind) for kind in ROTARY_KINDS), _identity_rotation),
    ("zero", SINCOS): _sincos(_identity_sincos), ("zero", ALIBI): _alibi(_zero_bias),
    ("zero", DISENTANGLED): _same_distance,
    **{(name, kind): MAPPED[kind](position_map) for name, position_map in MAPS.items()
       for kind in _kinds(name) if kind in MAPPED},
    ("reverse", ALIBI): _alibi(_negated_bias), ("shuffle", ALIBI): _alibi(_shuffled_heads),
    ("sinusoidal", LEARNED): _rows(_sinusoidal_rows), ("random", LEARNED): _rows(_random_rows),
    ("swap", LEARNED): _rows(_swapped_rows),
    **{(name, kind): _remedy(name) for name in REMEDIES for kind in _kinds(name)},
    **{(name, kind): _bands(name[4:]) for name in ("droplow", "drophigh") for kind in _kinds(name)},
}
