"""Choosing a condition's parameters (`pecli tune`): a grid scored on one split of held-out
data, the best setting reported on another.

Every setting of `--grid` (the condition's parameters crossed: `--condition selfextend --grid
G=2,4,8 W=512,1024` is six Self-Extend settings) is scored on the choice split, and the best
one (lowest perplexity, or highest passkey accuracy; the first in grid order on a tie) is
chosen there. The best, the papers' recommended setting (`DEFAULTS`, or --default) and the
intact model are then scored on the report split, which shares no text with the choice split,
and each number gets its interval over the report split's units, with the best's paired
difference from intact and from the default (the same units under every condition).

The objectives reuse the experiments' scoring: `length` is `pecli length`'s perplexity over
nonoverlapping windows of `--length` tokens of the dataset's documents joined by EOS (the
all-positions row; pecli.measures.length_scoring), `passkey` is `pecli passkey`'s greedy
retrieval of a key hidden in filler (pecli.measures.passkey). The splits: for `length`, the
documents in source order, the first ones until their stream holds `choice` windows, the
next ones until it holds `report`; for `passkey`, `choice + report` trials (their own key,
depth, filler order and offset each), split by a seeded permutation. Each split's texts and
tokens are hashed into every row (`choice_split`, `report_split`) and so into the sidecars.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pecli.experiments import Headline, check_before_loading, data_of, load, register
from pecli.positions.rope_scaling import Rope
from pecli.positions.rotary import factor_types
from pecli.runs import names
from pecli.runs.errors import ConfigError, DataError
from pecli.runs.fields import option
from pecli.runs.options import OnData

if TYPE_CHECKING:
    import pandas as pd

OBJECTIVES = {"length": ("perplexity", "window", min), "passkey": ("accuracy", "trial", max)}
NOT_TUNED = ("swap",)  # an argument that is not a number


@dataclass(frozen=True)
class Setting:
    """One point of the grid: (parameter, value) in the condition's order, and the condition
    as --intervention (or --rope-scaling) takes it."""

    values: tuple[tuple[str, str], ...]
    text: str

    @property
    def shown(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values)


def _rope(condition: str) -> bool:
    """A rope scaling whose one parameter is its factor (transformers' types, read only where
    the name is not an intervention: reading them imports torch)."""
    return condition not in names.INTERVENTIONS and condition in factor_types()


def parameters(condition: str) -> list[tuple[str, str]]:
    """(name, letter) of each parameter of a condition, in argument order: a remedy's names
    are its METHODS entry's (`group`, `window`), its letters its argument's (`G:W`); a rope
    scaling's one parameter is `factor` (S)."""
    if _rope(condition):
        return [("factor", "S")]
    term = names.INTERVENTIONS.get(condition)
    if not term.argument or term.name in NOT_TUNED:
        raise ConfigError(f"condition (--condition): {condition} takes no parameters to tune; give "
                          f"one that does: {', '.join(tunable())}")
    letters = re.findall(r"[A-Za-z]+", term.argument)
    from pecli.positions.remedies import METHODS  # torch: only where a name is asked for

    method = METHODS.get(condition)
    named = [p.name for p in method.params] if method else [x.lower() for x in letters]
    return list(zip(named, letters, strict=True))


def tunable() -> list[str]:
    """The conditions with parameters: every intervention with a numeric argument (remedies
    included) and the rope scalings with a factor."""
    return [t.name for t in names.INTERVENTIONS.values() if t.argument and t.name not in NOT_TUNED] + list(factor_types())


