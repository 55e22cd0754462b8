"""Issue 46's done-when on the committed tables: no interval in results/offline is zero-width
(all units equal: no interval), computed from fewer than 2 units, or attached to a quantity
fixed by definition (mask fit's gap_closed of intact and of no positions, 1 and 0 by
construction). The code writes no such interval (test_attn_cli, test_mask_fit,
test_training_cli, test_lm_eval_cli); every committed table was computed by that code.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

RESULTS = Path(__file__).resolve().parents[2] / "results" / "offline"
UNITS = ("texts", "trials", "items", "windows", "seeds", "samples", "documents")  # counts of units
FIXED = {"gap_closed": ("intact", "none")}  # metric: the conditions where it is fixed by definition
TABLES = sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.glob("*/*.csv"))


def problems(df: pd.DataFrame) -> list[str]:
    """Each interval column pair's rows that break the rule, in words."""
    found = []
    for low in [c for c in df.columns if c.endswith("ci_low") and c.replace("ci_low", "ci_high") in df.columns]:
        high = low.replace("ci_low", "ci_high")
        has = df[low].notna() & df[high].notna()
        if (has & (df[low] == df[high])).any():
            found.append(f"{low}: {int((has & (df[low] == df[high])).sum())} zero-width")
        for unit in (u for u in UNITS if u in df.columns and low == "ci_low"):
            few = has & (pd.to_numeric(df[unit], errors="coerce") < 2)
            if few.any():
                found.append(f"{low}: {int(few.sum())} from fewer than 2 {unit}")
        for metric, conditions in FIXED.items():
            if {"metric", "condition"} <= set(df.columns) and low == "ci_low":
                fixed = has & (df["metric"] == metric) & df["condition"].isin(conditions)
                if fixed.any():
                    found.append(f"{low}: {metric} of {', '.join(conditions)} fixed by definition")
    return found


def test_the_rule_catches_each_kind():
    df = pd.DataFrame({"metric": ["a", "a", "gap_closed", "a"], "condition": ["x", "x", "intact", "x"],
                       "value": [0.0, 0.5, 1.0, 0.5], "ci_low": [0.0, 0.4, 0.9, float("nan")],
                       "ci_high": [0.0, 0.6, 1.0, float("nan")], "texts": [5, 1, 5, 1]})
    assert problems(df) == ["ci_low: 1 zero-width", "ci_low: 1 from fewer than 2 texts",
                            "ci_low: gap_closed of intact, none fixed by definition"]
    assert problems(df.iloc[[3]]) == []


@pytest.mark.parametrize("table", TABLES)
def test_no_committed_interval_breaks_the_rule(table):
    assert problems(pd.read_csv(RESULTS / table, low_memory=False)) == []

