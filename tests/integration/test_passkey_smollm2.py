"""`pecli passkey` on the real SmolLM2: batched KV-cache decoding equals the literal greedy
loop, and the intact model finds keys that the identity rotation loses."""

from __future__ import annotations

import pytest

from pecli.experiments.options.passkey import PasskeyOptions
from pecli.experiments.passkey import run
from pecli.measures import passkey as pk
from pecli.positions.interventions import intervene

pytestmark = pytest.mark.slow


def test_smollm2_batched_decoding_equals_the_greedy_loop(smollm2):
    trials = [pk.fit(smollm2.tokenizer, k, 192, 0.5) for k in pk.keys(0, 192, 0.5, 3)]
    assert len(pk.batches(trials)) == 1  # three prompts of 192 tokens: one batch
    for intervention in ("intact", "zero"):
        with intervene(smollm2, intervention, 0):
            assert pk.decode(smollm2, trials) == [pk.greedy_without_cache(smollm2, t.ids) for t in trials]


def test_smollm2_passkey_table(smollm2):
    o = PasskeyOptions.build({"model": "smollm2", "lengths": [256], "depths": [0.0, 0.5],
                              "trials": 3, "intervention": "zero"}, "t")
    acc = run(o, loaded=smollm2)["passkey"].set_index(["intervention", "depth"])
    # measured: intact 6/6 at 256 tokens; the identity rotation (no positions) drops it
    assert acc.loc[("intact", "all"), "correct"] >= 5
    assert acc.loc[("zero", "all"), "correct"] < acc.loc[("intact", "all"), "correct"]
