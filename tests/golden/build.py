"""Golden tables: small, seeded runs whose numbers must not change unless a change says so.

    make golden          # recompute and rewrite tests/golden/*.csv (review the diff)

Each golden table keeps only the columns that identify a row (KEYS, those present) and the
numbers (`value`, `ci_low`, `ci_high`); tests/unit/test_golden.py recomputes the same runs
and compares at rtol 1e-5. The models are the tests' tiny random models (conftest.make_tiny:
real configs and tokenizers at 2 layers, width 32, seed 0); the data is TEXTS, written here.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from unittest.mock import patch

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/, for conftest.make_tiny

from conftest import make_tiny  # noqa: E402

from pecli.experiments import load_all  # noqa: E402

TEXTS = [
    "The cat sat on the mat and looked at the door.",
    "A small boat drifted slowly across the quiet lake at dawn.",
    "She wrote three letters before the rain stopped.",
    "Numbers like seven and twelve appear in many old stories.",
]
KEYS = ["experiment", "matrix", "condition", "intervention", "mask", "mask_semantics", "protocol", "computation",
        "metric", "aggregation", "special_tokens", "baseline", "layer", "position", "text_id"]
NUMBERS = ["value", "ci_low", "ci_high"]

# name -> (experiment, model family, options, table kept)
RUNS = {
    "ablate_bert": ("ablate", "bert", dict(intervention=["zero", "shuffle"], baseline_pairs=8,
                                           bootstrap=200), "ablate"),
    "perplexity_gpt2": ("perplexity", "gpt2", dict(intervention=["zero"], mask=["linear"],
                                                   mask_semantics=["legacy", "log-bias"],
                                                   protocol=["relative", "study"], bootstrap=200),
                        "perplexity"),
    # pe-probe takes a list of models; on GPT-2 (a learned table) both of its analyses
    "pe_probe_matrix_gpt2": ("pe-probe", "gpt2", dict(folds=4, pairs=100, max_length=16),
                             "matrix"),
    "pe_probe_hidden_gpt2": ("pe-probe", "gpt2", dict(folds=4, pairs=100, max_length=16),
                             "hidden"),
}
MODELS = {"pe-probe"}  # experiments whose option is `models` (a list), not `model`


def compute(name: str) -> pd.DataFrame:
    """The golden table `name`, computed now: key columns + numbers, sorted by the keys."""
    experiment, family, options, table = RUNS[name]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "texts.csv"
        pd.DataFrame({"text": TEXTS}).to_csv(data, index=False)
        with patch("pecli.models.loading.load_model", lambda *a, **k: make_tiny(family)):
            model = {"models" if experiment in MODELS else "model": f"random:{family}"}
            frames = load_all().get(experiment).run_with(
                dict(**model, dataset=str(data), limit=len(TEXTS), seed=0, device="cpu",
                     **options), name)
    df = frames[table]
    keys = [c for c in KEYS if c in df.columns]
    out = df[keys + [c for c in NUMBERS if c in df.columns]].copy()
    out[keys] = out[keys].astype(str)  # NaN keys ('-', none) compare as text
    assert not out.duplicated(keys).any(), f"{name}: {keys} do not identify a row"
    return out.sort_values(keys).reset_index(drop=True)


def path_of(name: str) -> Path:
    return HERE / f"{name}.csv"


def main() -> None:
    for name in RUNS:
        compute(name).to_csv(path_of(name), index=False)
        print(f"wrote {path_of(name)}")


if __name__ == "__main__":
    main()
