"""`pecli length` on the real SmolLM2: rope-scaled rows equal transformers' own model built
from a config with the same rope_parameters (the done-when identity, at a CPU-sized length)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
import transformers

from pecli.experiments.length import run, stream_of
from pecli.experiments.options.length import LengthOptions
from pecli.measures.length_scoring import cut
from pecli.measures.metrics import target_nll

pytestmark = pytest.mark.slow


def test_smollm2_length_rows_equal_transformers_own(smollm2, shared_data, tmp_path):
    texts = pd.read_parquet(shared_data / "imdb" / "test.parquet")["text"].iloc[:4].tolist()
    docs = tmp_path / "docs.csv"
    pd.DataFrame({"text": texts}).to_csv(docs, index=False)
    options = LengthOptions.build({"model": "smollm2", "dataset": str(docs), "lengths": [256],
                                   "rope_scaling": "yarn:2,linear:2", "bootstrap": 0, "buckets": 2}, "t")
    df = run(options, loaded=smollm2)["length"]
    stream = stream_of(smollm2.tokenizer, texts)
    windows = cut(stream, 256).windows(stream)
    whole = df[df["all_positions"]].set_index("rope_scaling")
    for name in ("yarn:2", "linear:2"):
        params = json.loads(whole.loc[name, "rope_parameters"])
        config = transformers.LlamaConfig(**{**smollm2.model.config.to_dict(), "rope_parameters": params})
        own = transformers.LlamaForCausalLM(config).eval()
        own.load_state_dict(smollm2.model.state_dict())
        with torch.inference_mode():
            nll = torch.cat([target_nll(own(torch.tensor([w.ids])).logits[0, :-1], torch.tensor(w.ids[1:]))
                             for w in windows]).double()
        assert whole.loc[name, "tokens"] == nll.numel()
        assert whole.loc[name, "nll_mean"] == pytest.approx(nll.mean().item(), rel=1e-5), name
    assert whole.loc["none", "nll_mean"] != pytest.approx(whole.loc["linear:2", "nll_mean"], rel=1e-3)
    assert json.loads(whole.loc["yarn:2", "rope_parameters"])["original_max_position_embeddings"] == 8192
