"""The condition: what was done to a model's positions for one row of a table.

A condition is one frozen value, parsed once from the options: an intervention, a mask with
its semantics and protocol, a rope scaling (its type and parameters, parsed once: a
`pecli.positions.rope_scaling.Rope`), and how it is computed (the attention to install, the passes),
decided once by `plan`. Every experiment on a model (ablate, perplexity, mc, length, passkey,
ruler, attn, lm-eval, finetune, mask fit, recover, pe probe) uses it the same way, a training
loop as a scoring loop (outside pecli/positions nothing calls intervene, prepare or
masked_attention itself; tests/unit/test_conditions.py checks):

    grid = conditions.grid(options)                  # the intact model first, then the crossing
    conditions.check_all(grid, options.model, causal=True)   # before weights load: the config
    loaded = load(options.model, options)
    conditions.check_all(grid, loaded, causal=True)          # again, on the loaded model
    for c in grid:
        with c.applied(loaded, seed):                # one context stack, in KINDS' order
            ...score...
        rows.append({"condition": c.label, **c.names, ...})

- Checked in one place: `Condition.check(target, length)` decides every "not applicable" (a
  causal LM, the kind of positions, maskable attention, a rotary model for rope scaling, a
  length past the model's positions), on a `ModelRef` before loading and on the loaded model.
- Applied in one place: `Condition.applied(loaded, seed)` enters each kind's context in the
  order of KINDS' `order`: rope scaling first (it rebuilds the rotary modules), then the
  intervention (whose rotary hooks must sit on the rebuilt module), then the attention.
- Named in one place: `label(row)` (pecli.positions.labels, torch-free), from a row's
  columns, so a written CSV, a summary, a figure and `pecli compare` name a condition
  alike: the changed parts joined by " + ", `intact` when nothing changed.
- Crossed in one place: `grid`.

Adding a kind of condition (attention sinks, Self-Extend, ...): a field on `Condition` (its
default: unchanged), one `Kind` in KINDS (its columns, check and context) and its columns and
label part in pecli.positions.labels.PARTS; tests/unit/test_conditions.py checks the three
agree, tests/unit/test_adding_a_condition.py shows a throwaway kind end to end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, fields, replace
from typing import Any

from pecli.positions import labels
from pecli.positions.labels import INTACT, OLD_INTACT, UNCHANGED_ROPE, label, labelled, upgraded
from pecli.positions.rope_scaling import Rope
from pecli.runs import names
from pecli.runs.errors import ConfigError, ModelError
from pecli.runs.names import Choice

__all__ = ["INTACT", "OLD_INTACT", "UNCHANGED_ROPE", "label", "labelled", "upgraded"]  # names too


class NotApplicable(ModelError):
    """A condition that cannot act on a model at a length: a row's note, or a one-line error."""


@dataclass(frozen=True)
class Attention:
    """A masked attention to install (pecli.positions.masks.masked_attention): what it computes."""

    mask: Choice
    semantics: Choice
    mode: str  # pecli.positions.masks.MODES: relative (each row its own prefix) or keys (one 1-D mask)

    def __str__(self) -> str:
        return f"{self.mask}/{self.semantics}/{self.mode}"


def _computed(intervention: Choice) -> str:
    """An intervention as what it computes: a remedy with the parameters left out filled in
    (string:2731 and string:2731:2859 are one computation), anything else as named."""
    from pecli.positions.remedies import METHODS, Remedy

    if intervention.name not in METHODS:
        return str(intervention)
    return f"{Remedy.of(intervention.name, intervention.argument or '')!r}@{intervention.layers}"


APPLIED = "_pecli_condition"  # set on a model while a condition is applied to it


