"""Dataset names -> rows, from the hub or a local directory, with the same schema.

Local layout (that of `../shared/data`, named by --data-dir or PECLI_DATA_DIR):
    imdb/{train,test}.parquet             id, label, rating, text
    truthfulqa/TruthfulQA.csv             the original CSV (generation)
    truthfulqa/mc_task.json               the multiple-choice items
A user's own CSV / JSONL / parquet file is also a dataset: pass its path.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pecli.runs.errors import DataError
from pecli.runs.registry import Registry


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    hub_id: str
    hub_config: str | None
    splits: tuple[str, ...]
    text_field: str  # default text column
    label_field: str | None  # stratify --limit by it
    local: Callable[[Path, str], pd.DataFrame]  # (data_dir, split) -> frame in the hub schema
    local_files: Callable[[str], str]  # split -> path relative to the data dir
    description: str


@dataclass
class TextData:
    """Rows of one dataset split after --limit, and where they came from."""

    frame: pd.DataFrame
    dataset: str
    split: str
    source: str  # "hub" or "local"
    revision: str  # hub fingerprint or sha256 of the local file
    text_field: str
    label_field: str | None
    total_rows: int  # rows of the split before --limit

    def texts(self, field: str | None = None) -> list[str]:
        """The text column; `a+b` joins columns with a space (e.g. question+best_answer)."""
        fields = (field or self.text_field).split("+")
        missing = [f for f in fields if f not in self.frame.columns]
        if missing:
            raise DataError(
                f"{self.dataset}/{self.split} has no column {missing[0]!r}; "
                f"columns: {', '.join(map(str, self.frame.columns))} (choose with --text-field)"
            )
        empty = self.frame[fields].isna().any(axis=1)
        if empty.any():
            rows = [str(i + 1) for i in np.flatnonzero(empty.to_numpy())[:5]]  # 1-based
            raise DataError(
                f"{self.dataset}/{self.split}: {int(empty.sum())} row(s) have no text in "
                f"{'+'.join(fields)!r} (data rows {', '.join(rows)}"
                f"{', ...' if empty.sum() > 5 else ''}); drop or fill them"
            )
        parts = [self.frame[f].astype(str) for f in fields]
        joined = parts[0]
        for p in parts[1:]:
            joined = joined + " " + p
        blank = joined.str.strip() == ""
        if blank.any():
            rows = [str(i + 1) for i in np.flatnonzero(blank.to_numpy())[:5]]  # 1-based
            raise DataError(
                f"{self.dataset}/{self.split}: {int(blank.sum())} row(s) hold only whitespace in "
                f"{'+'.join(fields)!r} (data rows {', '.join(rows)}{', ...' if blank.sum() > 5 else ''}); "
                "drop them")
        return joined.tolist()

    def text_ids(self) -> list[int]:
        """Each row's index in the source split (stable under --limit)."""
        return self.frame["text_id"].tolist() if "text_id" in self.frame else list(range(len(self.frame)))

    def labels(self) -> list[int] | None:
        return None if self.label_field is None else self.frame[self.label_field].tolist()

    def provenance(self) -> dict:
        return {
            "dataset": self.dataset,
            "split": self.split,
            "data_source": self.source,
            "data_revision": self.revision,
            "rows": len(self.frame),
            "split_rows": self.total_rows,
        }


DATASETS: Registry[DatasetSpec] = Registry("dataset", DataError)


def _imdb_local(root: Path, split: str) -> pd.DataFrame:
    return pd.read_parquet(root / "imdb" / f"{split}.parquet")


def _split_answers(cell: str) -> list[str]:
    # The hub builder's rule: split on ';' and strip each answer.
    return [a.strip() for a in str(cell).strip().split(";")]


def _truthfulqa_generation_local(root: Path, split: str) -> pd.DataFrame:
    raw = pd.read_csv(root / "truthfulqa" / "TruthfulQA.csv", keep_default_na=False)
    raw = raw[(raw["Correct Answers"] != "") & (raw["Incorrect Answers"] != "")]
    return pd.DataFrame({
        "type": raw["Type"], "category": raw["Category"], "question": raw["Question"],
        "best_answer": raw["Best Answer"],
        "correct_answers": raw["Correct Answers"].map(_split_answers),
        "incorrect_answers": raw["Incorrect Answers"].map(_split_answers),
        "source": raw["Source"],
    }).reset_index(drop=True)


