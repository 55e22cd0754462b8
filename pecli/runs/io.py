"""Run directories and all-or-nothing writes: a results file, or a run's whole set of
outputs, is either complete or absent. Files follow the user's umask, like any Unix tool."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from pecli.runs.errors import OutputError
from pecli.runs.provenance import cpu_kernels, git_state, library_versions, read_sha256, utc_now
from pecli.runs.tables import resolved

# Tables longer than this are written gzipped (`.csv.gz`, which pandas reads as it is): their
# repeated provenance columns compress some 50-fold.
GZIP_ROWS = 10_000


def umask() -> int:
    """The process umask (read by setting it and putting it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def cache_dir() -> Path:
    """pecli's own cache (dequantised GGUF models, trained checkpoints, interrupted runs):
    PECLI_CACHE_DIR or the user cache."""
    env = os.environ.get("PECLI_CACHE_DIR")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("pecli"))


def _share(path: Path, directory: bool = False) -> None:
    # mkstemp / mkdtemp create 0600 / 0700; give what open() / mkdir() would (0644 / 0755 under 022).
    os.chmod(path, (0o777 if directory else 0o666) & ~umask())


def _atomic(path: Path, write, binary: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="")) as f:
            write(f)
        _share(Path(tmp))
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


def write_text(text: str, path: Path) -> Path:
    return _atomic(Path(path), lambda f: f.write(text))


def run_meta(config: dict) -> dict:
    """The sidecar of a table: resolved config, versions, git state, time."""
    return {"config": config, "created": utc_now(), **library_versions(), "cpu_kernels": cpu_kernels(),
            **git_state()}


def default_out_dir(command: str) -> Path:
    """Ad-hoc runs go under runs/<command>/<UTC time>-<commit> (gitignored)."""
    stamp = utc_now().replace(":", "").replace("-", "")
    return Path("runs") / command / f"{stamp}-{git_state()['git_commit']}"


def write_table(df: pd.DataFrame, out_dir: Path, name: str, config: dict) -> Path:
    """Write `<name>.csv` (`.csv.gz` past GZIP_ROWS rows) and `<name>.json` (its sidecar) into
    out_dir; return the CSV path."""
    out_dir = Path(out_dir)
    csv = write_csv(df, out_dir / f"{name}.csv{'.gz' if len(df) > GZIP_ROWS else ''}")
    write_json({**run_meta(config), "resolved": resolved(df), "table_rows": len(df),
                "table_sha256": read_sha256(csv)}, sidecar_of(csv))
    return csv


def sidecar_of(table: Path) -> Path:
    """The JSON sidecar `write_table` writes beside a table: <name>.json for <name>.csv(.gz)."""
    return table.with_name(f"{table.name.split('.')[0]}.json")


def read_sidecar(table: Path) -> dict:
    """A table's sidecar (`sidecar_of`), {} where it has none; ValueError where the sidecar is
    not a JSON object (cut short, edited)."""
    side = sidecar_of(table)
    if not side.exists():
        return {}
    meta = json.loads(side.read_text(encoding="utf-8"))
    if not isinstance(meta, dict):
        raise ValueError(f"{side.name} is not a JSON object")
    return meta


def _distinct(column: pd.Series):
    """A column's distinct values (a provenance column of a million rows has one), or all of
    them where some cannot be hashed."""
    try:
        return pd.unique(column)
    except TypeError:
        return column


def _reason(err: OSError) -> str:
    return err.strerror or str(err) or type(err).__name__


MANIFEST = ".pecli-run.json"  # in an output folder: which run wrote it, and its files
SIDECAR_KEYS = {"config", "created"}  # a table's JSON sidecar (run_meta), from before manifests


def is_worker() -> bool:
    """A non-main process of a torchrun/accelerate launch: it computes a share and writes
    nothing (read from the launcher's environment, so that this module stays torch-free)."""
    return os.environ.get("RANK", "0") not in ("", "0")


class _Hold:
    """This process's hold on one output folder: an exclusive flock on `.<name>.lock` beside
    it (released by the kernel however the process ends), re-entrant within the process."""

    held: dict[Path, _Hold] = {}

    def __init__(self, lock: Path, fd: int):
        self.lock, self.fd, self.depth = lock, fd, 0
        self.replaced: list[Path] = []  # an earlier run's files that --force replaces at commit


