"""The names a user types, one registry per kind, without torch.

Every name-valued option (an intervention, a mask shape, a mask semantics, a protocol, a
way to treat long texts, a position-encoding scheme to train) is looked up here when its
options object is built (pecli.runs.options), so a typo fails in well under a second, before
any data, model or torch loads. The modules that implement a name (interventions.py,
masks.py, lm_scoring.py, training.py) key their implementations by these names;
tests/unit/test_names.py checks that every name has one and no implementation lacks a name.

The vocabulary (docs/cli.md has the table):
    intervention    what is done to a pretrained model's positions (--intervention)
    pe              the position encoding a model is trained with (toy, train lm: --pe)
    mask            a graded attention mask shape m(q, k) (--mask)
    mask_semantics  what a mask weight does to attention (--mask-semantics)
    protocol        how a mask meets a causal LM's prefixes (--protocol)
    long_text       texts longer than the model's positions (--long-text)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from pecli.runs.errors import ConfigError, InterventionError
from pecli.runs.registry import Registry


@dataclass(frozen=True)
class Term:
    """One name of a vocabulary.

    argument: the placeholder of its argument (`shift:K` -> "K"), None if it takes none; in
        brackets when it may be left out (`logscale[:c]` -> "[c]");
    check: raises on a malformed argument (a message naming the fix);
    applies_to: the position kinds it acts on (interventions: learned, rotary);
    traits: facts the computation plan reads (mask shapes: positive, rises_to_newest).
    """

    name: str
    description: str
    argument: str | None = None
    example: str = ""
    check: Callable[[str], None] | None = None
    applies_to: tuple[str, ...] = ()
    traits: frozenset[str] = frozenset()
    note: str = ""  # mask semantics: which transformers behaviour it reproduces

    def shown(self) -> str:
        """As a user types it: `shift:K`, `logscale[:c]`."""
        if self.argument and self.argument.startswith("["):
            return f"{self.name}[:{self.argument[1:-1]}]"
        return f"{self.name}:{self.argument}" if self.argument else self.name


@dataclass(frozen=True)
class Choice:
    """A parsed name and its argument: `shift:3` -> Choice(<shift>, "3"). str() gives it back."""

    term: Term
    argument: str | None = None
    layers: str | None = None  # `zero@even`: the layer set it is restricted to (LAYER SETS)

    @property
    def name(self) -> str:
        return self.term.name

    def __repr__(self) -> str:
        return f"Choice({str(self)!r})"

    def __str__(self) -> str:
        text = f"{self.term.name}:{self.argument}" if self.argument else self.term.name
        return f"{text}@{self.layers}" if self.layers is not None else text


def parse(registry: Registry[Term], text: str) -> Choice:
    """`shift:3` -> Choice; unknown names, a missing or a stray argument fail with a fix; a
    deprecated name (`registry.renamed`) is read as its name now, with a FutureWarning.

    A mask may also be a file that `pecli mask fit` wrote (`mask_file`). An intervention may
    end in `@LAYERS` (`zero@even`): per-layer surgery (layer_set)."""
    text = str(text).strip()
    text, at, layers = text.partition("@") if registry.kind == "intervention" else (text, "", "")
    if at:
        if "layered" not in registry.get(text.partition(":")[0]).traits:
            raise registry.error(f"{registry.kind} {text!r} cannot be restricted to layers "
                                 f"(@{layers}): only position interventions that act inside "
                                 "every attention can")
        layer_set(layers, None)  # the syntax; the range once the model is known
    base, colon, arg = text.partition(":")
    if base in registry.renamed:
        new = registry.renamed[base]
        warnings.warn(f"{registry.kind} {base!r} is deprecated; use {new!r} (the same: "
                      f"{registry.get(new).description})", FutureWarning, stacklevel=2)
        base = new
    path = text.partition(HASH_MARK)[0]  # PATH#sha256:DIGEST without file: is a file too
    if registry is MASKS and (base == MASK_FILE.name or (base not in registry and _is_file(path))):
        return mask_file(text)
    term = registry.get(base)
    if term.argument and not arg and not term.argument.startswith("["):
        raise registry.error(f"{registry.kind} {base!r} needs an argument: write "
                             f"{term.shown()} (e.g. {term.example})")
    if not term.argument and colon:
        raise registry.error(f"{registry.kind} {base!r} takes no argument; write {base!r}")
    if term.check and arg:
        term.check(arg)
        arg = ":".join(_number(p) for p in arg.split(":"))  # sinks:04:+16 is sinks:4:16
    return Choice(term, arg or None, layers if at else None)


def _number(text: str) -> str:
    """A number as one spelling names it (`04`, `+4` -> `4`; `0.250` -> `0.25`; `8192.0` ->
    `8192`), so that one condition has one label; anything else as given."""
    try:
        return str(int(text))
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    if value != value or value in (float("inf"), float("-inf")):
        return text
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


# Per-layer surgery (`@LAYERS`): items joined by '+': N, N-M (inclusive), N- (to the last
# layer), even, odd, everyK (0, K, 2K, ...), all, none (the empty set).
LAYER_SETS = ("N, N-M, N-, even, odd, everyK, all, none, or a layer type (full_attention, "
              "sliding_attention, chunked_attention, nope, rope), joined by '+' (e.g. 0+2, 1-, every4)")
LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "nope", "rope")


def layer_set(text: str, layers: int | None,
              groups: dict[str, tuple[int, ...]] | None = None) -> tuple[int, ...]:
    """The layer indices `text` names among `layers` (None: check the syntax only); a layer
    type names the layers `groups` gives it (pecli.models.architectures.layer_groups; None:
    not known yet)."""
    def bad(why: str) -> InterventionError:
        return InterventionError(f"layer set @{text}: {why}; write {LAYER_SETS}")

    n = layers if layers is not None else 0  # None: keywords fill nothing (syntax only)
    chosen: set[int] = set()
    for item in text.split("+"):
        item = item.strip()
        if item == "none":
            continue
        if item in LAYER_TYPES:
            if groups is not None and not groups.get(item):
                have = ", ".join(k for k in LAYER_TYPES if groups.get(k))
                raise bad(f"the model has no {item} layers (it has {have})")
            chosen.update((groups or {}).get(item, ()))
        elif item == "all":
            chosen.update(range(n))
        elif item in ("even", "odd"):
            chosen.update(range(item == "odd", n, 2))
        elif item.startswith("every") and item[5:].isdigit() and int(item[5:]) > 0:
            chosen.update(range(0, n, int(item[5:])))
        else:
            lo, dash, hi = item.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise bad(f"{item!r} is not a layer, a range or a keyword")
            top = (int(hi) if hi else n - 1) if dash else int(lo)
            if layers is not None and max(int(lo), top) >= layers:
                raise bad(f"the model has {layers} layers (0-{layers - 1})")
            if top < int(lo) and (hi or layers is not None):
                raise bad(f"the range {item} is empty")
            chosen.update(range(int(lo), top + 1))
    return tuple(sorted(chosen))


def split_names(value) -> list[str]:
    """A name, a list of names, or "a,b" -> the names, in order, repeats dropped.

    Commas separate names; colons stay inside one (`swap:random:bert`).
    """
    items = [value] if isinstance(value, str) else list(value or [])
    names = [s.strip() for item in items for s in str(item).split(",") if s.strip()]
    return list(dict.fromkeys(names))


# |K| past this: rotary angles (p + K) * theta are float32, whose integers stop being exact at
# 2**24, so positions far out collapse onto each other (shift:-99999999999 equals zero).
SHIFT_BOUND = 2**20


def _integer(what: str, example: str, bound: int):
    def check(arg: str) -> None:
        try:
            value = int(arg)
        except ValueError:
            raise InterventionError(f"{what} needs an integer, got {arg!r}; e.g. {example}") from None
        if abs(value) > bound:
            raise InterventionError(f"{what}:{arg}: |{what}| is at most {bound:,}; farther, positions "
                                    f"lose their meaning in float32; e.g. {example}")

    return check


def _registry(kind: str, error, terms: list[Term]) -> Registry[Term]:
    registry: Registry[Term] = Registry(kind, error)
    for term in terms:
        registry.add(term.name, term)
    return registry


def _fields(what: str, example: str, least: tuple[int, ...], optional: float | None = None):
    """K:W-style arguments: len(least) integers, each >= its least value, then optionally one
    more number >= 1 (lminfinite's cap D, leaky ReRoPE's k)."""
    def check(arg: str) -> None:
        parts = arg.split(":")
        shape = ":".join(["N"] * len(least)) + (":x" if optional is not None else "")
        if not len(least) <= len(parts) <= len(least) + (optional is not None):
            raise InterventionError(f"{what} takes {shape}, got {arg!r}; e.g. {example}")
        try:
            values = [int(p) for p in parts[:len(least)]] + [float(p) for p in parts[len(least):]]
        except ValueError:
            raise InterventionError(f"{what} needs numbers, got {arg!r}; e.g. {example}") from None
        for value, low in zip(values, (*least, 1), strict=False):
            if not math.isfinite(value):
                raise InterventionError(f"{what}:{arg}: {value} is not a finite number; e.g. {example}")
            if value < low:
                raise InterventionError(f"{what}:{arg}: {value:g} is below {low}; e.g. {example}")

    return check


def _parts(what: str, example: str, kinds: str, least: tuple[float, ...], required: int,
           relation: Callable[[list], str | None] | None = None):
    """Arguments of parts typed by `kinds` ("i" an integer, "f" a number), the first `required`
    needed, each >= its least value; `relation(values)` says why they do not fit together."""
    def check(arg: str) -> None:
        parts = arg.split(":")
        shape = ":".join("N" if k == "i" else "x" for k in kinds)
        if not required <= len(parts) <= len(kinds):
            raise InterventionError(f"{what} takes {shape} (the first {required} needed), got "
                                    f"{arg!r}; e.g. {example}")
        try:
            values = [int(p) if k == "i" else float(p) for p, k in zip(parts, kinds, strict=False)]
        except ValueError:
            raise InterventionError(f"{what} needs numbers, got {arg!r}; e.g. {example}") from None
        for value, low in zip(values, least, strict=False):
            if not value >= low:
                raise InterventionError(f"{what}:{arg}: {value:g} is below {low:g}; e.g. {example}")
        why = relation(values) if relation else None
        if why:
            raise InterventionError(f"{what}:{arg}: {why}; e.g. {example}")

    return check


def _fraction(what: str):
    def check(arg: str) -> None:
        try:
            value = float(arg)
        except ValueError:
            value = -1.0
        if not 0.0 <= value <= 1.0:
            raise InterventionError(f"{what} needs a fraction between 0 and 1, got {arg!r}; "
                                    f"e.g. {what}:0.25")

    return check


# Position kinds (pecli.models.architectures.POSITION_KINDS, spelled here without torch).
_ROTARY = ("rotary", "partial rotary")
_ALL = ("learned", *_ROTARY, "alibi", "relative bias")
_DEBERTA = "disentangled relative"  # only intact and zero have a defined meaning
# traits: `layered` takes @LAYERS (per-layer surgery; rotary positions only, checked on the
# model); `attention` replaces the model's attention function (so it excludes --mask).
_LAYERED = frozenset({"layered"})
_REMEDY = frozenset({"layered", "attention"})

INTERVENTIONS = _registry("intervention", InterventionError, [
    Term("intact", "no change: the model's own positions, whatever their kind (the baseline)",
         applies_to=(*_ALL, _DEBERTA)),
    Term("zero", "no position information: zero rows (learned); identity rotation (rotary; "
                 "partial rotary: on the rotated dimensions only); every slope 0 (alibi); the "
                 "bias removed (relative bias); every pair at distance 0 (disentangled "
                 "relative)", applies_to=(*_ALL, _DEBERTA), traits=_LAYERED),
    Term("shuffle", "position p gets position perm[p]'s rows / rotation (seeded); alibi: the "
                    "heads' slopes permuted; relative bias: the distance buckets permuted",
         applies_to=_ALL, traits=_LAYERED),
    Term("reverse", "position p gets position N-1-p's rows / rotation; alibi: the bias's sign "
                    "flipped (farther keys weigh more)", applies_to=("learned", *_ROTARY, "alibi"),
         traits=_LAYERED),
    Term("shift", "position p gets position p+K's rows / rotation", argument="K",
         example="shift:3", check=_integer("shift", "shift:3", SHIFT_BOUND), applies_to=("learned", *_ROTARY),
         traits=_LAYERED),
    Term("sinusoidal", "Vaswani sinusoids scaled to the learned rows' mean norm",
         applies_to=("learned",)),
    Term("random", "Gaussian rows matching the learned rows' mean and std (seeded)",
         applies_to=("learned",)),
    Term("swap", "another model's position rows of the same width (zero past its end)",
         argument="MODEL", example="swap:random:bert", applies_to=("learned",)),
    # Training-free remedies past the context (pecli.positions.remedies; docs/remedies.md)
    Term("sinks", "StreamingLLM (Xiao et al. 2023): each token sees the first K tokens and the W "
                  "most recent (itself included), at positions inside that rolling cache; "
                  "sinks:0:W is window attention", argument="K:W", example="sinks:4:1020",
         check=_fields("sinks", "sinks:4:1020", (0, 1)), applies_to=_ROTARY, traits=_REMEDY),
    Term("lminfinite", "LM-Infinite (Han et al. 2024): the first K tokens and the W most recent, "
                       "distances capped at D (default W)", argument="K:W[:D]",
         example="lminfinite:10:2048", check=_fields("lminfinite", "lminfinite:10:2048", (0, 1), 1),
         applies_to=_ROTARY, traits=_REMEDY),
    Term("selfextend", "Self-Extend (Jin et al. 2024): ordinary distances within W, grouped "
                       "positions (floor division by G) beyond, merged before one softmax",
         argument="G:W", example="selfextend:4:1024", check=_fields("selfextend", "selfextend:4:1024", (1, 1)),
         applies_to=_ROTARY, traits=_REMEDY),
    Term("rerope", "ReRoPE (Su 2023): every distance d becomes min(d, W); rerope:W:k is leaky "
                   "ReRoPE, W + (d - W)/k past W", argument="W[:k]", example="rerope:1024",
         check=_fields("rerope", "rerope:1024", (1,), 1.0), applies_to=_ROTARY, traits=_REMEDY),
    Term("string", "STRING (An et al. 2025): distances d >= W shifted down by S (the well-trained "
                   "small distances reused for the far pairs), those below W kept; W defaults to "
                   "S + 128 (the paper's local value 128)", argument="S[:W]", example="string:2048",
         check=_parts("string", "string:2048", "ii", (0, 1), 1,
                      lambda v: "W must be at least S (no negative distance)" if len(v) > 1
                      and v[1] < v[0] else None), applies_to=_ROTARY, traits=_REMEDY),
    Term("dca", "Dual Chunk Attention (An et al. 2024, ChunkLlama): chunks of C - L tokens, keys "
                "at their index in the chunk; a query sees its own chunk (intra), the previous "
                "(successive) and the earlier ones (inter) at three positions of its own; L "
                "defaults to C // 12", argument="C[:L]", example="dca:6144",
         check=_parts("dca", "dca:6144:512", "ii", (2, 0), 1,
                      lambda v: "L must be at most C / 2" if len(v) > 1 and 2 * v[1] > v[0]
                      else None), applies_to=_ROTARY, traits=_REMEDY),
    Term("temperature", "every attention logit divided by T (a fixed softmax temperature; "
                        "T < 1 sharpens)", argument="T", example="temperature:0.8",
         check=_parts("temperature", "temperature:0.8", "f", (0,), 1,
                      lambda v: "T must be above 0" if v[0] <= 0 else None),
         applies_to=_ROTARY, traits=_REMEDY),
    Term("logscale", "log-length attention scaling: a query that sees n > n_train tokens has its "
                     "logits multiplied by 1 + c ln(n / n_train) (n_train: the trained context; "
                     "YaRN's 0.1 ln s + 1, Scalable-Softmax, Llama 4); c defaults to 0.1",
         argument="[c]", example="logscale:0.1",
         check=_parts("logscale", "logscale:0.1", "f", (0,), 1), applies_to=_ROTARY,
         traits=_REMEDY),
    Term("droplow", "remove the rotation of the lowest fraction F of the rotary frequency pairs "
                    "(p-RoPE, Barbero et al. 2024, at inference)", argument="F",
         example="droplow:0.25", check=_fraction("droplow"), applies_to=_ROTARY, traits=_LAYERED),
    Term("drophigh", "remove the rotation of the highest fraction F of the rotary frequency pairs",
         argument="F", example="drophigh:0.25", check=_fraction("drophigh"), applies_to=_ROTARY,
         traits=_LAYERED),
])

INTERVENTIONS.rename("learned", "intact")  # its name until 0.2: read "learned absolute positions"
INTACT = "intact"  # the unmodified model, in every table, summary and figure

MASKS = _registry("mask", ConfigError, [
    Term("default", "1 for every visible key: the model's own mask", traits=frozenset({"positive"})),
    Term("linear", "the study's: 1 at the newest key falling linearly to 0.1 at the oldest (q=1: 1)",
         traits=frozenset({"positive", "rises_to_newest"})),
    Term("exponential", "1 at the newest key falling geometrically to 0.1 at the oldest",
         traits=frozenset({"positive", "rises_to_newest"})),
    Term("alibi", "exp(-slope_h * distance), ALiBi's per-head slopes: log-bias gives ALiBi "
                  "(weights below fp32's range, e.g. slope 0.5 at distance > ~200, are 0)",
         traits=frozenset({"rises_to_newest"})),
    Term("self", "1 at the newest key (the query itself), 0 elsewhere: a bigram model"),
])

MASK_SEMANTICS = _registry("mask semantics", ConfigError, [
    Term("legacy", "add (1 - m) * finfo(dtype).min to the logits: only the keys with the row's "
                   "largest m survive (the newest alone, for a rising mask)",
         note="4.x GPT-2 with a float attention_mask"),
    Term("boolean", "a key is visible iff m != 0; weights are otherwise ignored",
         note="5.x: a 2-D float mask is cast to bool"),
    Term("log-bias", "add log m to the logits: a renormalised soft reweighting",
         note="none (what the idea meant, softly)"),
    Term("scale", "multiply the attention probabilities by m after softmax, without "
                  "renormalising (shrinks each attention output)", note="none"),
])

# The forms of mask `pecli mask fit` fits (pecli.positions.masks.FittedMask), each an additive
# bias on the attention logits by distance d (0 = the query itself), read as log-bias weights.
MASK_FORMS = _registry("mask form", ConfigError, [
    Term("bucket", "one bias per distance bucket (0, 1, 2, 3, 4-5, 6-7, 8-11, ... doubling), "
                   "shared by every head"),
    Term("bucket-head", "one bias per distance bucket and head"),
    Term("slope", "ALiBi's form: bias -s_h * d, one slope s_h >= 0 per head"),
    Term("linear", "the study's shape: weight 1 at the newest key falling linearly to a_h at the "
                   "oldest, a_h in (0, 1) fitted per head (log-bias: only the ratio of the ends "
                   "matters, so the newest end stays 1)"),
])

PROTOCOLS = _registry("protocol", ConfigError, [
    Term("relative", "each query weighs its own prefix by m(q, k): one pass per text"),
    Term("study", "the study's loop: one pass per predicted token, one 1-D key mask m(n, k)"),
])

LONG_TEXT = _registry("long-text treatment", ConfigError, [
    Term("truncate", "keep the first positions' worth of tokens; the rest are dropped and counted"),
    Term("window", "sliding windows (--stride) so that every token is scored"),
])

PE_SCHEMES = _registry("position encoding", ConfigError, [
    Term("learned", "a learned absolute table (GPT-2's wpe)"),
    Term("sinusoidal", "fixed Vaswani sinusoids in wpe"),
    Term("none", "no position information (NoPE; causal masking alone)"),
    Term("rope", "rotary embeddings in every attention (Llama)"),
    Term("alibi", "no table; a per-head linear bias on attention logits by distance"),
    Term("t5", "no table; T5's learned relative bias, one per head and distance bucket (GPT-2)"),
    Term("randomized", "rotary (Llama) at positions sampled, sorted, from the whole position "
                       "range while training (Ruoss et al. 2023)"),
    Term("p-rope", "rotary on the highest 3/4 of the frequencies only (Barbero et al.'s "
                   "0.75-RoPE: transformers' proportional rope type)"),
])


# Figure formats (--format, a preset's `format`): what pecli.plots.style.save writes.
FIGURE_FORMATS = ("png", "pdf", "svg")


def parse_formats(value) -> tuple[str, ...]:
    """"png,pdf" or a list -> ("png", "pdf"); an unknown format is a one-line ConfigError."""
    items = [value] if isinstance(value, str) else list(value or [])
    found = [f.strip().lower().lstrip(".") for item in items for f in str(item).split(",") if f.strip()]
    bad = [f for f in found if f not in FIGURE_FORMATS]
    if bad or not found:
        raise ConfigError(f"format (--format): {', '.join(map(repr, bad)) or 'nothing'} is not a "
                          f"figure format; use one or more of {', '.join(FIGURE_FORMATS)}, e.g. png,pdf")
    return tuple(dict.fromkeys(found))


# --- a fitted mask file (pecli mask fit) as a mask --------------------------------------

MASK_FILE = Term("file", "a mask that `pecli mask fit` fitted, read from its JSON file; the "
                         "name carries the file's sha256", argument="FILE",
                 example="runs/mask-fit/mask/mask.json")
MASK_FILE_FORMAT = "pecli-mask/1"  # the "format" field of every mask file
HASH_MARK = "#sha256:"  # file:PATH#sha256:DIGEST (16 hex digits of the file's sha256)


def _is_file(text: str) -> bool:
    import os

    return text.endswith(".json") or os.path.isfile(text)


def mask_path(text: str) -> str:
    """The file a mask file's name reads: `PATH`, `file:PATH` or `file:PATH#sha256:DIGEST` -> PATH."""
    return text.removeprefix(f"{MASK_FILE.name}:").partition(HASH_MARK)[0]


