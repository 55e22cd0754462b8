"""Run a preset: check everything is reachable, run each experiment once, write a report.

Results of an entry live in `<out>/<entry id>/` and count as done only when its
`done.json` (written last, atomically) carries the key of the entry's full configuration;
a rerun skips done entries, so an interruption loses at most the entry in flight, and
runs again one whose local inputs (a model folder, a fitted mask) or data files changed since.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pecli.experiments import EXPERIMENTS, load_all
from pecli.measures.intervals import DEFAULT_DIFF_COLUMNS, DIFF_COLUMNS, MIN_WINDOWS, proper
from pecli.runs import config
from pecli.runs.config import Entry, Finding, Preset
from pecli.runs.errors import ConfigError
from pecli.runs.io import RunOutput, hold, run_meta, write_json, write_text
from pecli.runs.io import record as list_in_manifest


def load_preset(name_or_path: str, overrides: dict | None = None) -> Preset:
    """`config.load_preset` checked against every registered experiment."""
    return config.load_preset(name_or_path, overrides, experiments=load_all())


@dataclass
class EntryResult:
    entry: Entry
    tables: dict[str, Path]
    figures: list[Path]
    skipped: bool
    seconds: float
    companions: list[Path]  # files made from its tables (ruler's samples as JSONL)


def _map_models(options: dict, fn: Callable[[str], str]) -> dict:
    """`options` with every model name passed through `fn`: `model`, `models`, and the
    NAME of `swap:NAME` in `interventions` / `pe` (a name or a list)."""
    def swap(v):
        return f"swap:{fn(v[5:])}" if isinstance(v, str) and v.startswith("swap:") else v

    out = dict(options)
    if isinstance(out.get("model"), str):
        out["model"] = fn(out["model"])
    if isinstance(out.get("models"), list):
        out["models"] = [fn(m) if isinstance(m, str) else m for m in out["models"]]
    for key in ("intervention", "interventions", "pe"):
        if key in out:
            values = out[key]
            out[key] = [swap(v) for v in values] if isinstance(values, list) else swap(values)
    return out


def _models_of(options: dict) -> list[str]:
    names: list[str] = []
    _map_models(options, lambda name: names.append(name) or name)
    return names


def located(options: dict) -> dict:
    """Options with relative model paths that exist only in the project (the committed
    models/tiny-gpt2-imdb) made absolute, so a preset runs from any directory. The entry's
    key keeps the preset's own spelling."""
    from pecli.runs.config import CONFIG_DIR

    def find(name: str) -> str:
        if not Path(name).exists() and (CONFIG_DIR.parent / name).exists():
            return str(CONFIG_DIR.parent / name)
        return name

    return _map_models(options, find)


def local_inputs(options: dict) -> dict[str, str]:
    """The local files an entry reads, by the preset's spelling, each with the digest its rows
    record: a model folder's weights (`model_revision`), a fitted mask (`PATH#sha256:D`), a
    haystack file."""
    from pecli.models.loading import weights_sha256
    from pecli.runs.names import mask_path
    from pecli.runs.provenance import file_revision

    found = {name: weights_sha256(Path(path)) for name, path in
             zip(_models_of(options), _models_of(located(options)), strict=True) if Path(path).is_dir()}
    masks = options.get("mask")
    files = [mask_path(str(m)) for m in (masks if isinstance(masks, list) else [masks] if masks else [])]
    files += [options["haystack"]] if isinstance(options.get("haystack"), str) else []
    found |= {f: file_revision(Path(f)) for f in files if Path(f).is_file()}
    return found


def changed_inputs(now: dict[str, str], record: dict) -> str:
    """Why a finished entry's results no longer hold ('' while they do): a local input (`now`,
    `local_inputs`) whose digest is not the one its record (`as_recorded`) keeps."""
    then = record["inputs"]
    return "; ".join(f"its input {name} changed since it ran ({then.get(name, 'not in its tables')} then, "
                     f"{digest} now)" for name, digest in now.items() if then.get(name) != digest)