@dataclass(frozen=True)
class Condition:
    """One condition and how it is computed, decided once (`plan`) and handed down.

    The condition: intervention, mask, mask_semantics, protocol (parsed names) and rope (a
    parsed --rope-scaling item, None: unscaled). How: the attention to install (None: the
    model unchanged), the passes ("one-pass" or "prefix-by-prefix"), whether every shortcut
    is skipped (`literal`, plan(fast=False)), and why a shortcut is exact. `computation`
    names the attention in rows and keys.
    """

    intervention: Choice
    mask: Choice
    mask_semantics: Choice
    protocol: Choice
    attention: Attention | None
    passes: str
    literal: bool = False
    why: str = ""
    rope: Rope | None = None

    @property
    def computation(self) -> str:
        return "model" if self.attention is None else str(self.attention)

    @property
    def names(self) -> dict[str, str]:
        """Its condition columns but rope_scaling (which tables of a run that scales nothing
        leave out): the mask grid's intervention, mask, mask_semantics, protocol, and any
        kind added since."""
        return {k: v for k, v in self.columns().items()
                if k != "condition" and k not in labels.PARTS["rope"].columns}

    def columns(self, loaded=None) -> dict[str, str]:
        """Every kind's columns, the label first (rope_parameters resolved when `loaded`)."""
        out: dict[str, str] = {}
        for kind in KINDS:
            out.update(kind.columns(self, loaded))
        return {"condition": label(out), **out}

    @property
    def computes(self) -> tuple[str, ...]:
        """What it computes, as a key (identical conditions are scored once: the default mask
        named under several semantics): every kind's columns but the mask's, whose attention
        `computation` names, and the passes."""
        mask = labels.PARTS["mask"].columns
        cols = {**self.columns(), "intervention": _computed(self.intervention)}
        return (*(v for k, v in cols.items() if k != "condition" and k not in mask),
                self.computation, self.passes)

    @property
    def label(self) -> str:
        """The condition's one name: `intact`, `zero`, `zero + linear/log-bias (study) + yarn:2`."""
        return self.columns()["condition"]

    @property
    def intact(self) -> bool:
        return self.label == INTACT

    def check(self, target, length: int | None = None, *, causal: bool = False,
              what: str = "the window's", band: bool = False) -> None:
        """Raise unless this condition can act on `target`: a model name or a ModelRef (its
        config only, before weights load), or a LoadedModel; with `length`, also at that many
        tokens (NotApplicable: `what` names them in the message); with `band`, also by one band
        pass over a stream (length's `--windows band`). The one place that decides."""
        if self.rope is not None:  # transformers' rope types: known before any model is read
            from pecli.positions.rotary import check_type

            check_type(self.rope)
        ref = _target(target)
        if ref is None:  # only loading will tell
            return
        if causal:
            check_causal(ref)
        for kind in KINDS:
            kind.check(self, ref)
        if length is not None:
            _check_length(self, ref, length, what)
        if band:
            _check_band(self, ref)

    def reason(self, target, length: int, what: str = "the window's", *,
               band: bool = False) -> str | None:
        """Why this condition is not applicable at `length` tokens (a row's note), or None."""
        try:
            self.check(target, length, what=what, band=band)
        except NotApplicable as err:
            return str(err)
        return None

    def applier(self, loaded, seed: int = 0) -> Callable[[], AbstractContextManager]:
        """The slow part done once (new rows, a donor model); a cheap factory of `applied`
        (a loop over batches enters it per batch)."""
        steps = [kind.prepare(self, loaded, seed) for kind in sorted(KINDS, key=lambda k: k.order)]
        model, name = loaded.model, self.label

        @contextmanager
        def apply() -> Iterator[None]:
            # Two conditions entered one inside the other would compose by accident (each kind
            # patches what the other may have patched): refused; a Condition holds several kinds.
            held = getattr(model, APPLIED, None)
            if held is not None:
                raise ConfigError(f"the model is already under condition {held!r}; apply one "
                                  f"condition at a time (leave that block before applying {name!r}), "
                                  "or give both parts as one condition, e.g. "
                                  "pecli.conditions.parse('zero', rope='yarn:2')")
            setattr(model, APPLIED, name)
            try:
                with ExitStack() as stack:
                    for step in steps:
                        stack.enter_context(step())
                    yield
            finally:
                delattr(model, APPLIED)

        return apply

    def applied(self, loaded, seed: int = 0) -> AbstractContextManager:
        """`loaded` under this condition for the block; restored exactly on exit."""
        return self.applier(loaded, seed)()


# --- the kinds of a condition: one entry each ----------------------------------------------