def _acquire(target: Path) -> _Hold:
    import fcntl

    lock = target.parent / f".{target.name}.lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666 & ~umask())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 400).decode(errors="replace").strip() or "another pecli run"
            os.close(fd)
            raise OutputError(f"{target} is being written by another run ({holder}); wait for "
                              "it to finish or choose another --out") from None
        try:  # the file we locked may have been unlinked by a run that just released it
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}: {' '.join(['pecli', *sys.argv[1:]])[:300]}".encode())
    return _Hold(lock, fd)


def _release(hold: _Hold) -> None:
    hold.lock.unlink(missing_ok=True)  # while still locked: a waiting run re-checks the inode
    os.close(hold.fd)


def _stale_staging(target: Path) -> list[Path]:
    """Staging folders of runs that died before they could remove them (the caller holds
    the lock, so no live run owns them)."""
    found = list(target.parent.glob(f".{target.name}.partial-*"))
    if target.is_dir():
        found += list(target.glob(".partial-*"))
    return [p for p in found if p.is_dir()]


def _earlier_run(target: Path) -> tuple[dict, list[Path]] | None:
    """(the key the earlier run in `target` recorded, its files), or None for a folder that
    holds no pecli outputs. Folders written before manifests are known by their sidecars."""
    if not target.is_dir():
        return None
    manifest = target / MANIFEST
    if manifest.exists():
        try:
            record = json.loads(manifest.read_text(encoding="utf-8"))
            return record["key"], [target / f for f in record["files"]]
        except (ValueError, OSError, KeyError, TypeError):
            return {"manifest": "unreadable"}, []
    files, keys = [], set()
    for side in target.rglob("*.json"):
        try:
            meta = json.loads(side.read_text(encoding="utf-8"))
        except (ValueError, OSError, UnicodeDecodeError):
            continue
        if isinstance(meta, dict) and SIDECAR_KEYS <= meta.keys():
            stem = side.with_suffix("")
            files += [side, *(t for t in (stem.with_suffix(".csv"), stem.with_suffix(".csv.gz"))
                              if t.exists())]
            config = meta["config"] if isinstance(meta["config"], dict) else {}
            keys.add(json.dumps({"command": "reproduce", "preset": config["preset"]} if "preset" in config
                                else config, sort_keys=True))
    files += [f for f in (target / "REPORT.md",) if f.exists()]
    if not files:
        return None
    return (json.loads(keys.pop()) if len(keys) == 1 else {"written": "by several pecli runs"}), files


def _plain(key: dict | None) -> dict | None:
    """`key` as it reads back from JSON (tuples as lists, paths as strings), so that a key
    compares equal to its recorded self."""
    return None if key is None else json.loads(json.dumps(key, sort_keys=True, default=str))


def _differences(old: dict, new: dict) -> str:
    changed = [k for k in sorted({*old, *new}) if old.get(k) != new.get(k)]
    shown = "; ".join(f"{k}: {str(old.get(k, '-'))[:40]} -> {str(new.get(k, '-'))[:40]}"
                      for k in changed[:3])
    return shown + (f"; and {len(changed) - 3} more" if len(changed) > 3 else "")


@contextmanager
def hold(target: Path, key: dict | None = None, *, force: bool = False):
    """Own the output folder `target` for the run's lifetime.

    - Held by another live run: a one-line OutputError (two runs never both succeed).
    - Holding the finished outputs of another command or configuration (another `key`): a
      one-line OutputError, unless `force`, which first removes that run's files. The same
      key (a rerun, a resumed preset) writes into it again.
    - Staging folders left by dead runs are removed.
    Re-entrant within a process; a worker process of a parallel launch holds nothing.
    """
    target, key = Path(target).expanduser(), _plain(key)
    if is_worker():
        yield
        return
    where = target.resolve()
    current = _Hold.held.get(where)
    if current is None:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            current = _acquire(target)
        except OSError as err:
            raise OutputError(f"cannot write to {target}: {_reason(err)}; "
                              "choose a writable directory with --out") from None
        try:
            for stale in _stale_staging(target):
                shutil.rmtree(stale, ignore_errors=True)
            current.replaced = _check_earlier(target, key, force) if key is not None else []
        except BaseException:
            _release(current)
            raise
        _Hold.held[where] = current
    current.depth += 1
    try:
        yield
    finally:
        current.depth -= 1
        if current.depth == 0:
            del _Hold.held[where]
            _release(current)