def mask_file(text: str) -> Choice:
    """`PATH`, `file:PATH` or `file:PATH#sha256:DIGEST` -> Choice(MASK_FILE, "PATH#sha256:DIGEST").

    The file must exist and be a mask file (its `format`); a given digest must match the file,
    so a name recorded in a results row always means the same weights.
    """
    import hashlib
    import json

    path, _, digest = text.removeprefix(f"{MASK_FILE.name}:").partition(HASH_MARK)
    try:
        raw = open(path, "rb").read()  # noqa: SIM115 (small; read once)
    except OSError as err:
        raise ConfigError(f"mask file {path!r}: {err.strerror or err}; give a file that "
                          "`pecli mask fit` wrote (its mask/mask.json) or a mask shape "
                          f"({', '.join(MASKS.names())})") from None
    try:
        fmt = json.loads(raw).get("format")
    except (ValueError, AttributeError):
        fmt = None
    if fmt != MASK_FILE_FORMAT:
        raise ConfigError(f"mask file {path!r} is not a pecli mask file (no \"format\": "
                          f"\"{MASK_FILE_FORMAT}\"); give the mask.json that `pecli mask fit` wrote")
    actual = hashlib.sha256(raw).hexdigest()[:16]
    if digest and digest != actual:
        raise ConfigError(f"mask file {path!r} has changed: its sha256 starts {actual}, the name "
                          f"says {digest}; use the file the results were computed with")
    problem = _mask_file_problem(json.loads(raw))
    if problem:
        raise ConfigError(f"mask file {path!r} {problem}; fit it again with `pecli mask fit`")
    return Choice(MASK_FILE, f"{path}{HASH_MARK}{actual}")


