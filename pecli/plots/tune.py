"""Tune figures from tune_curve.csv and tune_report.csv (pandas + matplotlib only): for each
parameter, the objective on the choice split against the parameter's value, one line per
setting of the other parameters, the intact model's value dashed (in the legend where it lies
far off the settings), the chosen setting ringed; the report split's numbers under the axes."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from pecli.plots.style import WIDTH, data_label, dtype_note, model_name, save, wants_log
from pecli.runs.numbers import decimals

_META = {"condition", "intervention", "rope_scaling", "rope_parameters", "setting"}


def parameters(curve: pd.DataFrame) -> list[str]:
    """The tuned parameters: the columns named in every row's setting (`G=2 W=512` -> group,
    window are the columns whose values it lists), in setting order."""
    keys = [item.partition("=")[0] for item in str(curve["setting"].iloc[0]).split()]
    return [k for k in keys if k in curve.columns]


def _report_text(report: pd.DataFrame) -> list[str]:
    """One line per report row: its value with its interval, and its paired difference from
    intact (and the best's from the default), all with the same decimals."""
    pairs = [("ci_low", "ci_high"), ("diff_ci_low", "diff_ci_high"),
             ("diff_default_ci_low", "diff_default_ci_high")]
    pairs = [(lo, hi) for lo, hi in pairs if lo in report]
    digits = decimals(report["value"], [x for lo, _ in pairs for x in report[lo]],
                      [x for _, hi in pairs for x in report[hi]])

    def ci(r, v, lo, hi) -> str:
        if v not in r or r[v] != r[v]:
            return ""
        spec = f"{'+' if v.startswith('diff') else ''},.{digits}f"
        bounds = "" if r[lo] != r[lo] else f" [{r[lo]:{spec}}, {r[hi]:{spec}}]"
        return f"{r[v]:{spec}}{bounds}"

    rows = [r for _, r in report.iterrows()]
    chosen = {r["condition"] for r in rows if r["role"] == "default"} & {
        r["condition"] for r in rows if r["role"] == "best"}  # the default chosen: one line
    lines = []
    for r in rows:
        if r["role"] == "best" and r["condition"] in chosen:
            continue
        role = "default, also the best" if r["condition"] in chosen else r["role"]
        setting = "" if r["setting"] != r["setting"] or r["setting"] in ("", r["role"]) else f" ({r['setting']})"
        parts = [f"{role}{setting}: {ci(r, 'value', 'ci_low', 'ci_high')}"]
        if d := ci(r, "diff_vs_intact", "diff_ci_low", "diff_ci_high"):
            parts.append(f"vs intact {d}")
        if d := ci(r, "diff_vs_default", "diff_default_ci_low", "diff_default_ci_high"):
            parts.append(f"vs default {d}")
        lines.append("; ".join(parts))
    return lines


def _count(n, unit: str) -> str:
    """`1 window`, `10 windows`."""
    return f"{int(n):,} {unit}{'' if int(n) == 1 else 's'}"


def one_parameter(curve: pd.DataFrame, report: pd.DataFrame | None, param: str, path: Path) -> Path:
    others = [p for p in parameters(curve) if p != param]
    fig, ax = plt.subplots(figsize=(WIDTH * 0.75, 4.8), layout="constrained")
    groups = curve.groupby(others, sort=False) if others else [((), curve)]
    for key, part in groups:
        key = key if isinstance(key, tuple) else (key,)
        part = part.sort_values(param)
        label = ", ".join(f"{o} = {v:g}" for o, v in zip(others, key, strict=True)) or "choice split"
        line, = ax.plot(part[param], part["value"], "-o", ms=4, lw=1.2, label=label)
        if part["ci_low"].notna().any():
            ax.fill_between(part[param], part["ci_low"], part["ci_high"], color=line.get_color(),
                            alpha=0.08, lw=0)
    intact = (curve["value"] - curve["diff_vs_intact"]).dropna()
    if len(intact):  # a line, unless so far off that the settings' differences would flatten
        shown = pd.concat([curve["value"], curve["ci_low"], curve["ci_high"]]).dropna()
        spread = max(shown.max() - shown.min(), 0.05 * abs(shown.mean()))
        if shown.min() - 3 * spread <= intact.iloc[0] <= shown.max() + 3 * spread:
            ax.axhline(intact.iloc[0], ls="--", color="0.4", lw=1, label="intact (choice split)")
        else:
            where = "above" if intact.iloc[0] > shown.max() else "below"
            ax.plot([], [], ls="--", color="0.4", lw=1,
                    label=f"intact (choice split): {intact.iloc[0]:,.4g}, {where} the axis")
    best = curve[curve["chosen"].astype(str).str.lower() == "true"]
    ax.plot(best[param], best["value"], "o", ms=11, mfc="none", mec="black", label="chosen")
    if wants_log(curve["value"]):
        ax.set_yscale("log")
    first = curve.iloc[0]
    ax.set_xlabel(f"{param} ({first['tuned']})")
    ax.set_ylabel(f"{first['metric']} (choice split)")
    ax.set_xticks(sorted(curve[param].unique()))
    ax.legend(fontsize=7, loc="best")
    if report is not None:  # the report split's numbers under the axes
        first_report = report.iloc[0]
        head = (f"report split ({_count(first_report['units'], first_report['unit'])}, no text shared with "
                f"the choice split), 95 % intervals, paired differences:")
        fig.text(0.01, 0.0, "\n".join([head, *_report_text(report)]), fontsize=7, va="bottom",
                 ha="left")
        fig.get_layout_engine().set(rect=(0, 0.04 * (len(report) + 1), 1, 1 - 0.04 * (len(report) + 1)))
    unit = f"{_count(first['units'], first['unit'])} of {int(first['length']):,} tokens"
    ax.set_title(f"{first['tuned']}: {first['metric']} against {param}, chosen on the choice split\n"
                 f"{model_name(curve)}, {data_label(first)}{dtype_note(first)}; {unit}", fontsize=9)
    return save(fig, path)


def figures(csv_paths: dict[str, Path], fig_dir: Path) -> list[Path]:
    if "tune_curve" not in csv_paths:
        return []
    curve = pd.read_csv(csv_paths["tune_curve"])
    report = pd.read_csv(csv_paths["tune_report"]) if "tune_report" in csv_paths else None
    return [one_parameter(curve, report, p, Path(fig_dir) / f"tune_{p}.png") for p in parameters(curve)]
