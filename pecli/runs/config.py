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
        reference: "..."                   # optional: whose numbers `study` gives (a paper's),
                                           # the header of that column (default: the study's)

Each entry's options build the experiment's options object (pecli.runs.options), which checks
every key, type, range and name: a mistake fails before any model is loaded, in one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pecli.runs.errors import ConfigError
from pecli.runs.fields import Options
from pecli.runs.names import parse_formats

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"

PRESET_KEYS = {"name", "description", "defaults", "choices", "experiments", "format", "short_titles",
               "findings"}
ENTRY_KEYS = {"id", "experiment", "title", "options", "report", "study_notes", "appendix", "reference"}
STUDY_COLUMN = "study (its model)"  # REPORT's reference column, unless an entry names its own
LOCATION_OPTIONS = {"data_dir", "workers"}  # where / how, not what: excluded from keys and reports
REPORT_KEYS = {"label", "study", "table", "where", "format"}
FINDING_KEYS = {"question", "section", "text", "table", "where", "measure", "reference", "intact",
                "unit", "weight", "interval", "against", "words", "format"}
# The order REPORT's findings keep: the study's questions, then the field's
QUESTIONS = ("E1", "E2", "E3", "Open question 1", "Open question 2", "Open question 3",
             "Length", "Remedies", "Mechanism", "RULER")
# a row's value; a paired difference; the share of a gap closed; a difference of proportions on
# independent trials
MEASURES = ("value", "paired", "gap", "independent")
INTERVALS = ("bootstrap", "t", "table")  # a paired finding's: over units; t over units; the table's own
MAX_FINDINGS = 14
ENTRY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a folder name under --out


@dataclass(frozen=True)
class ReportLine:
    label: str
    table: str
    where: dict
    study: float | str | None = None
    format: str = "{:.4f}"


@dataclass(frozen=True)
class Finding:
    """One sentence at the top of REPORT.md, its words chosen by its interval
    (pecli.measures.intervals.verdict) and its numbers read from its section's table.

    measure: "value" (the one row of `table` matching `where`; `reference`, if given, another
    row, quoted beside it), "paired" (per-unit rows, `where` against `reference`, aligned on
    `unit`; a paired bootstrap over units, a t interval where `interval` is "t", or the
    difference and interval the section wrote in its row's DIFF_COLUMNS where it is "table"), "gap"
    (the share of the log-perplexity gap between `reference`, no positions, and `intact` that
    `where` closes, units resampled together), "independent" (two rows' proportions of right
    answers, each on trials of its own, as two lengths' draws: `where` against `reference`,
    Newcombe's interval for independent proportions). `weight`: a column of per-unit token counts
    (the statistic is then a corpus perplexity, exp of the token-weighted mean log value)."""
    question: str
    section: str
    text: str  # with {value}, {reference}, {tested}, {verdict}, {units}
    table: str
    where: dict
    measure: str = "value"
    reference: dict = field(default_factory=dict)
    intact: dict = field(default_factory=dict)
    unit: str | tuple[str, ...] = "text_id"  # the column(s) naming one unit (passkey: depth x trial)
    weight: str = ""
    interval: str = "bootstrap"
    against: float | None = None  # "value": what its interval is tested against (chance); else 0
    words: tuple[str, str, str] = ("rises", "falls", "shows no detectable difference")
    format: str = "{:.2f}"


