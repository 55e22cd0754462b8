"""Where a number came from: library versions, git state, time."""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from functools import cache
from pathlib import Path

import pecli

LIBRARIES = ("torch", "transformers", "datasets", "numpy", "scikit-learn")


@cache
def library_versions() -> dict[str, str]:
    versions = {"pecli_version": pecli.__version__, "python_version": platform.python_version()}
    for lib in LIBRARIES:
        try:
            versions[f"{lib.replace('-', '_')}_version"] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            versions[f"{lib.replace('-', '_')}_version"] = "absent"
    return versions


def cpu_kernels() -> str:
    """The vector instruction set of torch's CPU kernels in this process (AVX512, AVX2, DEFAULT;
    ATEN_CPU_CAPABILITY can lower it): on CPU, training with one seed is bit-identical only
    under the same set (docs/training.md). '' where the process never imported torch (nothing
    it wrote was computed by torch; a torch-free module stays so)."""
    torch = sys.modules.get("torch")
    return torch.backends.cpu.get_cpu_capability() if torch is not None else ""


@cache
def git_state() -> dict[str, str | bool]:
    """Commit and dirtiness of the checkout pecli runs from ("unknown" when installed)."""
    root = PROJECT_ROOT

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "pecli"))
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    return {"git_commit": commit or "unknown", "git_dirty": dirty}


PROJECT_ROOT = Path(__file__).resolve().parents[2]


def portable_model_id(path: str | Path) -> str:
    """A local model's id that is the same on every machine: its path relative to the project
    (`models/tiny-gpt2-imdb`) when it lies inside it, else its folder name. The content hash
    goes in `model_revision`; a machine's absolute path goes nowhere."""
    path = Path(path).resolve()
    try:
        return path.relative_to(PROJECT_ROOT).as_posix()
    except ValueError:
        return path.name


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


RUN_NOTES: dict[str, int] = {}  # what happened during this run (oom_splits: pecli.runs.batching)
SHARES: dict[int, int] = {}  # process -> padded tokens it was given (pecli.runs.parallel.assign)


def row_provenance() -> dict:
    """Columns every results row carries regardless of experiment."""
    shares = {"process_tokens": "/".join(str(SHARES[k]) for k in sorted(SHARES))} if SHARES else {}
    return {**library_versions(), "cpu_kernels": cpu_kernels(), "git_commit": git_state()["git_commit"],
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),  # processes (pecli.runs.parallel)
            **shares, **RUN_NOTES}


def read_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read now."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """`read_sha256`, read once per path, size and modification time: a file written again in
    this process (a model retrained, a mask refitted) is read again."""
    stat = os.stat(path)
    return _sha256_once(str(path), stat.st_size, stat.st_mtime_ns)


def file_revision(path: Path) -> str:
    """A local file's revision as rows record it (`data_revision`, a model folder's weights):
    `sha256:` and the first 16 hex digits of `file_sha256`."""
    return "sha256:" + file_sha256(path)[:16]


@cache
def _sha256_once(path: str, size: int, mtime_ns: int) -> str:
    return read_sha256(Path(path))