def local_data(root: Path | None) -> dict[str, str]:
    """Every dataset file of the data directory `root` (its layout, e.g. imdb/test.parquet),
    with the digest a row's `data_revision` gives it; none where the data come from the hub."""
    from pecli.data.datasets import DATASETS
    from pecli.runs.provenance import file_revision

    if root is None:
        return {}
    files = sorted({spec.local_files(split) for spec in DATASETS.values() for split in spec.splits})
    return {f: file_revision(root / f) for f in files if (root / f).is_file()}


def data_read(frames, files: dict[str, str]) -> dict[str, str]:
    """The data files (`local_data`) whose digest the frames' rows record in a `*data_revision`
    column (the data scored, a training split, a haystack, RULER's qa items): what a section read."""
    recorded: set[str] = set()
    for frame in frames:
        for column in (c for c in frame.columns if str(c).endswith("data_revision")):
            recorded |= set(frame[column].dropna().astype(str))
    return {name: digest for name, digest in files.items() if digest in recorded}


def untrusted_tables(record: dict, folder: Path) -> str:
    """Why a finished section's tables in `folder` cannot be trusted ('' where they can): one
    its done.json names is missing, or its bytes are not those its sidecar's sha256 recorded."""
    from pecli.runs.io import read_sidecar, sidecar_of
    from pecli.runs.provenance import read_sha256

    why = []
    for file in record["tables"].values():
        path, side = folder / file, sidecar_of(folder / file)
        try:
            written = read_sidecar(path).get("table_sha256")
        except ValueError:  # not JSON, or not an object
            why.append(f"its table's sidecar {side.name} is not readable")
            continue
        if not path.exists():
            why.append(f"its table {file} is missing")
        elif written and read_sha256(path) != written:
            why.append(f"its table {file} changed after it was written (its sha256 is not {side.name}'s)")
    return "; ".join(why)


def as_recorded(record: dict, folder: Path, inputs: dict[str, str], files: dict[str, str]) -> dict:
    """A finished section's done.json with the local inputs and data files it read. For one
    finished before done.json kept them, those of `inputs` and `files` (`local_inputs`,
    `local_data`) whose digest its tables (checked: `untrusted_tables`) name."""
    import gzip

    if {"inputs", "data"} <= record.keys():
        return record
    text = ""
    for file in record["tables"].values():
        path = folder / file
        with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
            text += f.read()
    named = {name: d for name, d in (inputs | files).items() if d.removeprefix("sha256:") in text}
    found = {"inputs": {n: named[n] for n in inputs if n in named},
             "data": {n: named[n] for n in files if n in named}}
    return {**record, **{key: kept for key, kept in found.items() if key not in record}}


def changed_data(record: dict, files: dict[str, str]) -> str:
    """Why a finished section's results no longer hold for the data directory's files now
    (`files`, `local_data`): one it read (done.json's `data`) whose digest changed."""
    then = record.get("data", {})
    return "; ".join(f"its data {name} changed since it ran ({digest} then, {files[name]} now)"
                     for name, digest in then.items() if name in files and files[name] != digest)


def _data_root(options: dict) -> Path | None:
    from pecli.data.datasets import data_dir
    from pecli.runs.errors import DataError

    try:
        return data_dir(options.get("data_dir"))
    except DataError:  # a section that reads data stopped at preflight; others read none
        return None


def preflight(preset: Preset) -> None:
    """Fail in seconds, before any computation, naming every missing model and dataset (the
    names, types and ranges were checked when the preset's options objects were built)."""
    from pecli.data.datasets import DATASETS, data_dir, dataset_availability
    from pecli.models.sources import missing_models

    missing = missing_models([m for e in preset.entries for m in _models_of(located(e.options))
                              if not Path(m).exists()])
    for entry in preset.entries:
        dataset = entry.options.get("dataset")
        if isinstance(dataset, str) and dataset in DATASETS:
            root = data_dir(entry.options.get("data_dir"))
            status, fix = dataset_availability(DATASETS.get(dataset), root)
            if status.startswith("missing") or "lacks" in status:
                missing.append(f"dataset {dataset!r} ({fix})")
        elif isinstance(dataset, str) and not Path(dataset).exists():
            missing.append(f"data file {dataset!r} (no such file)")
    if missing:
        unique = list(dict.fromkeys(missing))
        raise ConfigError(f"preset {preset.name!r} cannot run here; missing: " + "; ".join(unique))
    _check_rope_types(preset)