def _truthfulqa_mc_local(root: Path, split: str) -> pd.DataFrame:
    items = json.loads((root / "truthfulqa" / "mc_task.json").read_text(encoding="utf-8"))

    def targets(d: dict) -> dict:
        return {"choices": list(d), "labels": list(d.values())}

    return pd.DataFrame([
        {"question": it["question"], "mc1_targets": targets(it["mc1_targets"]),
         "mc2_targets": targets(it["mc2_targets"])}
        for it in items
    ])


for _d in [
    DatasetSpec("imdb", "stanfordnlp/imdb", None, ("test", "train"), "text", "label",
                _imdb_local, lambda s: f"imdb/{s}.parquet",
                "Large Movie Review Dataset (Maas et al. 2011): text, label 0/1"),
    DatasetSpec("truthfulqa", "truthfulqa/truthful_qa", "generation", ("validation",),
                "question", None, _truthfulqa_generation_local,
                lambda s: "truthfulqa/TruthfulQA.csv",
                "TruthfulQA generation (817 questions): question, best_answer, answers, category"),
    DatasetSpec("truthfulqa-mc", "truthfulqa/truthful_qa", "multiple_choice", ("validation",),
                "question", None, _truthfulqa_mc_local, lambda s: "truthfulqa/mc_task.json",
                "TruthfulQA multiple_choice: question, mc1_targets, mc2_targets"),
]:
    DATASETS.add(_d.name, _d)


# Where the datasets are when nothing says otherwise: shared/data beside the project folder,
# the same whether pecli is started by make or directly (a pip-installed pecli has none).
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def data_dir(explicit: str | Path | None = None) -> Path | None:
    """The local data directory: the flag, else PECLI_DATA_DIR, else DEFAULT_DATA_DIR
    (../shared/data beside the project) if it exists, else None: the hub. PECLI_DATA_DIR set
    empty asks for the hub."""
    env = os.environ.get("PECLI_DATA_DIR")
    chosen = explicit or env
    if not chosen:
        return DEFAULT_DATA_DIR if env is None and DEFAULT_DATA_DIR.is_dir() else None
    path = Path(chosen).expanduser()
    if path.exists() and not path.is_dir():
        raise DataError(f"data directory {path} is a file, not a directory; point --data-dir or "
                        "PECLI_DATA_DIR at the folder (the layout of shared/data)")
    if not path.is_dir():
        raise DataError(f"data directory {path} does not exist; point --data-dir or PECLI_DATA_DIR at it")
    return path


