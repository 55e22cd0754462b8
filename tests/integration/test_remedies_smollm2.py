"""Remedies on the real SmolLM2 (30 layers, grouped-query attention, rope theta 1e5): each
equals the literal references of tests/remedy_references.py, and `pecli length smollm2`'s rows
are the NLLs of those same conditions."""

from __future__ import annotations

import pytest
import torch
from remedy_references import (
    literal_attention,
    lminfinite_distance,
    rerope_distance,
    se_distance,
    streaming_nll,
)

from pecli.positions.interventions import intervene

pytestmark = pytest.mark.slow

CASES = {
    "selfextend:4:16": lambda layer, i, j: se_distance(i, j, 4, 16),
    "rerope:16": lambda layer, i, j: rerope_distance(i, j, 16),
    "rerope:16:8": lambda layer, i, j: rerope_distance(i, j, 16, 8.0),
    "lminfinite:4:16": lambda layer, i, j: lminfinite_distance(i, j, 4, 16, 16),
    "selfextend:4:16@0-9": lambda layer, i, j: se_distance(i, j, 4, 16) if layer <= 9 else i - j,
}


def _ids(model, n):
    return torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))


def _nll(loaded, ids):
    with torch.inference_mode():
        logits = loaded.model(input_ids=ids).logits[0, :-1].double()
    return -torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]


@pytest.mark.parametrize("name", CASES)
def test_smollm2_equals_the_literal_reference(smollm2, name):
    ids = _ids(smollm2.model, 48)
    with intervene(smollm2, name):
        ours = _nll(smollm2, ids)
    with literal_attention(smollm2, CASES[name]):
        literal = _nll(smollm2, ids)
    assert torch.allclose(ours, literal, atol=1e-3), (ours - literal).abs().max()
    assert (ours - _nll(smollm2, ids)).abs().max() > 1e-2


def test_smollm2_sinks_equal_the_streaming_decode(smollm2):
    ids = _ids(smollm2.model, 40)
    with intervene(smollm2, "sinks:4:12"):
        ours = _nll(smollm2, ids)
    streamed = streaming_nll(smollm2, ids, 4, 12)
    assert torch.allclose(ours, streamed, atol=1e-3), (ours - streamed).abs().max()
    assert (ours - _nll(smollm2, ids)).abs().max() > 1e-2


def test_pecli_length_rows_are_these_conditions(smollm2, shared_data):
    """`pecli length smollm2 --intervention ...`: every condition's row equals the NLLs of
    its window computed here under the same intervention."""
    import numpy as np

    from pecli.experiments.length import run, stream_of
    from pecli.experiments.options.length import LengthOptions

    conditions = "sinks:4:28,selfextend:4:16,rerope:16,droplow:0.25,zero@even"
    options = LengthOptions.build({"model": ["smollm2"], "intervention": conditions, "lengths": "64",
                                   "limit": 1, "bootstrap": 0, "buckets": 1,
                                   "data_dir": str(shared_data)}, where="test")
    table = run(options, loaded=smollm2)["length"]
    rows = table[table["all_positions"]].set_index("intervention")
    from pecli.data.datasets import load_data

    data = load_data("imdb", "test", data_dir_=str(shared_data), limit=1, seed=0, at_most=True)
    stream = stream_of(smollm2.tokenizer, data.texts())
    ids = torch.tensor([stream[o:o + 64] for o in range(0, len(stream) - 63, 64)])  # the windows
    for name in ["intact", *conditions.split(",")]:
        with intervene(smollm2, name):
            nll = torch.cat([_nll(smollm2, window[None]) for window in ids])
        key = name if name in rows.index else "intact"
        assert np.isclose(rows.loc[key, "value"], float(nll.mean().exp()), rtol=1e-4), name