def _check_rope_types(preset: Preset) -> None:
    """Every section's rope scalings against transformers' rope types (the condition's check,
    with no model yet): a typo in the last section stops the preset before the first runs."""
    from pecli.positions.conditions import check_all, plan

    for entry in preset.entries:
        try:
            check_all([plan(rope=r) for r in getattr(entry.built, "rope_scaling", None) or ()], None)
        except ConfigError as err:
            raise ConfigError(f"preset {preset.name!r}, section {entry.id} ({entry.experiment}): "
                              f"{err}") from None


def run_preset(preset: Preset, out: Path, force: bool = False,
               announce: Callable[[str], None] = print) -> list[EntryResult]:
    """Run every entry of the preset not already done, write figures and REPORT.md."""
    from pecli.plots.style import figure_output

    preflight(preset)
    owner = {"command": "reproduce", "preset": preset.name}
    with hold(out, owner, force=force), \
            figure_output(preset.format, preset.short_titles, default=True):  # CLI > YAML
        RunOutput.check(out, owner)  # before the first entry computes
        results = _run_entries(preset, out, owner, force, announce)
        write_report(preset, out, results)
        list_in_manifest(out, owner, [out / "REPORT.md", *(f for r in results for f in (
            out / r.entry.id / "done.json", *r.figures, *r.tables.values(), *r.companions,
            *(t.parent / (t.name.split(".")[0] + ".json") for t in r.tables.values())))])
    return results


def _run_entries(preset: Preset, out: Path, owner: dict, force: bool,
                 announce: Callable[[str], None]) -> list[EntryResult]:
    results = []
    for n, entry in enumerate(preset.entries, 1):
        exp = EXPERIMENTS.get(entry.experiment)
        key = entry.key(exp.version)
        folder = out / entry.id
        done = folder / "done.json"
        start = time.perf_counter()
        saved = json.loads(done.read_text()) if not force and done.exists() else {}
        record, finished = saved, saved.get("key") in entry.keys(exp.version)
        inputs = local_inputs(entry.options)  # what it reads, before any run
        files = local_data(_data_root(entry.options))
        stale = ""
        if finished:
            stale = untrusted_tables(record, folder)
            if not stale:
                record = as_recorded(record, folder, inputs, files)
                stale = "; ".join(filter(None, [changed_inputs(inputs, record), changed_data(record, files)]))
        if stale:
            announce(f"[{n}/{len(preset.entries)}] {entry.id}: {stale}; running it again")
        elif finished:
            kept = {**record, "key": key, "inputs": inputs}
            if kept != saved:  # a renaming, or inputs or data kept from now on
                write_json(kept, done)
            announce(f"[{n}/{len(preset.entries)}] {entry.id}: done before (key {key}), skipped")
            tables = {name: folder / file for name, file in record["tables"].items()}
            figures = _redrawn(exp, tables, [_figure_path(p, out) for p in record["figures"]],
                               out / "figures" / entry.id, announce)
            results.append(EntryResult(entry, tables, figures, True, record.get("seconds", 0.0),
                                       _companions(exp, tables, folder, announce)))
            continue
        announce(f"[{n}/{len(preset.entries)}] {entry.id}: {entry.experiment} {entry.options}")
        done.unlink(missing_ok=True)
        config = {"preset": preset.name, "entry": entry.id, "experiment": entry.experiment,
                  "experiment_version": exp.version, "key": key, "options": entry.options}
        with RunOutput(out, owner) as output:  # the entry's tables and figures arrive together or not at all
            options = located(entry.options)
            if exp.files:  # its own files (a fitted mask) go with the entry's tables
                options = {**options, "save_dir": str(output.dir / entry.id / exp.files)}
            frames: dict[str, pd.DataFrame] = exp.run_with(options, entry.id)
            tables, figures = output.write(frames, config, exp.figures, tables_dir=entry.id,
                                           figures_dir=f"figures/{entry.id}", companions=exp.companions)
        seconds = round(time.perf_counter() - start, 1)  # as done.json keeps it: a rerun's REPORT is the same
        write_json({**run_meta(config), "key": key, "inputs": inputs,
                    "data": data_read(frames.values(), files),
                    "tables": {n: p.name for n, p in tables.items()},
                    "seconds": seconds,
                    "figures": [Path(os.path.relpath(p, out)).as_posix() for p in figures]}, done)
        results.append(EntryResult(entry, tables, list(figures), False, seconds,
                                   [folder / name for name in exp.companions or {}]))
    return results