@dataclass(frozen=True)
class Entry:
    id: str
    experiment: str
    title: str
    options: dict  # as the preset gives them (deprecated keys renamed), plain JSON values
    report: tuple[ReportLine, ...] = ()
    study_notes: str = ""
    built: Options | None = None  # the experiment's options object, checked
    appendix: str = ""  # a code-path check, not a finding: what it checks (REPORT's appendix)
    reference: str = STUDY_COLUMN  # whose numbers stand beside pecli's (a report line's `study`)

    def key(self, version: int, spelling: dict[str, str] | None = None,
            old_values: bool = False, old_defaults: bool = False) -> str:
        """Hash of everything that determines the numbers: reruns with the same key are skipped.

        Where the data directory is does not count (the rows record the files' hashes).
        `spelling` renames keys first: the experiment's `KEYED_AS` gives the key that results
        computed before a renaming were saved under; `old_values` spells renamed names (a
        registry's `renamed`, e.g. intervention `intact`, once `learned`) as they were. An
        option whose default changed (`DEFAULTS_BEFORE`) counts at today's default where the
        entry leaves it out; `old_defaults` leaves it out where the entry gives the old default,
        as results saved before the change were keyed.
        """
        options = self.shown_options()
        if self.built is not None:
            options = _defaults_keyed(options, type(self.built), old_defaults)
            if old_values:
                options = _old_values(options, type(self.built))
        shown = {(spelling or {}).get(k, k): v for k, v in options.items()}
        blob = json.dumps({"experiment": self.experiment, "version": version,
                           "options": shown}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def keys(self, version: int) -> tuple[str, ...]:
        """This entry's key, then the keys of results saved before a renaming of its options or
        their values, or before a change of a default it names (where they differ)."""
        spelling = type(self.built).KEYED_AS if self.built is not None else {}
        return tuple(dict.fromkeys(self.key(version, s, old, before) for before in (False, True)
                                   for old in (False, True) for s in (None, spelling)))


    def shown_options(self) -> dict:
        return {k: v for k, v in self.options.items() if k not in LOCATION_OPTIONS}


def _defaults_keyed(options: dict, cls: type[Options], old: bool) -> dict:
    """`options` with each option whose default changed given at today's default where it is
    left out; `old`: then left out where it is the old default (an entry that leaves it out
    means today's default, so it never finds results saved under the old one)."""
    changed = cls.DEFAULTS_BEFORE
    today = {f.name: f.default for f in dataclasses.fields(cls) if f.name in changed}
    given = {**{k: today[k] for k in changed if k not in options}, **options}
    return {k: v for k, v in given.items() if not (old and k in changed and v == changed[k])}


def _old_values(options: dict, cls: type[Options]) -> dict:
    """`options` with each renamed name (its field's vocabulary's `renamed`) spelled as it was."""
    out = dict(options)
    for f in dataclasses.fields(cls):
        registry = f.metadata.get("names")
        if registry is not None and registry.renamed and f.name in out:
            old = {new: was for was, new in registry.renamed.items()}
            value = out[f.name]
            out[f.name] = ([_spelled(v, old) for v in value] if isinstance(value, list)
                           else _spelled(value, old))
    return out


def _spelled(value, old: dict[str, str]):
    """"intact,zero" -> "learned,zero" (old: new name -> old name); not a string: as is."""
    if not isinstance(value, str):
        return value
    items = []
    for item in value.split(","):
        base, colon, arg = item.partition(":")
        items.append(old.get(base.strip(), base) + colon + arg)
    return ",".join(items)


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    entries: tuple[Entry, ...]
    choices: tuple[str, ...] = field(default=())
    path: Path | None = None
    format: tuple[str, ...] | None = None  # figure formats (--format overrides)
    short_titles: bool | None = None  # one-line figure titles (--short-titles overrides)
    findings: tuple[Finding, ...] = field(default=())


def _check_keys(found: dict, allowed: set[str], where: str) -> None:
    for key in found:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint}; allowed: {', '.join(sorted(allowed))}")