@dataclass(frozen=True)
class Kind:
    """One kind of condition, reading `fields` of Condition. `columns(condition, loaded)`: its
    table columns (labels.PARTS[name].columns, and provenance such as rope_parameters);
    `check(condition, ref)`: raises when it cannot act on the model; `prepare(condition,
    loaded, seed)`: a factory of the context that applies it; `order`: where that context
    enters the stack (lowest first). Its label part is labels.PARTS[name].

    `grid` crosses a kind of one field (None: unchanged) with the options' field of that
    name, innermost, the unchanged value first; intervention, mask and rope have grid's own
    rule (pairs, one default mask, rope scaling on the intact model only)."""

    name: str
    fields: tuple[str, ...]  # the fields of Condition it reads
    order: int
    columns: Callable[[Condition, Any], dict[str, str]]
    check: Callable[[Condition, Any], None]
    prepare: Callable[[Condition, Any, int], Callable[[], AbstractContextManager]]

    @property
    def label(self) -> Callable[[Mapping], str | None]:
        return labels.PARTS[self.name].label


def _intervention_check(c: Condition, ref) -> None:
    from pecli.positions.interventions import check_applies

    check_applies(ref, c.intervention)


def _intervention_prepare(c: Condition, loaded, seed: int):
    from pecli.positions.interventions import prepare

    return prepare(loaded, c.intervention, seed)


def _mask_columns(c: Condition, loaded) -> dict[str, str]:
    return {"mask": str(c.mask), "mask_semantics": str(c.mask_semantics), "protocol": str(c.protocol)}


def _mask_check(c: Condition, ref) -> None:
    if c.attention is not None:
        from pecli.positions.masks import check_maskable

        check_maskable(ref)
    if c.mask.term is names.MASK_FILE:
        fitted = names.mask_file_fields(c.mask)
        heads = ref.head_count() if hasattr(ref, "head_count") else None
        if fitted["form"] in names.PER_HEAD_FORMS and heads is not None and heads != fitted["heads"]:
            raise ModelError(f"mask file {c.mask.argument.partition(names.HASH_MARK)[0]!r} was "
                             f"fitted per head for {fitted['heads']} heads; {ref.name} has {heads}: "
                             "fit it on this model")


def _mask_prepare(c: Condition, loaded, seed: int):
    a = c.attention
    if a is None:
        return nullcontext

    def install():
        from pecli.positions.masks import masked_attention

        return masked_attention(loaded.model, str(a.mask), a.semantics.name, a.mode)

    return install


def _rope_columns(c: Condition, loaded) -> dict[str, str]:
    if loaded is None:
        return {"rope_scaling": str(c.rope or UNCHANGED_ROPE)}
    from pecli.positions.rope_scaling import provenance

    return provenance(str(c.rope or UNCHANGED_ROPE), c.rope and _resolved_rope(c, loaded),
                      loaded.model.config)


def _resolved_rope(c: Condition, loaded) -> dict:
    """c's scaling resolved against the loaded model's config and validated by transformers:
    once per model and scaling (in the check after loading), then read by columns and apply."""
    done = loaded.__dict__.setdefault("resolved_ropes", {})
    if c.rope.params not in done:
        from pecli.positions.rotary import resolve

        done[c.rope.params] = resolve(loaded.model.config, c.rope.parameters)
    return done[c.rope.params]


def _rope_check(c: Condition, ref) -> None:
    """--rope-scaling needs a rotary module that transformers rebuilds from rope_parameters;
    GPT-J keeps fixed sin/cos tables in its blocks instead (spec.sincos)."""
    if c.rope is None:
        return
    spec = ref.spec
    if spec.position not in ("rotary", "partial rotary"):
        raise ModelError(f"{ref.name} has {spec.position} positions; --rope-scaling applies to "
                         "rotary models (e.g. smollm2, random:llama): drop it or the model")
    if spec.sincos:
        raise ModelError(f"{ref.name} ({spec.family}) keeps its rotation as fixed sin/cos tables, "
                         "with no rope_parameters to scale; drop --rope-scaling or the model")
    if getattr(ref, "model", None) is not None:  # loaded: transformers validates the parameters
        _resolved_rope(c, ref)


def _rope_prepare(c: Condition, loaded, seed: int):
    if c.rope is None:
        return nullcontext

    def scale():
        from pecli.positions.rotary import rope_scaled

        return rope_scaled(loaded.model, c.rope.parameters, resolved=_resolved_rope(c, loaded))

    return scale


