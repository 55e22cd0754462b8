"""`mc` on the real SmolLM2 and real TruthfulQA items, with and without positions: the shared
context equals one plain forward per choice (written here), and the identity rotation moves
the numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pecli.data import items as item_files
from pecli.experiments.mc import McOptions, run
from pecli.measures import mc_scoring as mc
from pecli.positions.interventions import intervene

pytestmark = pytest.mark.slow


def _plain_loglik(loaded, context: list[int], cont: list[int]) -> float:
    with torch.no_grad():
        logits = loaded.model(torch.tensor([(context + cont)[:-1]])).logits[0, -len(cont):]
    return float(logits.double().log_softmax(-1)[torch.arange(len(cont)), cont].sum())


def test_smollm2_with_and_without_positions(smollm2, shared_data):
    tables = run(McOptions.build(dict(intervention="zero", dataset="truthfulqa-mc",
                                      data_dir=str(shared_data), limit=2, seed=0, bootstrap=100),
                                 "test"), loaded=smollm2)
    items, _ = item_files.load_items("truthfulqa-mc", str(shared_data), limit=2, seed=0)
    reqs = mc.requests(smollm2.tokenizer, items)
    got = tables["mc_items"]
    for pe in ("intact", "zero"):
        with intervene(smollm2, pe):
            for item, req in zip(items, reqs, strict=True):
                want = {c: _plain_loglik(smollm2, req.context, ids)
                        for c, ids in zip(item.choices, req.continuations, strict=True)}
                rows = got[(got.intervention == pe) & (got.text_id == item.text_id)]
                for _, r in rows.iterrows():
                    assert r["value"] == pytest.approx(want[r["choice"]], abs=2e-3), (pe, r["choice"])
    df = tables["mc"]
    assert df.iloc[0]["intervention"] == "intact" and set(df["intervention"]) == {"intact", "zero"}
    assert df["value"].between(0, 1).all()
    assert (df["truncated_pairs"] == 0).all() and (df["passes"] == "shared-context").all()
    lls = got.pivot_table(index=["text_id", "task", "choice_index"], columns="intervention", values="value")
    assert np.abs(lls["intact"] - lls["zero"]).min() > 0.01  # the identity rotation changes every choice
