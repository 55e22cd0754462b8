"""Run directories and atomic writes: a results file is either whole or absent."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pandas as pd

from pecli.provenance import git_state, library_versions, utc_now

# Tables longer than this are written gzipped (`.csv.gz`, which pandas reads as it is): their
# repeated provenance columns compress some 50-fold.
GZIP_ROWS = 10_000


def _atomic(path: Path, write, binary: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="")) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_csv(df: pd.DataFrame, path: Path) -> Path:
    path = Path(path)
    if path.suffix == ".gz":
        return _atomic(path, lambda f: df.to_csv(f, index=False, compression={"method": "gzip", "mtime": 0}),
                       binary=True)
    return _atomic(path, lambda f: df.to_csv(f, index=False))


def write_json(obj: dict, path: Path) -> Path:
    return _atomic(Path(path), lambda f: json.dump(obj, f, indent=2, default=str))


def run_meta(config: dict) -> dict:
    """The sidecar of a table: resolved config, versions, git state, time."""
    return {"config": config, "created": utc_now(), **library_versions(), **git_state()}


def default_out_dir(command: str) -> Path:
    """Ad-hoc runs go under runs/<command>/<UTC time>-<commit> (gitignored)."""
    stamp = utc_now().replace(":", "").replace("-", "")
    return Path("runs") / command / f"{stamp}-{git_state()['git_commit']}"


def write_table(df: pd.DataFrame, out_dir: Path, name: str, config: dict) -> Path:
    """Write `<name>.csv` (`.csv.gz` past GZIP_ROWS rows) and `<name>.json` (its sidecar) into
    out_dir; return the CSV path."""
    out_dir = Path(out_dir)
    csv = write_csv(df, out_dir / f"{name}.csv{'.gz' if len(df) > GZIP_ROWS else ''}")
    write_json(run_meta(config), out_dir / f"{name}.json")
    return csv


class Checkpoint:
    """Partial results of a long loop, so that an interrupted run resumes where it stopped.

    Saved atomically (an .npz of named arrays) at most every `every` seconds, and never
    more often than 20 times the last save took (at most 5 % of the time goes to saving as
    the arrays grow; `every=0` saves at every call), under <cache>/partial/<kind>-<hash>.npz.
    The hash covers `key` (everything else that determines the numbers) and the input
    `texts`; a rerun with the same hash loads the file, a finished run deletes it.
    """

    def __init__(self, kind: str, key: dict, texts: list[str], every: float = 60.0):
        import hashlib
        import time

        from pecli.loading import cache_dir

        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode())
        digest.update("\x00".join(texts).encode())
        digest = digest.hexdigest()
        self.path = cache_dir() / "partial" / f"{kind}-{digest[:20]}.npz"
        self.every, self._clock = every, time.monotonic
        self._last, self._cost = self._clock(), 0.0

    def load(self) -> dict | None:
        import numpy as np

        if not self.path.exists():
            return None
        with np.load(self.path, allow_pickle=False) as saved:
            return {name: saved[name] for name in saved.files}

    def save(self, arrays, force: bool = False) -> None:
        """Write `arrays()` (a dict of arrays, built only when a save is due) if due or `force`."""
        import numpy as np

        wait = max(self.every, 20 * self._cost) if self.every > 0 else 0.0  # 0: every call
        if not force and self._clock() - self._last < wait:
            return
        start = self._clock()
        state = arrays()
        _atomic(self.path, lambda f: np.savez(f, **state), binary=True)
        self._last = self._clock()
        self._cost = self._last - start

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