def _redrawn(exp, tables: dict[str, Path], figures: list[Path], fig_dir: Path,
             announce: Callable[[str], None]) -> list[Path]:
    """A finished entry's figures, drawn again from its tables where a format asked for
    (--format, the preset's `format`) or short titles' sidecar is missing; else as they are."""
    from pecli.plots.style import FORMATS, formats, short_titles
    from pecli.runs.io import FIGURE_SUFFIXES, with_formats

    wanted = [f".{f}" for f in formats()] + [".json"] * short_titles()
    shown = list(dict.fromkeys(f.with_suffix(".png") if f.with_suffix(".png").exists() else f
                               for f in figures if f.suffix.lstrip(".") in FORMATS))
    if all(f.with_suffix(s).exists() for f in shown for s in wanted):
        return [f.with_suffix(s) for f in shown for s in FIGURE_SUFFIXES if f.with_suffix(s).exists()]
    announce(f"  drawing its figures again as {', '.join(formats())}")
    return with_formats(exp.figures(tables, fig_dir))


def _companions(exp, tables: dict[str, Path], folder: Path,
                announce: Callable[[str], None]) -> list[Path]:
    """A finished entry's companion files (exp.companions), checked against its tables: one
    missing (a section finished before it had them) or different is written again from them."""
    if not exp.companions:
        return []
    frames = {name: pd.read_csv(path, dtype=str, keep_default_na=False) for name, path in tables.items()}
    paths = []
    for name, make in exp.companions.items():
        path, text = folder / name, make(frames)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            announce(f"  writing {name} from its tables" + (" (it differed from them)" if path.exists() else ""))
            write_text(text, path)
        paths.append(path)
    return paths


def _figure_path(recorded: str, out: Path) -> Path:
    """A figure named in done.json: relative to `out` (so a copied folder still works), or
    as older runs wrote it, `<out as given then>/figures/...`."""
    path = Path(recorded)
    if path.parts and path.parts[0] == "figures":
        return out / path
    if "figures" in path.parts:
        return out / Path(*path.parts[path.parts.index("figures"):])
    return path


def _lookup(csv: Path, where: dict, fmt: str) -> str:
    """The value of the single row of `csv` matching `where`, with its 95 % interval when the
    table has one (`0.6918 [0.6871, 0.6965]`); '—' and the reason unless exactly one matches."""
    df = pd.read_csv(csv, low_memory=False)
    for col, want in where.items():
        if col not in df.columns:
            return f"— (no column {col})"
        df = df[df[col].astype(str) == str(want)]
    if len(df) != 1:
        return f"— ({len(df)} rows match)"
    row = df.iloc[0]
    value = _fmt(row["value"], fmt)
    low, high = proper(row.get("ci_low", np.nan), row.get("ci_high", np.nan))  # never [x, x]
    if pd.notna(row.get("windows")) and row["windows"] < MIN_WINDOWS:  # computed before the rule
        low = high = np.nan
    if low == low:
        value += f" [{_fmt(low, fmt)}, {_fmt(high, fmt)}]"
    if pd.notna(row.get("chance")):  # multiple choice: the level a uniform guess reaches
        inside = low == low and low <= row["chance"] <= high
        value += f" (chance {_fmt(row['chance'], fmt)}{': the interval contains it' if inside else ''})"
    signed = fmt.replace("{:", "{:+")
    for (diff, lo, hi), words in DIFFERENCES:  # conditions on shared texts: paired differences
        if pd.notna(row.get(diff)):
            low, high = proper(row.get(lo, np.nan), row.get(hi, np.nan))
            value += f"; {words} {_fmt(row[diff], signed)}"
            value += f" [{_fmt(low, signed)}, {_fmt(high, signed)}]" if low == low else " (no interval)"
    return value