def _check_earlier(target: Path, key: dict, force: bool) -> list[Path]:
    """What --force will replace (nothing for the same key); refuses another run's outputs."""
    earlier = _earlier_run(target)
    if earlier is None:
        return []
    old, files = earlier
    if old == key:
        return []
    if not force:
        what = old.get("command") or old.get("experiment") or "pecli"
        raise OutputError(f"{target} holds the outputs of another {what} run ({_differences(old, key)}); "
                          "choose another --out, or add --force to replace them")
    return [*files, target / MANIFEST, target / "figures"]


def _replace_earlier(target: Path) -> None:
    """With --force: remove the earlier run's files, as the new run's arrive (a run that
    fails leaves the folder as it was)."""
    current = _Hold.held.get(target.resolve())
    for f in current.replaced if current else []:
        if f.is_dir():
            shutil.rmtree(f, ignore_errors=True)
        elif f.is_file():
            f.unlink()
    if current:
        current.replaced = []


def record(target: Path, key: dict, files: list[Path]) -> None:
    """List `files` in the manifest of the run that owns `target` (added to a resumed run's)."""
    manifest = target / MANIFEST
    listed = []
    if manifest.exists():
        try:
            record = json.loads(manifest.read_text(encoding="utf-8"))
            listed = record["files"] if record["key"] == key else []
        except (ValueError, OSError, KeyError, TypeError):
            pass
    names = [Path(os.path.relpath(f, target)).as_posix() for f in files]
    wanted = {"key": key, "files": sorted({*listed, *names})}
    if not (listed and wanted["files"] == sorted(listed)):  # a rerun that adds nothing changes nothing
        write_json(wanted, manifest)


def check_target(target: Path) -> Path:
    """`target` as an output folder can be, or a one-line OutputError before computing: not
    a symlink whose end does not exist (the results could not be moved there at the end),
    not a symlink loop, not a file."""
    target = Path(target).expanduser()
    try:
        os.path.realpath(target, strict=True)
    except FileNotFoundError:
        if target.is_symlink():
            raise OutputError(f"--out {target} is a symlink to {os.readlink(target)}, which does "
                              "not exist; create that folder or give another --out") from None
    except OSError as err:
        looped = err.errno == errno.ELOOP or "loop" in str(err).lower()
        raise OutputError(f"--out {target}: {'a symlink loop' if looped else _reason(err)}; "
                          "give another folder") from None
    except RuntimeError:  # Python < 3.13 reports a loop in a parent so
        raise OutputError(f"--out {target}: a symlink loop; give another folder") from None
    if target.exists() and not target.is_dir():
        raise OutputError(f"--out {target} is a file, not a folder; give a folder for the results")
    return target