PER_HEAD_FORMS = ("bucket-head", "slope", "linear")  # one row of values per head


def _mask_file_problem(raw: dict) -> str:
    """What makes a mask file's content unusable (not numbers, NaN, a slope < 0, rows that
    disagree with its heads or buckets), or "" where it is sound; torch-free, before loading."""
    def ints(value) -> bool:
        return isinstance(value, list) and all(type(v) is int for v in value)

    form, heads, values, edges = (raw.get(k) for k in ("form", "heads", "values", "edges"))
    if form not in MASK_FORMS.names():
        return f"has form {form!r}, not one of {', '.join(MASK_FORMS.names())}"
    if raw.get("semantics", "log-bias") not in MASK_SEMANTICS.names():
        return f"has semantics {raw.get('semantics')!r}, not one of {', '.join(MASK_SEMANTICS.names())}"
    if type(heads) is not int or heads < 1:
        return f"has heads {heads!r}, not a positive integer"
    if not (isinstance(values, list) and values and all(isinstance(r, list) and r for r in values)
            and all(type(v) in (int, float) for r in values for v in r)):
        return "has values that are not rows of numbers"
    if not all(math.isfinite(v) for r in values for v in r):
        return "has values that are not finite (NaN or infinite)"
    rows = heads if form in PER_HEAD_FORMS else 1
    n = len(edges) if form in ("bucket", "bucket-head") else 1
    if form in ("bucket", "bucket-head") and not (ints(edges) and edges and edges[0] == 0
                                                  and edges == sorted(set(edges))):
        return "has bucket edges that are not increasing integers from 0"
    if len(values) != rows or any(len(r) != n for r in values):
        return (f"has {len(values)} rows of {sorted({len(r) for r in values})} values; a {form} mask "
                f"for {heads} heads has {rows} of {n}")
    if form == "slope" and min(min(r) for r in values) < 0:
        return "has a negative slope (the slope form's s >= 0)"
    if form == "linear" and not all(0 <= v <= 1 for r in values for v in r):
        return "has an oldest weight outside [0, 1] (the linear form's a in (0, 1))"
    return ""


def mask_file_fields(choice: Choice) -> dict:
    """The `form`, `heads` and `semantics` of a mask file (a Choice mask_file gave)."""
    import json

    raw = json.loads(open(mask_path(choice.argument), "rb").read())  # noqa: SIM115
    return {"form": raw["form"], "heads": raw["heads"], "semantics": raw.get("semantics", "log-bias")}
