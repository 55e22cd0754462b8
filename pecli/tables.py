"""The long, tidy results schema: one row per measurement, provenance in columns."""

from __future__ import annotations

import pandas as pd

# Every row of every table has these.
CORE_COLUMNS = ("experiment", "metric", "value", "seed", "pecli_version", "torch_version",
                "transformers_version", "git_commit")
# Rows measured on a model and a dataset also say exactly how.
MODEL_COLUMNS = ("model", "model_id", "model_revision", "random_init", "device", "dtype",
                 "dataset", "split", "rows", "tokens", "intervention")


def validate(df: pd.DataFrame, model_rows: bool = True) -> pd.DataFrame:
    """Check the schema; return the frame with the core columns first."""
    required = CORE_COLUMNS + (MODEL_COLUMNS if model_rows else ())
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"results table lacks columns {missing}")
    if df.empty:
        raise ValueError("results table is empty")
    first = [c for c in ("experiment", "model", "dataset", "intervention", "metric", "value") if c in df]
    return df[first + [c for c in df.columns if c not in first]]