# A row's paired differences as a REPORT line gives them: from intact, and tune's best from
# the papers' setting
DIFFERENCES = ((DIFF_COLUMNS, "paired difference from intact"), (DEFAULT_DIFF_COLUMNS, "from the default"))


N_BOOT = 1000  # resamples of a finding's interval (seed 0: the REPORT is the same on every rerun)


def _matching(df: pd.DataFrame, where: dict) -> pd.DataFrame:
    for col, want in where.items():
        if col not in df.columns:
            raise ConfigError(f"a finding names column {col!r}, which its table lacks")
        df = df[df[col].astype(str) == str(want)]
    return df


def _one_row_each(df: pd.DataFrame, f: Finding, wheres) -> list[pd.Series]:
    """The single row of `df` matching each of `wheres`; a one-line ConfigError unless exactly
    one matches each."""
    rows = [_matching(df, w) for w in wheres]
    if any(len(r) != 1 for r in rows):
        raise ConfigError(f"finding {f.section}: {[len(r) for r in rows]} rows match, not 1 each")
    return [r.iloc[0] for r in rows]


def _per_unit(df: pd.DataFrame, f: Finding, where: dict) -> pd.DataFrame:
    """One row per unit (the finding's `unit`), sorted by it: `v` the value, `n` its weight."""
    rows = _matching(df, where)
    columns = [f.unit] if isinstance(f.unit, str) else list(f.unit)  # a unit may need several columns
    missing = [c for c in columns if c not in rows.columns]
    if missing:
        raise ConfigError(f"finding {f.section}: its unit names {missing}, which the table lacks")
    unit = rows[columns].astype(str).agg(" | ".join, axis=1)
    if unit.duplicated().any():
        raise ConfigError(f"finding {f.section}: {where} matches several rows per {' x '.join(columns)}")
    n = rows[f.weight].astype(float) if f.weight else 1.0
    return pd.DataFrame({"v": rows["value"].astype(float).to_numpy(), "n": np.asarray(n) * 1.0,
                         "unit": unit.to_numpy()}).sort_values("unit").reset_index(drop=True)


# (right answers, trials) of a row of proportions: ruler's samples, passkey's trials
COUNTS = (("all_right", "samples"), ("correct", "trials"))


def _counted(row: pd.Series, f: Finding) -> tuple[int, int]:
    """(right, trials) of a row whose value is their proportion; a one-line ConfigError else."""
    right, trials = next(((row[a], row[b]) for a, b in COUNTS if a in row and b in row), (None, None))
    if right is None or pd.isna(right) or pd.isna(trials):
        raise ConfigError(f"finding {f.section}: its rows have no counts of right answers "
                          f"({' or '.join('/'.join(c) for c in COUNTS)}) to compare as proportions")
    if int(trials) == 0 or abs(float(row["value"]) - right / trials) > 1e-9:
        raise ConfigError(f"finding {f.section}: a value of {row['value']} is not {right} of {trials} "
                          "(a mean recall?): measure: independent compares proportions of right answers")
    return int(right), int(trials)


