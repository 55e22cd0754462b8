"""pecli mc against lm-evaluation-harness's truthfulqa_mc1/mc2 through the lm-eval model
`pecli`, on the same items (the first N of the local TruthfulQA), intact and with `zero`
(SmolLM2: `zero`): every choice's log-likelihood, every item's MC1 and MC2, and the means agree."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.slow
lm_eval = pytest.importorskip("lm_eval", reason="lm-eval not installed (make setup)")

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "lm_eval"
ITEMS = 12


@pytest.fixture
def first_items(shared_data, tmp_path):
    """The first ITEMS TruthfulQA items as a file pecli mc reads (lm-eval's --limit takes the
    first documents; pecli mc's --limit a seeded subset)."""
    items = json.loads((shared_data / "truthfulqa" / "mc_task.json").read_text())[:ITEMS]
    path = tmp_path / "first.json"
    path.write_text(json.dumps(items))
    return path


def _pecli_mc(loaded, path: Path, intervention: str) -> pd.DataFrame:
    from pecli.experiments.mc import run
    from pecli.experiments.options.mc import McOptions

    options = McOptions.build({"model": loaded.name, "dataset": str(path), "bootstrap": 0,
                               "intervention": [intervention]}, "test")
    items = run(options, loaded=loaded)["mc_items"]
    return items[items["intervention"] == intervention]


def _lm_eval(lm) -> dict:
    from lm_eval.tasks import TaskManager

    try:
        return lm_eval.simple_evaluate(model=lm, tasks=["truthfulqa_mc1", "truthfulqa_mc2"],
                                       limit=ITEMS, log_samples=True, bootstrap_iters=0,
                                       task_manager=TaskManager(include_path=str(CONFIGS)))
    finally:
        lm.close()


def _agree(ours: pd.DataFrame, theirs: dict) -> None:
    for task in ("mc1", "mc2"):
        samples = sorted(theirs["samples"][f"truthfulqa_{task}"], key=lambda s: s["doc_id"])
        assert [s["doc_id"] for s in samples] == list(range(ITEMS))
        mine = ours[ours["task"] == task]
        for s in samples:
            rows = mine[mine["text_id"] == s["doc_id"]].sort_values("choice_index")
            their_ll = np.array([r[0][0] for r in s["resps"]])
            # the same choices in the same order, scored alike (float noise only)
            np.testing.assert_allclose(rows["value"].to_numpy(), their_ll, atol=2e-4)
            if task == "mc1":  # labels sorted in the shipped file: v2.0 and v3.0 agree
                assert rows["item_value"].iloc[0] == s["acc"], s["doc_id"]
            else:
                assert rows["item_value"].iloc[0] == pytest.approx(s["acc"], abs=1e-4)
        mean = mine.drop_duplicates("text_id")["item_value"].mean()
        assert mean == pytest.approx(theirs["results"][f"truthfulqa_{task}"]["acc,none"], abs=1e-4)


@pytest.mark.parametrize("intervention", ["intact", "zero"])
def test_tiny_gpt2_through_the_registry_agrees_with_pecli_mc(first_items, shared_data,
                                                             monkeypatch, intervention):
    """model="pecli" by name, as a user's simple_evaluate call: the plugin loads the model."""
    import pecli.integrations.lm_eval  # noqa: F401  registers "pecli"
    from pecli.models.loading import load_model

    monkeypatch.setenv("PECLI_DATA_DIR", str(shared_data))
    from lm_eval.tasks import TaskManager

    theirs = lm_eval.simple_evaluate(
        model="pecli", model_args=f"pretrained=models/tiny-gpt2-imdb,intervention={intervention},"
                                  "device=cpu", tasks=["truthfulqa_mc1", "truthfulqa_mc2"],
        limit=ITEMS, log_samples=True, bootstrap_iters=0,
        task_manager=TaskManager(include_path=str(CONFIGS)))
    ours = _pecli_mc(load_model("models/tiny-gpt2-imdb", device="cpu"), first_items, intervention)
    _agree(ours, theirs)


def test_smollm2_agrees_with_pecli_mc(smollm2, first_items, shared_data, monkeypatch):
    """A real rotary model under `zero` (the intact route through lm-eval is the tiny GPT-2's
    above; on SmolLM2 each condition costs two minutes of CPU)."""
    from pecli.integrations.lm_eval import PecliLM

    monkeypatch.setenv("PECLI_DATA_DIR", str(shared_data))
    theirs = _lm_eval(PecliLM(pretrained="smollm2", intervention="zero", loaded=smollm2, batch_size=8))
    _agree(_pecli_mc(smollm2, first_items, "zero"), theirs)