class RunOutput:
    """The outputs of one run, all or nothing: the one writer every command uses.

    Created before computing, it takes the output folder for the run's lifetime (`hold`: a
    lock beside it; another run's finished outputs refused unless `force`), checks that
    `target` can be written (a one-line OutputError otherwise) and makes a hidden staging
    folder beside it (inside it, if it exists). Tables, sidecars, figures and checkpoints go
    into the staging folder (`self.dir`); leaving the `with` block normally moves them into
    `target` together (a rename, or a move per file when `target` already holds other files)
    and lists them in its manifest (.pecli-run.json); an exception, Ctrl-C, SIGTERM or SIGHUP
    deletes them. Either way the lock is released. A full disk leaves `target` as it was.
    A checkpoint the run clears while its outputs are open is deleted only once they are in
    place: a run that fails while writing resumes, and need not compute again.

        with RunOutput(out, key) as output:     # fails here, before computing, if unwritable
            frames = run(...)
            csvs, pngs = output.write(frames, config, figures)
        for p in [*csvs.values(), *pngs]: print(p)   # final paths, in place now
    """

    _open: list[RunOutput] = []  # this process's outputs being made, innermost last

    def __init__(self, target: Path, key: dict | None = None, *, force: bool = False):
        self.target = check_target(target)
        self.key = _plain(key)
        self.finished: list[Checkpoint] = []  # cleared once the outputs are in place
        self._hold = hold(self.target, key, force=force)
        self._hold.__enter__()
        try:
            if self.target.exists() and not self.target.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory")
            if is_worker():  # computes a share and writes nothing: stage outside the target
                self.dir = Path(tempfile.mkdtemp(prefix="pecli-worker-"))
            elif self.target.is_dir():  # stage inside it: its parent need not be writable
                self.dir = Path(tempfile.mkdtemp(dir=self.target, prefix=".partial-"))
            else:
                self.target.parent.mkdir(parents=True, exist_ok=True)
                self.dir = Path(tempfile.mkdtemp(dir=self.target.parent,
                                                 prefix=f".{self.target.name}.partial-"))
            _share(self.dir, directory=True)
        except OSError as err:
            self._hold.__exit__(None, None, None)
            raise OutputError(f"cannot write to {self.target}: {_reason(err)}; "
                              "choose a writable directory with --out") from None
        except BaseException:
            self._hold.__exit__(None, None, None)
            raise

    @classmethod
    def check(cls, target: Path, key: dict | None = None, *, force: bool = False) -> None:
        """Fail now (a one-line OutputError) if `target` cannot take a run's outputs."""
        output = cls(target, key, force=force)
        output.__exit__(RuntimeError, None, None)

    def __enter__(self) -> RunOutput:
        RunOutput._open.append(self)
        return self

    def __exit__(self, kind, err, tb) -> None:
        if self in RunOutput._open:
            RunOutput._open.remove(self)
        try:
            if kind is None and not is_worker():
                self.commit()
                for checkpoint in self.finished:
                    checkpoint.clear()
            else:  # a finished run's checkpoints stay, for the rerun to write from
                self.discard()
        finally:
            self._hold.__exit__(None, None, None)

    def final(self, path: Path) -> Path:
        """Where a staged file will be (is, after commit)."""
        return self.target / Path(path).relative_to(self.dir)

    def write(self, frames: dict[str, pd.DataFrame], config: dict, figures=None,
              tables_dir: str = "", figures_dir: str = "figures",
              companions=None) -> tuple[dict[str, Path], list[Path]]:
        """Stage every table (+ sidecar), the files `companions` make from them ({name: maker},
        beside the tables), then `figures(staged csvs, staged folder)` if given.

        Returns the final paths of the tables and figures. A failed write (full disk, ...)
        is a one-line OutputError and nothing reaches `target`.
        """
        try:
            frames = {name: self._relocated(df) for name, df in frames.items()}
            csvs = {name: write_table(df, self.dir / tables_dir, name, config)
                    for name, df in frames.items()}
            for name, make in (companions or {}).items():
                write_text(make(frames), self.dir / tables_dir / name)
            pngs = with_formats(figures(csvs, self.dir / figures_dir)) if figures else []
        except OSError as err:
            self.discard()
            raise OutputError(f"could not write the results to {self.target}: {_reason(err)}; "
                              "nothing was written (free some space or choose another --out)") from None
        return {n: self.final(p) for n, p in csvs.items()}, [self.final(p) for p in pngs]

    def _relocated(self, df: pd.DataFrame) -> pd.DataFrame:
        """Paths into the staging folder (a checkpoint saved during the run) as they will be,
        also inside a name (a mask file's `file:PATH#sha256:D`)."""
        staged = str(self.dir)
        for col in df.select_dtypes(include=["object", "string"]).columns:
            if any(isinstance(v, str) and staged in v for v in _distinct(df[col])):
                df = df.assign(**{col: df[col].map(
                    lambda v: v.replace(staged, str(self.target)) if isinstance(v, str) else v)})
        return df

    def commit(self) -> None:
        if not self.dir.exists():
            return
        if not any(self.dir.iterdir()):  # a run that wrote nothing leaves nothing
            self.dir.rmdir()
            return
        files = [self.final(f) for f in self.dir.rglob("*") if f.is_file()]
        try:
            _replace_earlier(self.target)
            if not self.target.exists():
                os.replace(self.dir, self.target)
            else:
                _merge(self.dir, self.target)
                shutil.rmtree(self.dir, ignore_errors=True)
            if self.key is not None:
                record(self.target, self.key, files)
        except OSError as err:
            raise OutputError(f"could not move the results into {self.target}: {_reason(err)}; "
                              f"they are complete in {self.dir}") from None

    def discard(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".json")  # a figure's formats and its title sidecar


