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

# Configuration as it was resolved for the rows (defaults filled in, `auto` decided): what a
# table's JSON sidecar records beside the options as given.
RESOLVED_COLUMNS = ("model", "model_id", "model_revision", "model_source", "device", "dtype",
                    "dataset", "split", "data_revision", "text_field", "rows", "split_rows",
                    "choice_split", "report_split",
                    "max_length", "start_token", "long_text", "stride", "padding_side",
                    "batch_size", "batches", "max_batch_tokens", "seed", "world_size")


def resolved(df: pd.DataFrame) -> dict:
    """The table's resolved configuration: each RESOLVED_COLUMNS column it has, as one value
    when all rows agree, else the sorted distinct values. `rows` is the number of texts used
    after --limit (`limit_used`)."""
    out = {}
    for col in RESOLVED_COLUMNS:
        if col not in df.columns:
            continue
        values = df[col].dropna().unique().tolist()
        values = [v.item() if hasattr(v, "item") else v for v in values]
        if values:
            out[col] = values[0] if len(values) == 1 else sorted(values, key=str)
    if "rows" in out:
        out["limit_used"] = out["rows"]
    return out


def frame(rows: list[dict] | pd.DataFrame, experiment: str, seed: int, **columns) -> pd.DataFrame:
    """Rows + the columns every row of the table shares (provenance, seed, settings). A large
    table's rows come as a frame built column by column, and its shared `columns` are scalars."""
    from pecli.runs.provenance import row_provenance

    if isinstance(rows, pd.DataFrame):
        return pd.DataFrame({"experiment": experiment, **rows, "seed": seed, **columns,
                             **row_provenance()}, index=rows.index)
    return pd.DataFrame([{"experiment": experiment, **r, "seed": seed, **columns,
                          **row_provenance()} for r in rows])
