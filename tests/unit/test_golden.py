"""The golden tables (tests/golden/*.csv, rebuilt by `make golden`) still come out of the code:
same rows (by their key columns) and the same numbers to rtol 1e-5."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "golden"))

import build  # noqa: E402  (tests/golden/build.py)


def differences(golden: pd.DataFrame, now: pd.DataFrame) -> list[str]:
    """Rows missing or new (by key columns), and numbers that moved beyond rtol 1e-5."""
    numbers = [c for c in build.NUMBERS if c in golden.columns]
    keys = [c for c in golden.columns if c not in numbers]
    if list(now.columns) != list(golden.columns):
        return [f"columns changed: {list(golden.columns)} -> {list(now.columns)}"]
    golden = golden.astype({k: str for k in keys})
    both = golden.merge(now, on=keys, how="outer", suffixes=("_golden", "_now"), indicator=True)
    out = [f"{'missing' if r['_merge'] == 'left_only' else 'new'} row {[r[k] for k in keys]}"
           for _, r in both.iterrows() if r["_merge"] != "both"]
    both = both[both["_merge"] == "both"]
    for c in numbers:
        a, b = both[f"{c}_golden"].to_numpy(float), both[f"{c}_now"].to_numpy(float)
        moved = ~np.isclose(a, b, rtol=1e-5, atol=0, equal_nan=True)
        out += [f"{c} of {[row[k] for k in keys]}: {x!r} -> {y!r}"
                for (_, row), x, y, m in zip(both.iterrows(), a, b, moved, strict=True) if m]
    return out


@pytest.mark.parametrize("name", list(build.RUNS))
def test_golden_table_unchanged(name):
    golden = pd.read_csv(build.path_of(name), keep_default_na=False, na_values=[""])
    diff = differences(golden, build.compute(name))
    assert not diff, f"{name} changed (if intended: make golden, review the diff):\n" + \
        "\n".join(diff[:20])


def test_the_comparison_catches_a_moved_number_and_a_lost_row():
    golden = pd.read_csv(build.path_of("perplexity_gpt2"), keep_default_na=False, na_values=[""])
    moved = golden.copy()
    moved.loc[3, "value"] *= 1 + 3e-5
    assert len(differences(golden, moved)) == 1
    assert len(differences(golden, moved.assign(value=golden["value"] * (1 + 5e-6)))) == 0
    assert any(d.startswith("missing row") for d in differences(golden, golden.drop(index=0)))