def with_formats(figures) -> list[Path]:
    """Each figure a function returned, followed by its other formats (--format) and its
    short-title sidecar, where they were written beside it."""
    out: list[Path] = []
    for fig in map(Path, figures):
        out += [fig] + [fig.with_suffix(s) for s in FIGURE_SUFFIXES
                        if s != fig.suffix and fig.with_suffix(s).is_file()]
    return list(dict.fromkeys(out))


def _merge(src: Path, dst: Path) -> None:
    """Move src's files into the existing folder dst (renames only: no space needed)."""
    for item in sorted(src.iterdir()):
        target = dst / item.name
        if item.is_dir() and target.is_dir():
            _merge(item, target)
        else:
            if target.is_dir():
                shutil.rmtree(target)
            os.replace(item, target)


# A forked worker (run_jobs) computes inside its parent's outputs but never finishes them: it
# starts with none of its own, so its finished progress is deleted, not deferred forever.
os.register_at_fork(after_in_child=RunOutput._open.clear)


class Checkpoint:
    """Partial results of a long loop, so that an interrupted run resumes where it stopped.

    Saved atomically (an .npz of named arrays) at most every `every` seconds, and never
    more often than 20 times the last save took (at most 5 % of the time goes to saving as
    the arrays grow; `every=0` saves at every call), under <cache>/partial/<kind>-<hash>.npz.
    The hash covers `key` (everything else that determines the numbers) and the input
    `texts`; a rerun with the same hash loads the file, a finished run deletes it (once its
    outputs are in place, where a RunOutput is open: `clear`).

    Faults: a file that cannot be read back whole (truncated, overwritten, another key's)
    is renamed to `<name>.damaged` with a warning and the run starts afresh. Two runs with
    the same hash at once: the first holds a lock (`<name>.lock`, released when its process
    ends, however it ends); the second neither reads nor writes the file.
    """

    _live: list[Checkpoint] = []  # this process's checkpoints, for the Ctrl-C message

    def __init__(self, kind: str, key: dict, texts: list[str], every: float = 60.0):
        import hashlib
        import time

        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode())
        digest.update("\x00".join(texts).encode())
        self.digest = digest.hexdigest()
        self.path = cache_dir() / "partial" / f"{kind}-{self.digest[:20]}.npz"
        self.every, self._clock = every, time.monotonic
        self._last, self._cost = self._clock(), 0.0
        self._lock = None
        self.shared = False  # True: another run holds this key; this one saves nothing
        self._keep = None  # clear(keep=...): what other runs with this key still need
        Checkpoint._live.append(self)

    def _acquire(self) -> bool:
        """Hold the lock of this key (once); False if another live process holds it."""
        import fcntl

        if self._lock is not None or self.shared:
            return not self.shared
        for other in Checkpoint._live:  # an interrupted run of this process: take its lock over
            if other is not self and other.path == self.path and other._lock is not None:
                self._lock, other._lock = other._lock, None
                return True
        lock = self.path.with_suffix(".lock")
        while True:
            try:
                lock.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as err:
                return self._off(f"cannot use {lock.parent} ({_reason(err)}; PECLI_CACHE_DIR)")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return self._off(f"another pecli run with the same configuration is using {self.path}")
            # The holder before us may have deleted the lock file after we opened it: retry.
            if os.path.exists(lock) and os.stat(lock).st_ino == os.fstat(fd).st_ino:
                self._lock = fd
                return True
            os.close(fd)

    def _off(self, why: str) -> bool:
        """Go on without saving or resuming (a checkpoint must never stop the run), say why."""
        self.shared = True
        print(f"warning: {why}; this run will not save or resume progress", file=sys.stderr)
        return False

    def load(self) -> dict | None:
        import numpy as np

        if not self._acquire() or not self.path.exists():
            return None
        try:
            with np.load(self.path, allow_pickle=False) as saved:
                arrays = {name: saved[name] for name in saved.files}  # reads (and CRC-checks) all
            if str(arrays.pop("_pecli_key", "")) != self.digest:
                raise ValueError("it belongs to another configuration")
        except Exception as err:  # noqa: BLE001 (zip, npy and value errors alike mean: unusable)
            aside = self.path.with_name(self.path.name + ".damaged")
            os.replace(self.path, aside)
            print(f"warning: saved progress {self.path.name} is damaged "
                  f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                  f"set aside as {aside}, starting afresh", file=sys.stderr)
            return None
        return arrays

    def save(self, arrays, force: bool = False) -> None:
        """Write `arrays()` (a dict of arrays, built only when a save is due) if due or `force`."""
        import numpy as np

        wait = max(self.every, 20 * self._cost) if self.every > 0 else 0.0  # 0: every call
        if not force and self._clock() - self._last < wait:
            return
        if not self._acquire():
            return
        start = self._clock()
        state = {**arrays(), "_pecli_key": np.array(self.digest)}
        try:
            _atomic(self.path, lambda f: np.savez(f, **state), binary=True)
        except OSError as err:  # a full disk: the last saved progress stays as it was
            self._off(f"could not save progress to {self.path} ({_reason(err)})")
            return
        self._last = self._clock()
        self._cost = self._last - start

    def save_outputs(self, done: dict[tuple, list[str]]) -> None:
        """Save decoded texts by cell now (`done`: a JSON-able tuple key -> the cell's outputs,
        as passkey and ruler decode them)."""
        import numpy as np

        self.save(lambda: {"keys": np.array([json.dumps(k) for k in done]),
                           **{f"out{j}": np.array(out, dtype=str) for j, out in enumerate(done.values())}},
                  force=True)

    def load_outputs(self) -> dict[tuple, list[str]]:
        """What `save_outputs` saved ({} where nothing was, or it was set aside as damaged)."""
        saved = self.load()
        if saved is None:
            return {}
        return {tuple(json.loads(str(k))): [str(x) for x in saved[f"out{j}"]]
                for j, k in enumerate(saved["keys"])}

    def saved(self) -> bool:
        """Whether this run has progress on disk to resume from."""
        return self._lock is not None and self.path.exists()

    def clear(self, keep=None) -> None:
        """Delete the progress of a finished run; inside a RunOutput this process opened, once
        its outputs are in place (a failure writing them keeps it, so the rerun only writes).

        `keep`: what other runs sharing this key still need (a callable returning arrays, as
        `save` takes, or None): saved in its place where it returns any."""
        if keep is not None:
            self._keep = keep
        if RunOutput._open and self not in RunOutput._open[-1].finished:
            RunOutput._open[-1].finished.append(self)
            return
        if self._acquire():
            kept = self._keep() if self._keep else None
            if kept:
                self.save(lambda: kept, force=True)
            else:
                self.path.unlink(missing_ok=True)
                self.path.with_suffix(".lock").unlink(missing_ok=True)
            self.release()

    def release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        if self in Checkpoint._live:
            Checkpoint._live.remove(self)

    @classmethod
    def resumable(cls) -> list[Path]:
        """Progress files this process saved or resumed (and can resume again)."""
        return [cp.path for cp in cls._live if cp.saved()]


def follow_umask(folder: Path) -> None:
    """Give the files of a saved model the mode open() would (safetensors writes 0600)."""
    mask = os.umask(0o022)  # read it by setting it and putting it straight back
    os.umask(mask)
    mode = 0o666 & ~mask
    for file in folder.rglob("*"):
        if file.is_file():
            os.chmod(file, mode)