def _read_jsonl(source, path: Path) -> pd.DataFrame:
    """One JSON object per line; a bad line is named by its number (pandas gives a byte offset)."""
    rows, lines = [], []
    with io.TextIOWrapper(source, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}: line {number} is not valid JSON ({err.msg}, column "
                                f"{err.colno}); fix or delete that line") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}: line {number} is not a JSON object ({{\"text\": ...}})")
            rows.append(row)
            lines.append(number)
    frame = pd.DataFrame(rows)
    frame.attrs["lines"] = lines  # the file's line of each row, for the text check
    return frame


CUSTOM_READERS = {  # suffix (any case) -> read(bytes buffer, path)
    ".csv": lambda f, _: pd.read_csv(f),
    ".tsv": lambda f, _: pd.read_csv(f, sep="\t"),
    ".parquet": lambda f, _: pd.read_parquet(f),
    ".jsonl": _read_jsonl,
    ".json": lambda f, _: pd.read_json(f),
}
FORMATS = "CSV, TSV, JSON, JSONL or parquet"


def names_a_path(name: str) -> bool:
    """Whether `name`, no dataset pecli knows, is meant as a path (a separator, or a folder)."""
    return name not in DATASETS and (os.sep in name or "/" in name or Path(name).expanduser().is_dir())


def load_data(dataset: str, split: str | None = None, *, data_dir_: str | Path | None = None,
              limit: int | None = None, seed: int = 0, text_field: str | None = None,
              at_most: bool = False) -> TextData:
    """Load a split (hub or local), then draw a seeded `limit`-row subset.

    A `limit` beyond the data's rows is an error, or with `at_most` (a command's default
    size, not the user's number) every row.

    The subset is stratified by label where there is one: the local IMDB files are
    sorted by label, so "the first N rows" would all be negative.
    """
    path = Path(dataset).expanduser()
    if path.suffix.lower() in CUSTOM_READERS:
        data = _load_custom(path, text_field)
    elif (path.suffix or os.sep in dataset) and path.exists() and not path.is_dir():
        raise DataError(f"{path} exists but its format ({path.suffix or 'no suffix'}) is not "
                        f"supported; give a {FORMATS} file (by its suffix)")
    elif names_a_path(dataset):
        raise DataError(f"{path} is not a data file; give a {FORMATS} file or a dataset "
                        f"({', '.join(DATASETS)})")
    else:
        spec = DATASETS.get(dataset)
        split = split or spec.splits[0]
        if split not in spec.splits:
            raise DataError(f"split {split!r} not in {dataset} (available: {', '.join(spec.splits)})")
        root = data_dir(data_dir_)
        data = _load_local(spec, root, split) if root else _load_hub(spec, split)
        data.text_field = text_field or spec.text_field
    what = f"{data.dataset}/{data.split}"
    if len(data.frame) == 0:
        raise DataError(f"{what} has no rows; give data with at least one text")
    data.texts()  # fail now on a wrong text column, before any model runs
    if at_most and limit is not None:
        limit = min(limit, len(data.frame))
    data.frame = subset(data.frame, limit, seed, data.label_field, what)
    return data


def subset(frame: pd.DataFrame, limit: int | None, seed: int, label: str | None, what: str) -> pd.DataFrame:
    """A seeded random subset of `limit` rows, balanced across labels (round robin).

    Each row keeps `text_id`, its index in `frame` (the source split), so a per-text result
    can be traced back and joined across runs whatever the limit."""
    if "text_id" not in frame.columns:
        frame = frame.assign(text_id=np.arange(len(frame)))
    if limit is None:
        return frame.reset_index(drop=True)
    if limit <= 0:
        raise DataError(f"--limit must be a positive number of rows (got {limit})")
    if limit > len(frame):
        raise DataError(f"--limit {limit} exceeds the {len(frame)} rows of {what}; use --limit {len(frame)} or less")
    rng = np.random.default_rng(seed)
    if label is None:
        order = rng.permutation(len(frame))
    else:
        codes, values = pd.factorize(frame[label], use_na_sentinel=False)  # missing: a group too
        try:
            order = sorted(range(len(values)), key=lambda k: values[k])
        except TypeError:  # labels of mixed types (refused where labels are used)
            order = sorted(range(len(values)), key=lambda k: repr(values[k]))
        groups = [rng.permutation(np.flatnonzero(codes == k)) for k in order]
        # Interleave the shuffled label groups so any prefix is balanced.
        order = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
    return frame.iloc[np.asarray(order[:limit])].reset_index(drop=True)


def _load_local(spec: DatasetSpec, root: Path, split: str) -> TextData:
    from pecli.runs.provenance import file_revision

    file = root / spec.local_files(split)
    if not file.exists():
        raise DataError(
            f"{file} is missing: the data directory {root} has no {spec.name}/{split} "
            f"(expected {spec.local_files(split)}, the layout of shared/data)"
        )
    frame = spec.local(root, split)
    return TextData(frame, spec.name, split, "local", file_revision(file),
                    spec.text_field, spec.label_field, len(frame))


def _load_hub(spec: DatasetSpec, split: str) -> TextData:
    from pecli.runs.hub import hub_reachable

    if not hub_reachable():
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # try the datasets cache only
    import datasets

    datasets.disable_progress_bars()  # pecli shows its own progress; theirs would flood a log
    try:
        ds = datasets.load_dataset(spec.hub_id, spec.hub_config, split=split)
    except Exception as err:  # datasets raises many types for "not reachable / not cached"
        raise DataError(
            f"cannot load {spec.hub_id} ({spec.hub_config or 'default'}/{split}) from the hub "
            f"({type(err).__name__}); pass --data-dir DIR or set PECLI_DATA_DIR to a local copy "
            "(layout of shared/data)"
        ) from None
    frame = ds.to_pandas()
    return TextData(frame, spec.name, split, "hub", f"fingerprint:{ds._fingerprint}",
                    spec.text_field, spec.label_field, len(frame))


# What a data file may hold: read whole and tokenised a text at a time, past these it would
# take more memory than a machine has (a 200 MB text grew past 10 GB while tokenising)
MAX_DATA_BYTES = 64 * 2**20
MAX_TEXT_CHARS = 1_000_000  # characters of one text (a row's text column)


def _read_bounded(path: Path) -> bytes:
    """The file's bytes, at most MAX_DATA_BYTES (a FIFO too), else a one-line DataError."""
    with open(path, "rb") as f:
        raw = f.read(MAX_DATA_BYTES + 1)
    if len(raw) > MAX_DATA_BYTES:
        raise DataError(f"data file {path} holds more than {MAX_DATA_BYTES // 2**20} MiB, the "
                        "most pecli reads; take a sample of its rows into a smaller file")
    return raw


def _refuse_non_text(frame: pd.DataFrame, column: str, path: Path) -> None:
    """A text column holding numbers, lists, dicts or booleans (JSON, JSONL, parquet) is refused
    with its line, not turned into strings and scored."""
    if column not in frame.columns:
        return
    values = frame[column].tolist()
    bad = next((i for i, v in enumerate(values) if not isinstance(v, str) and not
                (isinstance(v, float) and math.isnan(v)) and v is not None), None)
    if bad is not None:
        lines = frame.attrs.get("lines")
        where = f"line {lines[bad]}" if lines else f"data row {bad + 1}"
        raise DataError(f"{path.name}: {where}: {column!r} is {type(values[bad]).__name__} "
                        f"{str(values[bad])[:40]!r}, not a string; give text (quote it)")


def _load_custom(path: Path, text_field: str | None) -> TextData:

    if not path.exists():
        raise DataError(f"data file {path} does not exist")
    raw = _read_bounded(path)  # read once: a FIFO gives its bytes once, and the hash is of them
    try:
        frame = CUSTOM_READERS[path.suffix.lower()](io.BytesIO(raw), path)
    except DataError:
        raise
    except UnicodeDecodeError:
        try:
            raw.decode("utf-8")
            where = ""
        except UnicodeDecodeError as err:  # where in the whole file (pandas reports its chunk)
            line = raw[:err.start].count(b"\n") + 1
            where = f" (byte 0x{raw[err.start]:02x} on line {line})"
        raise DataError(f"cannot read {path}: not UTF-8 text{where}; re-encode it, e.g. "
                        f"`iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8{path.suffix}`") from None
    except Exception as err:
        raise DataError(f"cannot read {path}: {(str(err).splitlines() or [type(err).__name__])[0]}") from None
    field = text_field or "text"
    if field.split("+")[0] not in frame.columns:
        raise DataError(
            f"{path.name} has no text column {field!r}; columns: {', '.join(map(str, frame.columns))} "
            "(name one with --text-field)"
        )
    for column in field.split("+"):
        if path.suffix.lower() in (".json", ".jsonl", ".parquet"):  # typed values (CSV's are text)
            _refuse_non_text(frame, column, path)
        if column in frame.columns:
            chars = frame[column].astype(str).str.len()
            if len(chars) and chars.max() > MAX_TEXT_CHARS:
                raise DataError(f"{path.name}: data row {int(chars.idxmax()) + 1} of {column!r} holds "
                                f"{chars.max():,} characters, past the {MAX_TEXT_CHARS:,} pecli "
                                "tokenises at once; split it into rows (documents)")
    label = "label" if "label" in frame.columns else None
    return TextData(frame, path.name, "file", "local", "sha256:" + hashlib.sha256(raw).hexdigest()[:16],
                    field, label, len(frame))


def dataset_availability(spec: DatasetSpec, root: Path | None) -> tuple[str, str]:
    """(status, how to get it) for `pecli datasets`."""
    if root is not None:
        missing = [s for s in spec.splits if not (root / spec.local_files(s)).exists()]
        if not missing:
            return f"local ({root})", ""
        return f"local copy lacks {', '.join(missing)}", f"add {spec.local_files(missing[0])} under {root}"
    from pecli.runs.hub import hub_reachable

    if hub_reachable():
        return "hub (reachable)", ""
    return "missing (hub unreachable)", "set PECLI_DATA_DIR=../shared/data or pass --data-dir"