def settings(condition: str, items: tuple[str, ...], what: str = "grid (--grid)") -> list[Setting]:
    """The grid `items` (`G=2,4,8`, `window=512,1024`) crossed, in order (the last parameter
    fastest), each checked as the condition's own argument: one line for an unknown
    parameter, a value outside its domain, a required one missing."""
    if not (condition in names.INTERVENTIONS or _rope(condition)):
        raise ConfigError(f"condition (--condition): unknown condition {condition!r}; give one with "
                          f"parameters: {', '.join(tunable())}")
    params = parameters(condition)
    given: dict[str, list[str]] = {}
    for item in items:
        key, eq, values = str(item).partition("=")
        key = key.strip()
        found = [name for name, letter in params if key in (name, letter)]
        if not eq or not found:
            known = ", ".join(f"{letter} ({name})" for name, letter in params)
            raise ConfigError(f"{what}: {item!r} is not PARAMETER=V1,V2,... for a parameter of "
                              f"{condition}; its parameters: {known}")
        if found[0] in given:
            raise ConfigError(f"{what}: {found[0]} is given twice; give its values once, a,b")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not vals:
            raise ConfigError(f"{what}: {item!r} gives no value; e.g. {key}=2,4")
        given[found[0]] = list(dict.fromkeys(vals))
    example = _example(condition, params)
    if not given:
        raise ConfigError(f"{what}: give at least one parameter of {condition}, e.g. {example}")
    order = [name for name, _ in params]
    # the argument's parts: those it needs, and every one up to the last given
    used = order[:max(_required(condition), *(order.index(k) + 1 for k in given))]
    needed = [(name, letter) for name, letter in params if name in used and name not in given]
    if needed:
        raise ConfigError(f"{what}: {condition} needs {' and '.join(f'{n} ({x})' for n, x in needed)} "
                          f"too; e.g. {example}")
    out = [()]
    for k in used:
        out = [(*o, (k, v)) for o in out for v in given[k]]
    return [_setting(condition, values, what) for values in out]


def _required(condition: str) -> int:
    """How many of a condition's parameters its argument needs (`G:W` 2, `W[:k]` 1, `[c]` 0)."""
    if _rope(condition):
        return 1
    return len(re.findall(r"[A-Za-z]+", names.INTERVENTIONS.get(condition).argument.split("[")[0]))


def _example(condition: str, params: list[tuple[str, str]]) -> str:
    """The condition's documented example as grid items: selfextend:4:1024 -> `G=4 W=1024`."""
    if _rope(condition):
        return f"{params[0][1]}=2,4"
    values = names.INTERVENTIONS.get(condition).example.split(":")[1:]
    return " ".join(f"{letter}={v}" for (_, letter), v in zip(params, values, strict=False))


def _setting(condition: str, values: tuple[tuple[str, str], ...], what: str) -> Setting:
    """One setting, checked by the one parser of its kind (names.parse, Rope.parse)."""
    text = ":".join([condition, *(v for _, v in values)])
    try:
        if _rope(condition):
            Rope.parse(text)
        else:
            text = str(names.parse(names.INTERVENTIONS, text))
    except (ConfigError, names.InterventionError) as err:
        raise ConfigError(f"{what}: {' '.join(f'{k}={v}' for k, v in values)}: {err}") from None
    return Setting(tuple(values), text)


def _number(x: float) -> str:
    return f"{int(x)}" if float(x).is_integer() else f"{x:g}"


