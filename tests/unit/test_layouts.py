"""Position layouts per layer (issue 43 §1): read from the config, shown one line per layer
type, and selected by layer type (`X@sliding_attention`, `X@nope`), against computations that
name the layers from the config themselves."""

from __future__ import annotations

import pytest
import torch

from pecli.models.architectures import ARCHITECTURES, layer_groups, layout_line
from pecli.positions.interventions import intervene
from pecli.positions.remedies import attention_modules
from pecli.runs.errors import InterventionError


def test_gemma3_layout_is_one_line_per_layer_type():
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(num_hidden_layers=18, sliding_window=512)
    assert layout_line(ARCHITECTURES.get("llama"), config) == (
        "15 x sliding 512 rotary 1e4 (query scale 1/sqrt(256)), "
        "3 x full rotary 1e6 (query scale 1/sqrt(256))")


@pytest.mark.parametrize("family, line", [
    ("llama", "30 x full rotary 1e5"),
    ("smollm3", "3 x full rotary 2e6, 1 x full none"),
    ("gpt_oss", "1 x sliding 128 yarn rotary 1.5e5 (learned sinks), "
                "1 x full yarn rotary 1.5e5 (learned sinks)"),
    ("pythia", "12 x full rotary 1e4 on 25%"),
    ("deepseek_v3", "2 x full yarn rotary 1e4 on 64 of 192 dims"),
    ("bloom", "24 x full alibi"),
])
def test_layouts_of_the_published_configs(family, line):
    spec = ARCHITECTURES.get(family)
    assert layout_line(spec, spec.random_config()) == line


def test_llama4_and_deepseek_layouts_read_from_their_configs():
    from transformers import DeepseekV3Config, Llama4TextConfig

    llama = ARCHITECTURES.get("llama")
    assert layout_line(llama, Llama4TextConfig(num_hidden_layers=4)) == (
        "3 x chunked 8192 rotary 5e5, 1 x full none (temperature)")
    assert layout_line(llama, DeepseekV3Config(num_hidden_layers=1)) == (
        "1 x full rotary 1e4 on 64 of 192 dims")


def _hidden(loaded, ids):
    with torch.no_grad():
        return loaded.model(input_ids=ids, output_hidden_states=True).hidden_states[-1]


def _without_rotation_in(loaded, kind: str):
    """Forward pre-hooks on the attention of the layers whose config entry is `kind` (read from
    config.layer_types / no_rope_layers here): cos = the attention factor, sin = 0."""
    config = loaded.model.config
    n = config.num_hidden_layers
    rope = getattr(config, "no_rope_layers", None) or [1] * n
    marks = {"nope": [not m for m in rope][:n], "rope": [bool(m) for m in rope][:n]}
    chosen = marks.get(kind) or [t == kind for t in config.layer_types[:n]]
    scale = float(getattr(loaded.model.base_model.rotary_emb, "attention_scaling", 1.0))

    def hook(mod, args, kwargs):
        cos, sin = kwargs["position_embeddings"]
        return args, {**kwargs, "position_embeddings": (torch.full_like(cos, scale), torch.zeros_like(sin))}

    return [attention.register_forward_pre_hook(hook, with_kwargs=True)
            for attention, yes in zip(attention_modules(loaded), chosen, strict=True) if yes]


@pytest.mark.parametrize("family, kind", [("gemma2", "sliding_attention"), ("gemma2", "full_attention"),
                                          ("gpt_oss", "sliding_attention"), ("smollm3", "rope"),
                                          ("modernbert", "sliding_attention"),
                                          ("modernbert", "full_attention"),
                                          ("gemma3", "sliding_attention"), ("gemma3", "full_attention")])
def test_zero_by_layer_type_equals_the_rotation_removed_in_those_layers(tiny, family, kind):
    loaded = tiny(family, initializer_range=0.3)
    ids = torch.randint(5, 200, (1, 20), generator=torch.Generator().manual_seed(0))
    intact = _hidden(loaded, ids)
    handles = _without_rotation_in(loaded, kind)
    reference = _hidden(loaded, ids)
    for h in handles:
        h.remove()
    assert (reference - intact).abs().max() > 1e-4
    with intervene(loaded, f"zero@{kind}"):
        assert torch.equal(_hidden(loaded, ids), reference)


def test_nope_layers_are_untouched(tiny):
    """SmolLM3's NoPE layers: zero@nope and a remedy there change nothing; zero@rope is zero."""
    loaded = tiny("smollm3", initializer_range=0.3)
    assert layer_groups(loaded.model.config)["nope"] == (3,)
    ids = torch.randint(5, 200, (1, 20), generator=torch.Generator().manual_seed(0))
    intact = _hidden(loaded, ids)
    for name in ("zero@nope", "selfextend:2:4@nope"):
        with intervene(loaded, name):
            assert torch.equal(_hidden(loaded, ids), intact), name
    with intervene(loaded, "zero"):
        everywhere = _hidden(loaded, ids)
    with intervene(loaded, "zero@rope"):
        assert torch.equal(_hidden(loaded, ids), everywhere)


@pytest.mark.parametrize("model, name, words", [
    ("random:llama", "zero@sliding_attention", "has no sliding_attention layers (it has full_attention, rope)"),
    ("random:gemma2", "zero@nope", "has no nope layers"),
    ("random:mistral", "selfextend:2:8@full_attention", "has no full_attention layers"),
])
def test_a_layer_type_the_model_lacks_is_refused_before_loading(monkeypatch, model, name, words):
    from pecli.experiments import check_before_loading

    def no_loading(*args, **kwargs):
        raise AssertionError("weights loaded")

    monkeypatch.setattr("pecli.models.loading.load_model", no_loading)
    with pytest.raises(InterventionError) as err:
        check_before_loading(model, [name])
    assert words in str(err.value) and "\n" not in str(err.value)


def test_layer_types_are_accepted_where_the_model_has_them(monkeypatch):
    from pecli.experiments import check_before_loading

    monkeypatch.setattr("pecli.models.loading.load_model", lambda *a, **k: 1 / 0)
    check_before_loading("random:gemma2", ["zero@sliding_attention", "rerope:8@full_attention"])
    check_before_loading("random:smollm3", ["zero@nope+0"])