# Label order (and columns' order) is this list's; the stack's is `order`.
KINDS: tuple[Kind, ...] = (
    Kind("intervention", ("intervention",), 1, lambda c, loaded: {"intervention": str(c.intervention)},
         _intervention_check, _intervention_prepare),
    Kind("mask", ("mask", "mask_semantics", "protocol"), 2, _mask_columns, _mask_check, _mask_prepare),
    Kind("rope", ("rope",), 0, _rope_columns, _rope_check, _rope_prepare),
)
OWN_RULE = ("intervention", "mask", "rope")  # the kinds `grid` crosses by its own rule


# --- one check: applicability ----------------------------------------------------------------


def _target(target):
    """A ModelRef or LoadedModel; a model name is peeked (None, or a name peek cannot read: only
    loading will tell)."""
    if isinstance(target, str):
        from pecli.models.sources import peek

        return peek(target)
    return target


def check_causal(ref) -> None:
    """Next-token scores need a causal LM with an output head (a ModelRef: its family says)."""
    model = getattr(ref, "model", None)
    if not ref.spec.causal or (model is not None and model.get_output_embeddings() is None):
        raise ModelError(
            f"not applicable: {ref.name} is a {ref.spec.family} encoder without a language-model "
            "head: this command scores next tokens and needs a causal LM (e.g. smollm2, random:gpt2, "
            "random:llama, gpt2)")


def _check_length(c: Condition, ref, length: int, what: str) -> None:
    n = getattr(ref, "max_positions", None)  # known once weights load
    if n is None:
        return
    from pecli.positions.extension import not_applicable

    why = not_applicable(ref, length)
    if why is not None:
        raise NotApplicable(why)
    if c.intervention.name == "shuffle" and length > n:
        raise NotApplicable(f"not applicable: shuffle permutes the model's {n} positions, fewer "
                            f"than {what}")


def _check_band(c: Condition, ref) -> None:
    """The band pass (one pass over the stream, each query seeing its window's keys) equals
    per-window passes only where attention depends on query-key offsets alone (rotary with
    static frequencies, ALiBi, no positions) and the model runs unchanged."""
    position = ref.spec.position
    if position in ("alibi", "relative bias"):  # a hub model's bias, built per call
        raise NotApplicable(f"not applicable: the band pass is proven for rotary models and "
                            f"pecli-trained tables, not {position}; use --windows sliding")
    if not ref.spec.rotates and getattr(ref, "model", None) is not None:
        from pecli.positions.extension import table_kind

        kind = table_kind(ref)
        if kind not in ("none", "alibi"):
            raise NotApplicable(f"not applicable: {ref.name} has {kind} absolute positions, which "
                                "restart in every window; use --windows sliding (per-window "
                                "evaluation)")
    if c.rope is not None and c.rope.type in ("dynamic", "longrope"):
        raise NotApplicable(f"not applicable: {c.rope.type} rope scaling sets its frequencies from "
                            "the sequence length, so one pass over the stream is not a window; "
                            "use --windows sliding")
    if c.intervention.name != names.INTACT or c.attention is not None:
        raise NotApplicable("not applicable: the band pass runs the model's own positions under "
                            "the default mask; use --windows sliding for interventions and masks")


def check_all(grid: Iterable[Condition], target, *, causal: bool = False) -> None:
    """Every condition of a run checked on one model (a name before loading, or the loaded
    model), the first failure raised: `Condition.check` on each."""
    ref = _target(target)
    for c in dict.fromkeys(grid):
        c.check(ref, causal=causal)


# --- planning: how one condition is computed ---------------------------------------------------


def _choice(registry, value: str | Choice) -> Choice:
    return value if isinstance(value, Choice) else names.parse(registry, value)