def _mapping(value, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a mapping (key: value), not {type(value).__name__}")
    return value


MAX_PRESET_SIZE = 1_000_000  # characters of a preset with its YAML aliases expanded


def _check_size(raw, path: Path) -> None:
    """Refuse a preset whose aliases expand past MAX_PRESET_SIZE characters (a few hundred
    bytes of YAML can name the same list a billion times). Stops counting at the bound."""
    left, stack = MAX_PRESET_SIZE, [raw]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        left -= len(str(node)) if isinstance(node, str) else 8
        if left < 0:
            raise ConfigError(f"{path}: the preset expands past {MAX_PRESET_SIZE:,} characters "
                              "(YAML aliases repeated?); write its entries out")


def preset_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def _read_preset(name_or_path: str) -> tuple[Path, dict]:
    """(the preset's path, its YAML mapping, keys and size checked)."""
    path = Path(name_or_path)
    if not path.suffix and not path.is_dir():
        path = CONFIG_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        close = difflib.get_close_matches(name_or_path, preset_names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"no preset {name_or_path!r}{hint}; presets: {', '.join(preset_names())}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file; a preset is YAML "
                          "(see configs/offline.yaml)") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it ({err.strerror or err})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a preset is a mapping with keys {', '.join(sorted(PRESET_KEYS))}")
    _check_keys(raw, PRESET_KEYS, str(path))
    _check_size(raw, path)
    return path, raw


def _entry(item, where: str, seen: set, defaults: dict, overrides: dict, experiments) -> Entry:
    """One checked entry of a preset's experiments (its id added to `seen`); `defaults` reach
    only the entries whose options take them, `overrides` come last."""
    if not isinstance(item, dict) or "experiment" not in item or "id" not in item:
        raise ConfigError(f"{where}: each experiment needs 'id' and 'experiment'")
    _check_keys(item, ENTRY_KEYS, where)
    if not isinstance(item["id"], str) or not ENTRY_ID.fullmatch(item["id"]):
        raise ConfigError(f"{where}: id {item['id']!r} must be a folder name "
                          "(letters, digits, '.', '_', '-')")
    if item["id"] in seen:
        raise ConfigError(f"{where}: id {item['id']!r} is used twice")
    seen.add(item["id"])
    for key in ("title", "study_notes", "appendix", "reference"):
        if not isinstance(item.get(key, ""), str):
            raise ConfigError(f"{where}: {key} must be a string, not {type(item[key]).__name__}")
    exp = experiments.get(str(item["experiment"]))
    own = _mapping(item.get("options"), f"{where}: options")
    accepted = {f.name for f in dataclasses.fields(exp.options)} | set(exp.options.RENAMED)
    options = {k: v for k, v in {**defaults, **own, **overrides}.items()
               if k in accepted or k in own}  # defaults reach only the entries that take them
    built = exp.options.build(options, f"{where} ({item['experiment']})")
    options = {exp.options.RENAMED.get(k, k): v for k, v in options.items()}
    report = []
    lines = item.get("report") or []
    for line in lines if isinstance(lines, list) else [lines]:
        line = _mapping(line, f"{where}: report line")
        _check_keys(line, REPORT_KEYS, f"{where}: report")
        if not {"label", "table", "where"} <= set(line) or not isinstance(line["where"], dict):
            raise ConfigError(f"{where}: a report line needs label, table and where (a mapping)")
        report.append(ReportLine(**line))
    return Entry(item["id"], item["experiment"], item.get("title", item["id"]), options,
                 tuple(report), item.get("study_notes", ""), built, item.get("appendix", ""),
                 item.get("reference", STUDY_COLUMN))


def _findings(raw, where: str, ids: set[str]) -> tuple[Finding, ...]:
    """The preset's findings, checked: known keys, a section it runs, a measure, the order of
    QUESTIONS, at most MAX_FINDINGS, and words whose third says there is no detectable difference."""
    if not isinstance(raw or [], list):
        raise ConfigError(f"{where}: findings must be a list")
    out, last = [], 0
    for i, item in enumerate(raw or []):
        at = f"{where}: findings[{i}]"
        item = _mapping(item, at)
        _check_keys(item, FINDING_KEYS, at)
        if not {"question", "section", "text", "table", "where"} <= set(item):
            raise ConfigError(f"{at}: a finding needs question, section, text, table and where")
        if item["section"] not in ids:
            raise ConfigError(f"{at}: no section {item['section']!r} in this preset")
        if item["question"] not in QUESTIONS or QUESTIONS.index(item["question"]) < last:
            raise ConfigError(f"{at}: question {item['question']!r} must be one of "
                              f"{', '.join(QUESTIONS)}, in that order")
        last = QUESTIONS.index(item["question"])
        if item.get("measure", "value") not in MEASURES:
            raise ConfigError(f"{at}: measure must be one of {', '.join(MEASURES)}")
        if item.get("measure") in ("paired", "independent") and not item.get("reference"):
            raise ConfigError(f"{at}: measure: {item['measure']} needs a reference row")
        if item.get("interval", Finding.interval) not in INTERVALS or (
                item.get("interval") == "table" and item.get("measure") != "paired"):
            raise ConfigError(f"{at}: interval must be one of {', '.join(INTERVALS)} ('table' "
                              "only with measure: paired)")
        words = tuple(item.get("words", Finding.words))
        if len(words) != 3 or "no detectable difference" not in words[2]:
            raise ConfigError(f"{at}: words are [up, down, none], none saying 'no detectable difference'")
        unit = item.get("unit", Finding.unit)
        if not (isinstance(unit, str) or (isinstance(unit, list) and unit and all(isinstance(u, str) for u in unit))):
            raise ConfigError(f"{at}: unit is a column or a list of columns")
        out.append(Finding(**{**item, "words": words, "unit": unit if isinstance(unit, str) else tuple(unit)}))
    if len(out) > MAX_FINDINGS:
        raise ConfigError(f"{where}: {len(out)} findings; at most {MAX_FINDINGS}")
    return tuple(out)


def load_preset(name_or_path: str, overrides: dict | None = None, *, experiments) -> Preset:
    """Load and validate a preset by name (configs/<name>.yaml) or path.

    Args:
        name_or_path: preset name or YAML path.
        overrides: options applied to every experiment, after the preset's own (CLI > YAML).
        experiments: the experiment registry whose run() signatures the options must fit
            (passed in: experiments sit above config, see tests/unit/test_layers.py;
            `pecli.experiments.reproduce.load_preset` passes them all).
    """
    path, raw = _read_preset(name_or_path)
    for key in ("name", "description"):
        if not isinstance(raw.get(key, ""), str):
            raise ConfigError(f"{path.name}: {key} must be a string, not {type(raw[key]).__name__}")
    defaults = _mapping(raw.get("defaults"), f"{path.name}: defaults")
    if not isinstance(raw.get("experiments") or [], list):
        raise ConfigError(f"{path.name}: experiments must be a list of entries (- id: ...)")
    entries, seen = [], set()
    for i, item in enumerate(raw.get("experiments") or []):
        entries.append(_entry(item, f"{path.name}: experiments[{i}]", seen,
                              defaults, overrides or {}, experiments))
    if not entries:
        raise ConfigError(f"{path}: the preset lists no experiments")
    if not isinstance(raw.get("short_titles", False), bool):
        raise ConfigError(f"{path.name}: short_titles must be true or false")
    try:
        formats = parse_formats(raw["format"]) if raw.get("format") is not None else None
    except ConfigError as err:
        raise ConfigError(f"{path.name}: {err}") from None
    return Preset(raw.get("name", path.stem), raw.get("description", ""), tuple(entries),
                  tuple(raw.get("choices") or ()), path, formats, raw.get("short_titles"),
                  _findings(raw.get("findings"), path.name, seen))
