"""`pe-recover` on the real all-MiniLM-L6-v2: what the BERT sum keeps, on a small token sample."""

from __future__ import annotations

import numpy as np

from pecli.experiments.recover import embedding_stage, input_level


def test_minilm_keeps_the_token_and_the_layernorm_blocks_subtraction(minilm):
    by_position, summary = input_level(minilm, tokens=6, folds=3, seed=0, n_boot=0, say=print)
    v = {(r["condition"], r["metric"]): r["value"] for r in summary}
    assert v["learned", "token_accuracy_ceiling"] == 1.0
    assert v["learned", "token_accuracy"] > 0.99  # adding positions costs (almost) nothing
    assert v["learned", "raw_sum_max_abs_error"] == 0.0  # before the LayerNorm: exact
    # After it, x - x(v, no position) is not E_pos[p] (the norm rescales the whole sum) ...
    assert v["learned", "known_token_relative_error"] > 1.0
    # ... yet the nearest position row is still the right one.
    assert v["learned", "known_token_position_accuracy"] > 0.99
    # The sinusoid at amplitude 1 drowns Gaussian tokens at MiniLM's token scale.
    assert v["sinusoidal", "token_accuracy"] < 0.05
    assert v["learned", "position_probe_mae"] < v["learned", "position_probe_chance_mae"]
    assert len([r for r in by_position if r["condition"] == "learned"]) == 512


def test_embedding_stage_matches_the_models_hidden_state_zero(minilm):
    import torch

    ids = minilm.tokenizer("a quiet film", add_special_tokens=True)["input_ids"]
    with torch.inference_mode():
        h0 = minilm.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[0][0]
    x = embedding_stage(minilm, np.array(ids), np.arange(len(ids)))
    np.testing.assert_allclose(x, h0.numpy(), rtol=0, atol=1e-5)