def plan(mask: str | Choice = "default", semantics: str | Choice = "legacy",
         protocol: str | Choice = "relative", intervention: str | Choice = INTACT,
         fast: bool = True, rope: Rope | None = None) -> Condition:
    """Which attention and which passes compute this condition: the one place that decides.

    Names may be given as text (tests, benchmarks) or as the Choices an options object parsed.
    `fast=False` is the literal route: no shortcut, one pass per prefix under both protocols.
    """
    mask, semantics = _choice(names.MASKS, mask), _choice(names.MASK_SEMANTICS, semantics)
    protocol = _choice(names.PROTOCOLS, protocol)
    condition = (_choice(names.INTERVENTIONS, intervention), mask, semantics, protocol)
    if "attention" in condition[0].term.traits and mask.name != "default":
        raise ConfigError(f"intervention {condition[0]} replaces the attention function, where "
                          f"--mask {mask} would act too: one of them per run (drop --mask, or "
                          "run the masks separately)")
    traits = mask.term.traits
    if fast and mask.name == "default":
        return Condition(*condition, None, "one-pass", why="m = 1 is the identity: the unchanged "
                         "model", rope=rope)
    if fast and semantics.name == "boolean" and "positive" in traits:
        return Condition(*condition, None, "one-pass",
                         why="boolean + a mask > 0 everywhere: the default mask (exact)", rope=rope)
    if protocol.name == "relative":
        return Condition(*condition, Attention(mask, semantics, "relative"),
                         "one-pass" if fast else "prefix-by-prefix", literal=not fast, rope=rope)
    if fast and semantics.name == "legacy" and "rises_to_newest" in traits:
        self_only = Attention(_choice(names.MASKS, "self"), _choice(names.MASK_SEMANTICS, "boolean"),
                              "relative")
        return Condition(*condition, self_only, "one-pass",
                         why="legacy + rising mask: every row attends only to itself (exact)",
                         rope=rope)
    return Condition(*condition, Attention(mask, semantics, "keys"), "prefix-by-prefix",
                     literal=not fast, rope=rope)


# --- one grid rule ------------------------------------------------------------------------------


def grid(options, *, pairs=None, default_once: bool = True) -> list[Condition]:
    """The conditions of a run, in order, repeats dropped: the intact model (own positions,
    default mask, unscaled) first, then every (intervention, mask) pair crossed with every
    mask semantics and protocol, each crossed with every rope scaling (innermost).

    Read from the options' fields where it has them (intervention, mask, mask_semantics,
    protocol, rope_scaling, and the field of any other kind in KINDS; absent: unchanged). `pairs` replaces intervention x mask
    (perplexity's study grid). `default_once`: the default mask (the unchanged model under
    every semantics and protocol) gives one condition per intervention, named with the first
    semantics and protocol of the vocabulary (legacy, relative); perplexity names it under
    each semantics asked (default_once=False), as its tables always have.
    """
    def given(field: str, default: str) -> tuple:
        value = getattr(options, field, None)
        return tuple(value) if value else (_choice(_REGISTRIES[field], default),)

    intact = (_choice(names.INTERVENTIONS, INTACT), _choice(names.MASKS, "default"))
    if pairs is None:
        pairs = [(i, m) for i in given("intervention", INTACT) for m in given("mask", "default")]
    first_semantics, first_protocol = (_choice(r, r.names()[0]) for r in
                                       (names.MASK_SEMANTICS, names.PROTOCOLS))
    ropes = (None, *(getattr(options, "rope_scaling", None) or ()))
    scaled_intact_only = getattr(options, "rope_scaling_on", "every") == "intact"
    out = []
    for intervention, mask in [intact, *(p for p in pairs if p != intact)]:
        crossed = ropes if not scaled_intact_only or (intervention, mask) == intact else (None,)
        for s in given("mask_semantics", "legacy"):
            for pr in given("protocol", "relative"):
                if default_once and mask.name == "default":
                    s, pr = first_semantics, first_protocol
                if mask.term is names.MASK_FILE:  # a fitted file knows its semantics
                    s = _choice(names.MASK_SEMANTICS, names.mask_file_fields(mask)["semantics"])
                out += [plan(mask, s, pr, intervention, rope=r) for r in crossed]
    for kind in (k for k in KINDS if k.name not in OWN_RULE):  # a kind of one field, innermost
        (field,) = kind.fields
        values = (None, *(getattr(options, field, None) or ()))
        out = [replace(c, **{field: v}) for c in out for v in values]
    return list(dict.fromkeys(out))


_REGISTRIES = {"intervention": names.INTERVENTIONS, "mask": names.MASKS,
               "mask_semantics": names.MASK_SEMANTICS, "protocol": names.PROTOCOLS}


def installed(loaded, how: Condition) -> AbstractContextManager:
    """Only the condition's attention installed in `loaded.model` for the block (scoring
    functions called on their own: tests, benchmarks); `applied` installs the whole condition."""
    return _mask_prepare(how, loaded, 0)()


def condition_fields() -> list[str]:
    """The fields of Condition that name the condition (not how it is computed)."""
    how = {"attention", "passes", "literal", "why"}
    return [f.name for f in fields(Condition) if f.name not in how]