# The papers' recommended settings for a model trained on `n` tokens used at `length` tokens:
# the value a user would guess from each paper, reported beside the best.
DEFAULTS: dict[str, tuple[Callable[[int, int], dict[str, float]], str]] = {
    "selfextend": (lambda n, length: {"group": max(2, math.ceil((length - n // 2) / (n - n // 2))),
                                      "window": n // 2},
                   "W = n/2 and the smallest G with (n - W) G + W >= the length (Jin et al. 2024's "
                   "reach of a group size)"),
    "rerope": (lambda n, length: {"window": n // 4}, "W = n/4 (Su 2023 gives no rule; "
                                                     "bojone/rerope's examples use a window of 512)"),
    "string": (lambda n, length: {"shift": round(n / 3), "window": round(n / 3) + 128},
               "S = n/3 and a local window of 128 (An et al. 2025)"),
    "dca": (lambda n, length: {"chunk": 3 * n // 4, "local": n // 16},
            "C = 3n/4, L = n/16 (ChunkLlama's defaults)"),
    "sinks": (lambda n, length: {"sinks": 4, "window": n - 4}, "K = 4 and a cache of n (Xiao et al. 2023)"),
    "lminfinite": (lambda n, length: {"sinks": 10, "window": n}, "10 start tokens and W = n (Han et al. 2024)"),
    "logscale": (lambda n, length: {"slope": 0.1}, "c = 0.1 (YaRN's 0.1 ln s + 1)"),
}
ROPE_DEFAULT = (lambda n, length: {"factor": length / n}, "the factor length / n (the scaling's own rule)")


def recommended(condition: str, n: int, length: int) -> tuple[Setting, str] | None:
    """The papers' setting for `condition` (DEFAULTS) at `length` tokens on a model trained on
    `n`, and where it comes from; None where no paper recommends one."""
    if condition not in DEFAULTS and not _rope(condition):
        return None
    rule, source = DEFAULTS.get(condition) or ROPE_DEFAULT
    values = rule(n, length)
    names_ = [name for name, _ in parameters(condition)]
    items = [f"{k}={_number(values[k])}" for k in names_ if k in values]
    try:
        return settings(condition, tuple(items), "the recommended default")[0], source
    except ConfigError:  # the rule leaves the domain (a factor below 1 within the context)
        return None


@dataclass(frozen=True)
class TuneOptions(OnData):
    """`pecli tune` and the `tune` experiment: a condition's parameters chosen on one split of
    held-out data and reported on another (docs/tune.md)."""

    FLAGS: ClassVar[str] = ("model condition grid objective length choice report default dataset "
                            "split text_field limit batch_size bootstrap seed device dtype data_dir "
                            "out force")

    model: tuple[str, ...] | str = option(
        "random:llama", flag={"argument": True, "name": "model", "type": list[str]},
        help="A causal LM with rotary positions: smollm2, random:llama, a checkpoint directory, "
             "a hub id; grid items may follow it (pecli tune smollm2 --grid G=2,4 W=512,1024).")
    condition: str = option("selfextend", help="The condition whose parameters are tuned: a remedy "
                            "(selfextend, rerope, string, dca, sinks, lminfinite, temperature, "
                            "logscale), another intervention with a number (shift, droplow, "
                            "drophigh) or a rope scaling with a factor (yarn, linear, dynamic).")
    grid: tuple[str, ...] | str = option(
        (), flag={"type": list[str] | None, "decls": ("--grid",)},
        help="Values per parameter, PARAMETER=V1,V2 (the argument's letter or the parameter's "
             "name: G=2,4,8 W=512,1024, group=2,4; rope scalings: factor=2,3); the parameters "
             "are crossed (repeat --grid, or list them after it).")
    objective: str = option("length", choices=tuple(OBJECTIVES), help="length (perplexity over "
                            "windows of --length tokens, lower is better) or passkey (retrieval "
                            "accuracy at --length tokens, higher is better).")
    length: int = option(4096, low=16, help="Tokens per window (length) or per prompt (passkey).")
    choice: int = option(6, low=1, help="Units of the choice split, where the best setting is "
                                        "chosen: windows (length) or trials (passkey).")
    report: int = option(10, low=10, help="Units of the report split, disjoint from the choice "
                                          "split, where the best is reported (at least 10).")
    default: str | None = option(None, help="The setting reported beside the best, as PARAMETER=V "
                                 "items (\"G=4 W=1024\"); default: the papers' recommended one "
                                 "for the model's context and --length (none for temperature).")
    limit: int | None = option(None, low=1, flag={"min": 1},
                               help="Documents to draw the splits from: a seeded subset, kept in "
                                    "source order (default: the dataset's, as many as needed).")

    def check(self) -> None:
        super().check()
        items = [self.model] if isinstance(self.model, str) else list(self.model)
        models = [m for i in items if "=" not in i for m in names.split_names(i)]
        grid = [*([self.grid] if isinstance(self.grid, str) else self.grid), *(i for i in items if "=" in i)]
        if len(models) != 1:
            raise ConfigError(f"model: tune takes one model, got {', '.join(models) or 'none'}")
        object.__setattr__(self, "model", models[0])
        object.__setattr__(self, "grid", tuple(x for g in grid for x in str(g).split()))
        settings(self.condition, self.grid)
        if self.default is not None:
            settings(self.condition, tuple(self.default.split()), "default (--default)")
        if self.objective == "passkey" and self.length < 128:
            raise ConfigError(f"length (--length): {self.length} tokens hold no passkey prompt; "
                              "give at least 128")


def run(options: TuneOptions, progress: Callable[[int, int], None] | None = None,
        loaded=None) -> dict[str, pd.DataFrame]:
    """`tune_curve` (one row per setting, on the choice split, the chosen one marked) and
    `tune_report` (intact, the default and the best on the report split). `loaded` replaces
    loading the model (tests); `progress(advance, total)` counts scored tokens or trials."""
    import pandas as pd

    from pecli.measures.intervals import DEFAULT_DIFF_COLUMNS, DIFF_COLUMNS
    from pecli.positions.conditions import check_all
    from pecli.runs.provenance import row_provenance
    from pecli.runs.tables import validate

    o = options
    grid = settings(o.condition, o.grid)
    if loaded is None:
        check_before_loading(o.model, [_condition(s, o.condition) for s in grid], causal=True)
    data = data_of(o, at_most=True) if o.objective == "length" else None
    loaded = loaded or load(o.model, o)
    from pecli.positions.remedies import trained_length

    n = trained_length(loaded.model.config)
    default, source = _default(o, n, grid)
    conditions = {s.text: _condition(s, o.condition) for s in [*grid, *([default] if default else [])]}
    check_all(list(conditions.values()), loaded, causal=True)
    from pecli.measures.passkey import NEW_TOKENS

    tokens = o.length + (NEW_TOKENS if o.objective == "passkey" else 0)  # passkey's prompt and answer
    for c in conditions.values():
        if (why := c.reason(loaded, tokens)) is not None:
            raise ConfigError(f"{c.label} at --length {o.length}: {why}")
    scorer = (_Windows if o.objective == "length" else _Trials)(loaded, o, data)
    common = {"experiment": "tune", "seed": o.seed, **loaded.provenance(), **scorer.provenance(),
              "objective": o.objective, "tuned": o.condition, "length": o.length,
              "trained_length": n, "default_rule": source}
    metric, unit, best_of = OBJECTIVES[o.objective]
    from pecli.positions.conditions import plan

    intact = plan()
    total = (len(grid) + 1) * scorer.units("choice") + (2 + bool(default)) * scorer.units("report")
    size = [total]  # the report's conditions are known once the best is: fewer if it is the default
    tick = (lambda k: progress(k, size[0])) if progress else None
    checkpoint = scorer.checkpoint()
    from pecli.measures.lm_scoring import resumed_nlls, saved_nlls

    done: dict[tuple, list] = resumed_nlls(checkpoint)
    resumed = set(done)  # counted once when first asked for

    def scored(split: str, c) -> list:
        key = (split, c.label)
        if key not in done:
            done[key] = scorer.score(split, c, tick)
            checkpoint.save(lambda: saved_nlls(done), force=True)
        elif key in resumed and tick:
            resumed.discard(key)
            tick(scorer.units(split))
        return done[key]

    base = scored("choice", intact)
    curve = []
    for s in grid:
        c = conditions[s.text]
        curve.append({**common, **_columns(c, loaded, s), "subset": "choice", "metric": metric,
                      **scorer.summary("choice", scored("choice", c), base)})
    pick = best_of(range(len(curve)), key=lambda i: (curve[i]["value"], -i if best_of is max else i))
    for i, row in enumerate(curve):
        row["chosen"] = i == pick
    best = grid[pick]
    size[0] = (len(grid) + 1) * scorer.units("choice") + (2 + (bool(default) and default != best)) * scorer.units("report")
    report = []
    ref = scored("report", intact)
    roles = [("intact", None), *([("default", default)] if default else []), ("best", best)]
    values = {}
    for role, s in roles:
        c = intact if s is None else conditions[s.text]
        values[role] = scored("report", c)
        row = {**common, **_columns(c, loaded, s), "role": role, "subset": "report", "metric": metric,
               "chosen_on": "choice", **scorer.summary("report", values[role], None if s is None else ref)}
        if role == "best" and default:  # its paired difference from the default too
            against = scorer.summary("report", values[role], values["default"])
            row.update(zip(DEFAULT_DIFF_COLUMNS, (against[k] for k in DIFF_COLUMNS), strict=True))
        report.append(row)
    # The checkpoint is shared by every tuning of this model, length and text (the intact
    # scores are reused): keep another tuning's unfinished progress, and intact's beside it.
    ours = {c.label for c in conditions.values()} - {intact.label}
    theirs = {k: v for k, v in done.items() if k[1] not in ours}
    unfinished = any(k[1] != intact.label for k in theirs)
    checkpoint.clear(keep=lambda: saved_nlls(theirs) if unfinished else None)
    splits = {f"{k}_split": json.dumps(v, sort_keys=True) for k, v in scorer.splits().items()}
    provenance = row_provenance()
    return {"tune_curve": validate(pd.DataFrame(curve).assign(**splits, **provenance)),
            "tune_report": validate(pd.DataFrame(report).assign(**splits, **provenance))}


def _condition(s: Setting, condition: str):
    from pecli.positions.conditions import plan

    if _rope(condition):
        return plan(rope=Rope.parse(s.text))
    return plan(intervention=s.text)


def _default(o: TuneOptions, n: int, grid: list[Setting]) -> tuple[Setting | None, str]:
    """The setting reported beside the best (--default, else the papers'), as the grid spells
    it where a grid setting computes the same (string:2731 is string:2731:2859): scored once."""
    if o.default is not None:
        got = settings(o.condition, tuple(o.default.split()), "default (--default)")[0], "--default"
    else:
        got = recommended(o.condition, n, o.length) or (None, "")
    default, source = got
    if default is not None:  # Condition.computes: its parameters left out at their defaults
        same = _condition(default, o.condition).computes
        default = next((s for s in grid if _condition(s, o.condition).computes == same), default)
    return default, source


def _columns(c, loaded, s: Setting | None) -> dict:
    """The condition's columns (its label, intervention, rope scaling), the setting as typed
    and one column per parameter."""
    cols = c.columns(loaded)
    out = {k: cols[k] for k in ("condition", "intervention", "rope_scaling", "rope_parameters")}
    out["setting"] = s.shown if s else "intact"
    for k, v in (s.values if s else ()):
        out[k] = float(v)
    return out


def _sha(items) -> str:
    import hashlib

    return hashlib.sha256("\x00".join(map(str, items)).encode()).hexdigest()


class _Windows:
    """The length objective: each split a stream of whole documents, cut into nonoverlapping
    windows of --length tokens and scored one pass per window (pecli length's scoring)."""

    def __init__(self, loaded, o: TuneOptions, data):
        from pecli.measures.length_scoring import cut, stream_of

        self.loaded, self.o, self.data = loaded, o, data
        frame = data.frame.sort_values("text_id", kind="stable").reset_index(drop=True)  # source order
        texts, ids = frame[data.text_field].astype(str).tolist(), frame["text_id"].tolist()
        tok = loaded.tokenizer
        self.streams, self.cuts, self.texts, self.ids = {}, {}, {}, {}
        at = 0
        for split, want in (("choice", o.choice), ("report", o.report)):
            start, tokens = at, -1
            while tokens < want * o.length and at < len(texts):  # whole documents until enough
                tokens += 1 + len(tok(texts[at], add_special_tokens=False)["input_ids"])
                at += 1
            stream = stream_of(tok, texts[start:at])
            windows = cut(stream, o.length)
            if len(windows) < want:
                raise DataError(f"{data.dataset} holds {len(windows)} windows of {o.length} tokens "
                                f"for the {split} split after the {'choice' if split == 'report' else ''} "
                                f"split's documents, {want} wanted; use a larger --limit, a shorter "
                                "--length or fewer windows (--choice, --report)")
            self.streams[split], self.cuts[split] = stream, windows
            self.texts[split], self.ids[split] = texts[start:at], ids[start:at]

    def provenance(self) -> dict:
        return {**self.data.provenance(), "text_field": self.data.text_field, "unit": "window",
                "window_protocol": "nonoverlapping", "start_token": "none",
                "interval": "95 % percentile bootstrap over windows (paired for differences)"}

    def units(self, split: str) -> int:
        return self.cuts[split].tokens

    def splits(self) -> dict:
        return {s: {"texts": len(self.texts[s]), "text_ids": f"{self.ids[s][0]}-{self.ids[s][-1]}",
                    "windows": len(self.cuts[s]), "tokens": self.cuts[s].tokens,
                    "texts_sha256": _sha(self.texts[s]), "stream_sha256": _sha(self.streams[s])}
                for s in self.cuts}

    def checkpoint(self):
        from pecli.runs.io import Checkpoint

        key = {"version": 1, **self.loaded.provenance(), "objective": "length", "length": self.o.length,
               "seed": self.o.seed}
        return Checkpoint("tune", key, [" ".join(map(str, self.streams[s])) for s in self.streams])

    def score(self, split: str, c, tick) -> list:
        import torch

        from pecli.measures.lm_scoring import score_windows

        with torch.inference_mode(), c.applied(self.loaded, self.o.seed):
            return score_windows(self.loaded, self.cuts[split].windows(self.streams[split]),
                                 batch_size=self.o.batch_size, progress=tick)

    def summary(self, split: str, nlls: list, reference: list | None) -> dict:
        """The all-positions row of pecli length's summary: perplexity, its interval over
        windows, and the paired difference from `reference` (the same windows)."""
        from pecli.measures.intervals import DIFF_COLUMNS
        from pecli.measures.length_scoring import summarise

        row = summarise(nlls, self.cuts[split], 1, self.o.bootstrap, self.o.seed, reference)[-1]
        return {"value": row["perplexity"], "ci_low": row["ci_low"], "ci_high": row["ci_high"],
                "nll_mean": row["nll_mean"], "units": row["windows"], "tokens": row["tokens"],
                "rows": len(self.texts[split]),  # the split's documents
                **{k: row[k] for k in DIFF_COLUMNS}}


class _Trials:
    """The passkey objective: `choice + report` trials at --length tokens, each its own draw
    (key, depth spread over [0, 1], filler order and offset), split by a seeded permutation;
    greedy decoding with the KV cache (pecli passkey's)."""

    def __init__(self, loaded, o: TuneOptions, data=None):
        import numpy as np

        from pecli.measures.passkey import draws, fit

        self.loaded, self.o = loaded, o
        total = o.choice + o.report
        order = np.random.default_rng([o.seed, 47]).permutation(total)
        trials = []
        for j in range(total):  # depth j / (total - 1) of the filler, jittered, its own draw
            d = draws(o.seed, o.length, round(j / max(total - 1, 1), 6), 1)[0]
            trials.append(fit(loaded.tokenizer, d.k, o.length, d.depth, d.filler, d.offset))
        if any(t is None for t in trials):
            raise ConfigError(f"length (--length): {o.length} tokens do not hold the passkey template")
        self.trials = {"choice": [trials[i] for i in sorted(order[:o.choice])],
                       "report": [trials[i] for i in sorted(order[o.choice:])]}

    def provenance(self) -> dict:
        from pecli.measures.passkey import NEW_TOKENS

        return {"dataset": "passkey", "split": "synthetic", "rows": self.o.choice + self.o.report,
                "unit": "trial", "max_new_tokens": NEW_TOKENS,
                "interval": "95 % Wilson interval over trials; differences: Newcombe's 95 % "
                            "paired interval over trials"}

    def units(self, split: str) -> int:
        return len(self.trials[split])

    def splits(self) -> dict:
        return {s: {"trials": len(t), "keys": [x.k for x in t], "trials_sha256": _sha(x.text for x in t)}
                for s, t in self.trials.items()}

    def checkpoint(self):
        from pecli.runs.io import Checkpoint

        key = {"version": 1, **self.loaded.provenance(), "objective": "passkey", "length": self.o.length,
               "seed": self.o.seed}
        return Checkpoint("tune", key, [t.text for s in self.trials.values() for t in s])

    def score(self, split: str, c, tick) -> list:
        import torch

        from pecli.measures.passkey import answer, decode

        trials = self.trials[split]
        with c.applied(self.loaded, self.o.seed):
            outputs = decode(self.loaded, trials, self.o.batch_size, progress=tick)
        return [torch.tensor([float(answer(text) == t.k)], dtype=torch.float64)
                for t, text in zip(trials, outputs, strict=True)]

    def summary(self, split: str, right: list, reference: list | None) -> dict:
        """Accuracy with its Wilson interval over trials; the paired difference from
        `reference` (the same trials) with Newcombe's paired interval (`diff_columns`)."""
        import numpy as np

        from pecli.measures.intervals import MIN_WINDOWS, diff_columns, wilson

        x = np.array([float(t[0]) for t in right])
        low, high = wilson(int(x.sum()), len(x))
        diff = diff_columns(reference_row=True) if reference is None else diff_columns(
            x, np.array([float(t[0]) for t in reference]), n_boot=self.o.bootstrap, seed=self.o.seed,
            least=MIN_WINDOWS)
        return {"value": float(x.mean()), "ci_low": low, "ci_high": high, "correct": int(x.sum()),
                "units": len(x), "rows": len(x), "tokens": sum(len(t.ids) for t in self.trials[split]),
                **diff}


register("tune", 1, run, TuneOptions, "pecli.plots.tune:figures",
         "A condition's parameters chosen on one split of held-out data, the best reported on "
         "a disjoint split beside the papers' default and intact",
         headlines=(Headline("perplexity", "perplexity on the report split", {"subset": "report"},
                             ("intervention", "rope_scaling"), name="tune_perplexity",
                             interval="95 % percentile bootstrap over windows", axis="perplexity"),
                    Headline("accuracy", "passkey accuracy on the report split", {"subset": "report"},
                             ("intervention", "rope_scaling"), name="tune_passkey",
                             interval="95 % Wilson interval over trials", axis="accuracy")))
