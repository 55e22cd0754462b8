"""--rope-scaling on the real SmolLM2: the numbers of transformers' own model built from a
config with the same rope_parameters, and the model restored afterwards."""

from __future__ import annotations

import pytest
import torch
import transformers

from pecli.positions.rope_scaling import rope_parameters
from pecli.positions.rotary import rope_scaled

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("text", ["yarn:2", "linear:2", "dynamic:2"])
def test_smollm2_scaled_equals_transformers_own(smollm2, text):
    model = smollm2.model
    ids = torch.randint(0, model.config.vocab_size, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        before = model(ids).logits
        with rope_scaled(model, rope_parameters(text)) as resolved:
            scaled = model(ids).logits
        after = model(ids).logits
        config = transformers.LlamaConfig(**{**model.config.to_dict(), "rope_parameters": resolved})
        own = transformers.LlamaForCausalLM(config).eval()
        own.load_state_dict(model.state_dict())
        expected = own(ids).logits
    assert resolved["rope_theta"] == 100000.0
    assert torch.equal(scaled, expected)
    assert torch.equal(after, before)
    if text == "dynamic:2":  # 300 tokens are inside the 8192-token context: unscaled
        assert torch.equal(scaled, before)
    else:
        assert not torch.allclose(scaled, before, atol=1e-3)
        if text == "yarn:2":
            assert resolved["original_max_position_embeddings"] == 8192