def finding_numbers(f: Finding, csv: Path) -> dict:
    """A finding's numbers from its table: value, reference, intact (each NaN where the
    measure has none), the tested quantity with its interval (t, low, high), the null it is
    tested against, and the count of units behind the interval."""
    from pecli.measures.intervals import (
        independent_proportion_difference,
        paired_difference,
        t_interval,
    )
    from pecli.measures.mask_fitting import gap_closed, gap_interval

    df = pd.read_csv(csv, low_memory=False)
    nan = float("nan")
    if f.measure == "independent":
        rows = _one_row_each(df, f, (f.where, {**f.where, **f.reference}))
        (right, trials), (ref_right, ref_trials) = (_counted(r, f) for r in rows)
        return {"value": right / trials, "reference": ref_right / ref_trials, "intact": nan,
                "tested": independent_proportion_difference(right, trials, ref_right, ref_trials),
                "null": 0.0, "units": trials}
    if f.measure == "value":
        rows = _one_row_each(df, f, [w for w in (f.where, f.reference) if w])
        row = rows[0]
        low, high = proper(row.get("ci_low", nan), row.get("ci_high", nan))
        units = row.get("windows", row.get("texts", row.get("rows", nan)))
        if "windows" in row and row["windows"] < MIN_WINDOWS:  # no interval from so few windows
            low = high = nan
        reference = float(rows[1]["value"]) if len(rows) > 1 else nan
        return {"value": float(row["value"]), "reference": reference, "intact": nan,
                "tested": (float(row["value"]), low, high), "null": f.against, "units": units}
    if f.interval == "table":  # the section computed the paired difference (DIFF_COLUMNS)
        return _tabled_difference(df, f)
    x, r = _per_unit(df, f, f.where), _per_unit(df, f, {**f.where, **f.reference})
    if list(x["unit"]) != list(r["unit"]):
        raise ConfigError(f"finding {f.section}: the condition and its reference were not scored "
                          "on the same units")

    def stat(u: pd.DataFrame) -> float:  # a corpus perplexity where weighted, else a mean
        return float(np.exp((u.n * np.log(u.v)).sum() / u.n.sum())) if f.weight else float(u.v.mean())

    if f.measure == "paired" and f.interval == "t":
        d = (x.v - r.v).to_numpy()
        tested = (float(d.mean()), *t_interval(d))
    elif f.measure == "paired":
        logged = (lambda u: u.n * np.log(u.v)) if f.weight else (lambda u: u.v)
        tested = paired_difference(logged(x), logged(r), x.n, r.n, n_boot=N_BOOT, seed=0,
                                   transform=np.exp if f.weight else None)
    else:  # gap: `reference` is no positions, `intact` the intact model
        i = _per_unit(df, f, {**f.where, **f.intact})
        sums = {"zero": (r.n * np.log(r.v)).to_numpy(), "intact": (i.n * np.log(i.v)).to_numpy(),
                "x": (x.n * np.log(x.v)).to_numpy()}
        counts = x.n.to_numpy()
        point = gap_closed(*(sums[k].sum() / counts.sum() for k in ("zero", "x", "intact")))
        tested = (point, *gap_interval(sums, counts, "x", N_BOOT, 0))
        return {"value": stat(x), "reference": stat(r), "intact": stat(i), "tested": tested,
                "null": 0.0, "units": len(x)}
    return {"value": stat(x), "reference": stat(r), "intact": nan, "tested": tested, "null": 0.0,
            "units": len(x)}


def _tabled_difference(df: pd.DataFrame, f: Finding) -> dict:
    """A paired finding whose section wrote the difference itself: the one `where` row's
    DIFF_COLUMNS (its design's interval, e.g. seeds and texts crossed), `reference` its row's
    value; units the row's seeds (or texts, trials, samples, windows)."""
    row, reference = _one_row_each(df, f, (f.where, {**f.where, **f.reference}))
    if any(c not in row for c in DIFF_COLUMNS) or pd.isna(row[DIFF_COLUMNS[0]]):
        raise ConfigError(f"finding {f.section}: its row has no paired difference "
                          f"({', '.join(DIFF_COLUMNS)}); rerun the section")
    nan = float("nan")
    return {"value": float(row["value"]), "reference": float(reference["value"]),
            "intact": nan, "tested": tuple(float(row[c]) for c in DIFF_COLUMNS), "null": 0.0,
            "units": next((row[u] for u in ("seeds", "texts", "trials", "samples", "windows") if u in row), nan)}


