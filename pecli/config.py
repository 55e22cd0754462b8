"""Presets: YAML files in configs/ naming the experiments of a run, validated on load.

A preset is data:

    name: offline
    description: ...
    defaults: {device: auto, seed: 0}     # options every experiment gets unless it sets them
    choices: ["what the study left open, and what this preset takes", ...]
    experiments:
      - id: e1-minilm                      # folder of its results
        experiment: ablate                 # a registered experiment
        title: "E1: ..."
        options: {model: minilm, limit: 500}
        report:                            # rows of REPORT.md: a number beside the study's
          - {label: ..., study: 0.7702, table: summary, where: {metric: cosine_mean}}

Unknown keys and options fail before any model is loaded, with a suggestion.
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pecli.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

PRESET_KEYS = {"name", "description", "defaults", "choices", "experiments"}
ENTRY_KEYS = {"id", "experiment", "title", "options", "report", "study_notes"}
LOCATION_OPTIONS = {"data_dir"}  # say where, not what: excluded from keys and reports
REPORT_KEYS = {"label", "study", "table", "where", "format"}


@dataclass(frozen=True)
class ReportLine:
    label: str
    table: str
    where: dict
    study: float | str | None = None
    format: str = "{:.4f}"


@dataclass(frozen=True)
class Entry:
    id: str
    experiment: str
    title: str
    options: dict
    report: tuple[ReportLine, ...] = ()
    study_notes: str = ""

    def key(self, version: int) -> str:
        """Hash of everything that determines the numbers: reruns with the same key are skipped.

        Where the data directory is does not count (the rows record the files' hashes).
        """
        blob = json.dumps({"experiment": self.experiment, "version": version,
                           "options": self.shown_options()}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


    def shown_options(self) -> dict:
        return {k: v for k, v in self.options.items() if k not in LOCATION_OPTIONS}


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    entries: tuple[Entry, ...]
    choices: tuple[str, ...] = field(default=())
    path: Path | None = None


def _check_keys(found: dict, allowed: set[str], where: str) -> None:
    for key in found:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint}; allowed: {', '.join(sorted(allowed))}")


def preset_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def load_preset(name_or_path: str, overrides: dict | None = None) -> Preset:
    """Load and validate a preset by name (configs/<name>.yaml) or path.

    Args:
        name_or_path: preset name or YAML path.
        overrides: options applied to every experiment, after the preset's own (CLI > YAML).
    """
    from pecli.experiments import load_all

    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        close = difflib.get_close_matches(name_or_path, preset_names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"no preset {name_or_path!r}{hint}; presets: {', '.join(preset_names())}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a preset is a mapping with keys {', '.join(sorted(PRESET_KEYS))}")
    _check_keys(raw, PRESET_KEYS, str(path))
    experiments = load_all()
    defaults = dict(raw.get("defaults") or {})
    entries, seen = [], set()
    for i, item in enumerate(raw.get("experiments") or []):
        where = f"{path.name}: experiments[{i}]"
        if not isinstance(item, dict) or "experiment" not in item or "id" not in item:
            raise ConfigError(f"{where}: each experiment needs 'id' and 'experiment'")
        _check_keys(item, ENTRY_KEYS, where)
        if item["id"] in seen:
            raise ConfigError(f"{where}: id {item['id']!r} is used twice")
        seen.add(item["id"])
        exp = experiments.get(item["experiment"])
        params = inspect.signature(exp.run).parameters
        options = {k: v for k, v in {**defaults, **(item.get("options") or {}), **(overrides or {})}.items()
                   if k in params or k in (item.get("options") or {})}
        _check_keys(options, set(params), f"{where} ({item['experiment']}) options")
        report = []
        for line in item.get("report") or []:
            _check_keys(line, REPORT_KEYS, f"{where}: report")
            report.append(ReportLine(**line))
        entries.append(Entry(item["id"], item["experiment"], item.get("title", item["id"]),
                             options, tuple(report), item.get("study_notes", "")))
    if not entries:
        raise ConfigError(f"{path}: the preset lists no experiments")
    return Preset(raw.get("name", path.stem), raw.get("description", ""), tuple(entries),
                  tuple(raw.get("choices") or ()), path)
