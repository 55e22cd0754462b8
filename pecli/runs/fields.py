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
import math
import types
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pecli.runs import names
from pecli.runs.errors import ConfigError, InterventionError
from pecli.runs.names import Choice
from pecli.runs.registry import Registry

MIN_RESAMPLES, MAX_RESAMPLES = 100, 100_000  # --bootstrap: 0 (none) or within these
MAX_TOKENS = 131_072  # the longest window or prompt pecli builds (2^17: YaRN's longest evaluations)
TOKEN_FIELDS = ("length", "max_length", "context")  # one input's tokens: at most MAX_TOKENS
# A count with no ceiling of its own (texts, pairs, items, layers, ...): a value past these is
# a typo (`--seeds 1e12`), never a study; refused, not run until memory or patience runs out.
MAX_COUNT = 1_000_000
COUNT_CEILINGS = {"seeds": 1_000, "layers": 1_024, "heads": 1_024, "width": 65_536,
                  "dim": 65_536, "epochs": 10_000}


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
    # Options whose default changed: name -> the default before. A preset entry that leaves one
    # out is keyed with today's default; one that names the old default also finds the results
    # saved when it went unsaid (pecli.runs.config.Entry.keys).
    DEFAULTS_BEFORE: ClassVar[dict[str, Any]] = {}

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
            unset = (f.default, meta.get("flag", {}).get("default"))  # the field's, or its flag's
            if value not in unset and any(not t.strip() for t in texts):  # `--split ""`: not a default
                raise ConfigError(f"{key_label(f.name)}: {value!r} is empty; give a value or leave the "
                                  "option out")
            if meta.get("names") is not None:
                object.__setattr__(self, f.name, _parse_names(f.name, value, meta))
                continue
            if not type_matches(value, hints[f.name]):
                raise ConfigError(f"{key_label(f.name)}: {value!r} is not {describe(hints[f.name])}")
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))
            if isinstance(value, float) and not math.isfinite(value):  # NaN passes every range
                raise ConfigError(f"{key_label(f.name)}: {value} is not a finite number")
            if f.name in TOKEN_FIELDS and isinstance(value, int) and value > MAX_TOKENS:
                raise ConfigError(f"{key_label(f.name)}: {value} tokens is past the longest input "
                                  f"pecli builds, {MAX_TOKENS} tokens")
            low, high = meta.get("low"), meta.get("high")
            ceiling = high is None and low is not None and hints[f.name] in (int, int | None)
            if ceiling:  # a count's own ceiling, named only to a value above it
                high = COUNT_CEILINGS.get(f.name, MAX_COUNT)
            if isinstance(value, int | float) and not isinstance(value, bool) and (
                    (low is not None and value < low) or (high is not None and value > high)):
                named = high is not None and (not ceiling or value > high)
                bounds = [f"at least {low}"] * (low is not None) + [f"at most {high}"] * named
                raise ConfigError(f"{key_label(f.name)}: {value} is out of range ({', '.join(bounds)})")
            if f.name == "bootstrap" and 0 < value < MIN_RESAMPLES:
                raise ConfigError(f"{key_label(f.name)}: {value} resamples give no meaningful 95 % "
                                  f"interval; use 0 (no intervals) or {MIN_RESAMPLES} to "
                                  f"{MAX_RESAMPLES}")
            if meta.get("choices") and value is not None and value not in meta["choices"]:
                close = difflib.get_close_matches(str(value), meta["choices"], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{key_label(f.name)}: unknown value {value!r}{hint}; use one of "
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
        raise ConfigError(f"{key_label(key)}: {value!r} is not a name or a list of names")
    try:
        parsed = tuple(names.parse(registry, n) for n in names.split_names(value))
    except (ConfigError, InterventionError) as err:
        raise type(err)(f"{key_label(key)}: {err}") from None
    if not parsed:
        raise ConfigError(f"{key_label(key)}: no {registry.kind} given")
    if meta["many"]:
        repeated = [str(c) for c in dict.fromkeys(c for c in parsed if parsed.count(c) > 1)]
        if repeated:  # one condition, one row: a repeat would be a second label of the same numbers
            warnings.warn(f"{key_label(key)}: {', '.join(repeated)} given more than once; each runs once",
                          stacklevel=2)
        return tuple(dict.fromkeys(parsed))
    if len(parsed) > 1:
        raise ConfigError(f"{key_label(key)}: one {registry.kind}, not {len(parsed)}")
    return parsed[0]


def key_label(key: str) -> str:
    """`text_field` -> "text_field (--text-field)": the preset key and the flag."""
    return f"{key} (--{key.replace('_', '-')})"


def _plain(value):
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool | dict):
        return value
    return str(value)  # a parsed name (Choice) or rope scaling (Rope): as typed