def finding_sentence(f: Finding, numbers: dict) -> str:
    """The finding's sentence: its template filled, {verdict} the words its interval licenses
    (`intervals.verdict`), {tested} the tested number with its interval or "no interval"."""
    from pecli.measures.intervals import verdict

    t, low, high = numbers["tested"]
    signed = f.format.replace("{:", "{:+") if f.measure in ("paired", "independent") else f.format
    low, high = proper(low, high)
    tested = _fmt(t, signed) + (f" [{_fmt(low, signed)}, {_fmt(high, signed)}]" if low == low
                                else " (no interval)")
    words = dict(zip(("up", "down", "none"), f.words, strict=True))
    said = verdict(low, high, null=numbers["null"] or 0.0, **words) if numbers["null"] is not None else ""
    units = numbers["units"]
    return f.text.strip().format(
        value=_fmt(numbers["value"], f.format), reference=_fmt(numbers["reference"], f.format),
        intact=_fmt(numbers["intact"], f.format), tested=tested, verdict=said,
        units=f"{float(units):,.0f}" if pd.notna(units) else "?")


def finding_lines(preset: Preset, out: Path) -> list[str]:
    """REPORT's opening: one line per finding, its question, its sentence, its section's table."""
    lines = []
    for f in preset.findings:
        record = json.loads((out / f.section / "done.json").read_text())
        csv = out / f.section / record["tables"][f.table]
        sentence = finding_sentence(f, finding_numbers(f, csv))
        lines.append(f"{len(lines) + 1}. **{f.question}.** {sentence} ([{f.section}]({f.section}/{csv.name}))")
    return lines


def _fmt(value, fmt: str) -> str:
    try:
        return fmt.format(float(value))
    except ValueError:
        return str(value)


STUDY = ("a short empirical study of position information in "
         "pretrained Transformers (what happens to BERT and GPT-2 when their learned position "
         "embeddings are removed, and whether a graded attention mask can stand in for them)")


def _recorded(res: EntryResult, out: Path) -> dict:
    """What the section's rows and done.json say computed it: commit(s), dirtiness, versions."""
    commits, versions = [], {}
    for csv in res.tables.values():
        head = pd.read_csv(csv, nrows=50, usecols=lambda c: c.endswith("_version") or c == "git_commit")
        commits += [str(c) for c in head.get("git_commit", pd.Series(dtype=str)).dropna().unique()]
        versions.update({c: str(head[c].iloc[0]) for c in head.columns if c != "git_commit"})
    done = out / res.entry.id / "done.json"
    dirty = done.exists() and bool(json.loads(done.read_text()).get("git_dirty"))
    return {"commits": list(dict.fromkeys(commits)) or ["unknown"], "dirty": dirty,
            "versions": versions}


def _images(figures: list[Path]) -> list[Path]:
    """One image per figure for the report: its PNG, else its SVG, else what there is."""
    by_stem: dict[Path, list[Path]] = {}
    for f in map(Path, figures):
        if f.suffix != ".json":
            by_stem.setdefault(f.with_suffix(""), []).append(f)
    rank = {".png": 0, ".svg": 1, ".pdf": 2}
    return [min(fs, key=lambda f: rank.get(f.suffix, 3)) for fs in by_stem.values()]


def write_report(preset: Preset, out: Path, results: list[EntryResult]) -> Path:
    """REPORT.md: the study's numbers (labelled with the study's model) beside pecli's, every
    table and figure linked, each section naming the commit its rows record.

    Built from what the results record only (no clock, no current checkout), so rewriting it
    over unchanged results leaves the file byte-identical; it is not touched then."""
    recorded = {r.entry.id: _recorded(r, out) for r in results}
    versions: dict[str, set] = {}
    for rec in recorded.values():
        for lib, v in rec["versions"].items():
            versions.setdefault(lib, set()).add(v)
    shown = ", ".join(f"{lib.removesuffix('_version')} {' / '.join(sorted(versions[lib]))}"
                      for lib in ("pecli_version", "torch_version", "transformers_version")
                      if lib in versions)
    lines = [
        f"# pecli reproduce --preset {preset.name}",
        "",
        preset.description.strip(),
        "",
        f"The study (`shared/docs/STUDY.md`): {STUDY}. Its numbers appear in the `study` column "
        "with the model it measured (bert-base-uncased or gpt2); pecli's column is for the model "
        "the section names, which is often another one.",
        "",
        f"Computed with {shown} (as the rows record them); each section names the commit that "
        "computed it. Every CSV row carries its own provenance columns; each CSV has a JSON "
        "sidecar with the resolved configuration. Computing every experiment took "
        f"{sum(r.seconds for r in results) / 60:.1f} min in all (the sum of the sections' times "
        "below).",
        "",
    ]
    if preset.findings:
        lines += ["## Findings", "",
                  "Each sentence is generated from its section's table: a direction (rises, falls, "
                  "beats, worse) only where its 95 % interval excludes zero (or chance), paired "
                  "where the two share their texts or trials, "
                  "\"no detectable difference\" otherwise; \"no interval\" where the units are too "
                  "few for one.", "", *finding_lines(preset, out), ""]
    if preset.choices:
        lines += ["## Choices the study left open, and what this preset takes", ""]
        lines += [f"- {c}" for c in preset.choices] + [""]
    findings = [r for r in results if not r.entry.appendix]
    checks = [r for r in results if r.entry.appendix]
    if checks:
        lines += [f"Findings first; the {len(checks)} code-path checks on random weights follow in "
                  "the appendix.", ""]
    for res in findings:
        lines += _section(res, recorded[res.entry.id], out, "##")
    if checks:
        lines += ["## Appendix: code-path checks on random weights", "",
                  "Random initialisations of each family's published config: each section checks "
                  "that a code path runs and writes its tables and figures. Their numbers say "
                  "nothing about how a trained model uses position.", ""]
        for res in checks:
            lines += _section(res, recorded[res.entry.id], out, "###")
    path = out / "REPORT.md"
    text = "\n".join(lines)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return path  # nothing new: leave the file (and its time stamp) alone
    return write_text(text, path)  # atomic, as every table


def _section(res: EntryResult, rec: dict, out: Path, level: str) -> list[str]:
    """One entry's part of REPORT.md: title, options and commit, notes, the report lines,
    its tables and figures (an appendix entry says first what it checks)."""
    rel = lambda p: os.path.relpath(p, out)  # noqa: E731
    e = res.entry
    commit = ", ".join(rec["commits"]) + (" with uncommitted changes" if rec["dirty"] else "")
    lines = [f"{level} {e.title}", ""]
    if e.appendix:
        lines += [f"What it checks: {e.appendix}.", ""]
    lines += [f"`{e.experiment}` with `{json.dumps(e.shown_options(), sort_keys=True)}`: "
              f"computed at commit {commit} in {res.seconds:.0f} s.", ""]
    if e.study_notes:
        lines += [e.study_notes.strip(), ""]
    if e.report:
        lines += [f"| quantity | {e.reference} | pecli (this section's model) [95 % interval, where computed] |",
                  "|---|---|---|"]
        for line in e.report:
            csv = res.tables.get(line.table)
            value = _lookup(csv, line.where, line.format) if csv else "— (no table)"
            study = "—" if line.study is None else str(line.study)
            cells = (line.label, study, value)
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    lines.append("Tables: " + ", ".join(f"[{n}]({rel(p)})" for n, p in res.tables.items()))
    lines.append("")
    return lines + [f"![{Path(f).stem}]({rel(f)})" for f in _images(res.figures)] + [""]
