"""--rope-scaling: parsing, resolution, and the numbers of transformers' own scaled model."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers

from pecli.positions.conditions import plan
from pecli.positions.rope_scaling import (
    Rope,
    RopeScaled,
    provenance,
    rope_parameters,
    split_rope_scalings,
)
from pecli.positions.rotary import (
    REFUSED,
    check_type,
    resolve,
    rope_keys,
    rope_scaled,
    rotary_modules,
)
from pecli.runs.errors import ConfigError, ModelError

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0, 3.0, 4.0, 5.0]}


def _checked(text: str) -> None:
    """An item as a run takes it: parsed by the options, then the condition's check before
    any model loads (where transformers' rope types are read)."""
    for rope in RopeScaled.build({"rope_scaling": text}, where="pecli length").rope_scaling:
        plan(rope=rope).check("random:llama")


def test_every_rope_type_of_transformers_is_checked_or_refused():
    """transformers' table (less "default": the unscaled model) is the vocabulary: each type is
    checked before loading (rope_keys) or refused (REFUSED), and pecli names no other; what
    rope_keys requires of a type is enough for transformers' own validation."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    theirs = set(ROPE_INIT_FUNCTIONS) - {"default"}
    assert theirs == set(rope_keys()) | set(REFUSED) and not set(rope_keys()) & set(REFUSED)
    model = _llama()  # heads of 8 dimensions: 4 rotated frequencies
    values = {"factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}
    for kind, (required, _) in rope_keys().items():
        given = json.dumps({"rope_type": kind, **{k: values[k] for k in required}})
        check_type(Rope.parse(given))
        assert resolve(model.config, rope_parameters(given))["rope_type"] == kind


@pytest.fixture
def fresh_rope_keys():
    """rope_keys read again from transformers' (patched) table, and again after the test."""
    rope_keys.cache_clear()
    yield
    rope_keys.cache_clear()


def test_the_rope_vocabulary_is_read_from_transformers_not_copied(monkeypatch, fresh_rope_keys):
    """A type transformers gains (with its validation) is checked with the keys that
    validation names; one whose validation pecli cannot read is refused in one line."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin

    def _validate_warp_rope_parameters(self, rope_parameters, ignore_keys=None):
        self._check_received_keys("warp", set(rope_parameters), {"rope_type", "factor", "twist"},
                                  {"rope_theta", "beta"}, ignore_keys=ignore_keys)

    monkeypatch.setitem(ROPE_INIT_FUNCTIONS, "warp", ROPE_INIT_FUNCTIONS["linear"])
    monkeypatch.setitem(ROPE_INIT_FUNCTIONS, "unread", ROPE_INIT_FUNCTIONS["linear"])
    monkeypatch.setattr(RotaryEmbeddingConfigMixin, "_validate_warp_rope_parameters",
                        _validate_warp_rope_parameters, raising=False)
    assert rope_keys()["warp"] == (("factor", "twist"), ("rope_theta", "partial_rotary_factor", "beta"))
    given = rope_parameters('{"rope_type": "warp", "factor": 2, "twist": 3, "beta": 1}')
    assert given == {"rope_type": "warp", "factor": 2, "twist": 3, "beta": 1}
    _checked('{"rope_type": "warp", "factor": 2, "twist": 3, "beta": 1}')
    for text, words in [('{"rope_type": "warp", "factor": 2}', "needs twist"),
                        ('{"rope_type": "warp", "factor": 2, "twist": 3, "gamma": 1}', "takes no gamma"),
                        ("warp:2", "warp needs twist besides a factor"),
                        ('{"rope_type": "unread", "factor": 2}', "'unread' is not one of transformers'")]:
        with pytest.raises(ConfigError, match=words):
            _checked(text)


@pytest.mark.parametrize("text", ["linear:2", '{"rope_type": "linear", "factor": 2}'])
def test_a_refused_rope_type_is_refused_in_one_line_with_its_reason(text, monkeypatch, fresh_rope_keys):
    monkeypatch.setitem(REFUSED, "linear", "its frequencies are not rebuilt from the config")
    with pytest.raises(ConfigError) as err:
        _checked(text)
    message = str(err.value)
    assert "\n" not in message and message.startswith("rope_scaling (--rope-scaling)")
    assert "'linear' is refused: its frequencies are not rebuilt from the config" in message


def test_parse_type_factor_and_json():
    assert rope_parameters("yarn:2") == {"rope_type": "yarn", "factor": 2.0}
    assert rope_parameters('{"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, '
                           '"high_freq_factor": 4}')["low_freq_factor"] == 1
    items = split_rope_scalings('yarn:2,{"rope_type": "longrope", "short_factor": [1, 2], '
                                '"long_factor": [3, 4]},linear:4')
    assert items[0] == "yarn:2" and items[2] == "linear:4" and items[1].startswith("{")
    options = RopeScaled.build({"rope_scaling": ["dynamic:2", LLAMA3]}, where="t")
    assert [name for name, _ in options.rope_conditions()][:2] == ["none", "dynamic:2"]
    assert options.rope_conditions()[2][1]["high_freq_factor"] == 4.0


@pytest.mark.parametrize("text, words", [
    ("yarn", ["needs a factor"]),
    ("yarn:-1", ["factor -1.0 must be a finite number of at least 1"]),
    ('{"factor": 2}', ["needs rope_type"]),
    ('{"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1}',
     ["high_freq_factor (1) must be greater than low_freq_factor (4)"]),
    ("{oops", ["not valid JSON"]),
])
def test_bad_spellings_fail_in_one_line_as_the_options_are_built(text, words):
    """What the text alone decides is refused by the options (torch-free, before any check)."""
    with pytest.raises(ConfigError) as err:
        RopeScaled.build({"rope_scaling": text}, where="pecli length")
    message = str(err.value)
    assert "\n" not in message and message.startswith("pecli length: rope_scaling (--rope-scaling)")
    for word in words:
        assert word in message


@pytest.mark.parametrize("text, words", [
    ("llama3:8", ["low_freq_factor", "high_freq_factor", "besides a factor"]),
    ("longrope:4", ["short_factor", "long_factor"]),
    ("yran:2", ["did you mean 'yarn'"]),
    ("proportional:2", ["JSON dict"]),
    ('{"rope_type": "warp"}', ["not one of transformers' rope types"]),
    ('{"rope_type": "yarn", "factor": 2, "twist": 1}', ["takes no twist"]),
    ('{"rope_type": "llama3", "factor": 8, "high_freq_factor": 4}', ["needs low_freq_factor"]),
])
def test_types_and_keys_fail_in_one_line_before_loading(text, words):
    """What transformers' table decides is refused by the condition's check, before loading."""
    RopeScaled.build({"rope_scaling": text}, where="pecli length")  # the spelling is fine
    with pytest.raises(ConfigError) as err:
        _checked(text)
    message = str(err.value)
    assert "\n" not in message and message.startswith("rope_scaling (--rope-scaling)")
    for word in words:
        assert word in message


def _llama(seed=0, **overrides):
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **overrides)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def _transformers_own(model, rope_parameters):
    """The model transformers builds from a config with these rope_parameters, same weights."""
    config = transformers.LlamaConfig(**{**model.config.to_dict(), "rope_parameters": rope_parameters})
    own = transformers.LlamaForCausalLM(config).eval()
    own.load_state_dict(model.state_dict())
    return own


@pytest.mark.parametrize("given", [{"rope_type": "linear", "factor": 2.0},
                                   {"rope_type": "dynamic", "factor": 2.0},
                                   {"rope_type": "yarn", "factor": 2.0},
                                   {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.5,
                                    "beta_fast": 16},
                                   LLAMA3, LONGROPE])
def test_equals_transformers_own_model_and_restores(given):
    model = _llama()
    ids = torch.randint(0, 97, (2, 160))  # 2.5x the 64-token context
    with torch.inference_mode():
        before = model(ids).logits
        with rope_scaled(model, given) as resolved:
            scaled = model(ids).logits
            assert model.config.rope_parameters == resolved
        after = model(ids).logits
        own = _transformers_own(model, resolved)(ids).logits
    assert resolved["rope_theta"] == 10000.0
    assert torch.equal(scaled, own)  # transformers' own scaled model, bit for bit
    assert not torch.allclose(scaled, before)  # it did change something
    assert torch.equal(after, before)  # restored bit for bit
    assert model.config.rope_parameters["rope_type"] == "default"


def test_original_context_is_the_models_own():
    model = _llama()
    assert resolve(model.config, rope_parameters("yarn:2"))["original_max_position_embeddings"] == 64
    assert "original_max_position_embeddings" not in resolve(model.config, rope_parameters("linear:2"))


def test_json_missing_keys_named_by_transformers():
    model = _llama()
    with pytest.raises(ConfigError, match="low_freq_factor"):
        resolve(model.config, {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0})


def test_not_rotary_is_refused(tiny):
    gpt2 = tiny("gpt2")
    with pytest.raises(ModelError, match="rotary"), rope_scaled(gpt2.model, {"rope_type": "linear", "factor": 2.0}):
        pass
    assert rotary_modules(gpt2.model) == []


def test_dynamic_equals_unscaled_within_the_original_context():
    model = _llama()
    ids = torch.randint(0, 97, (2, 64))  # exactly the original context
    with torch.inference_mode():
        plain = model(ids).logits
        with rope_scaled(model, {"rope_type": "dynamic", "factor": 2.0}):
            dynamic = model(ids).logits
    assert torch.equal(dynamic, plain)


def test_dynamic_past_the_context_differs():
    model = _llama()
    ids = torch.randint(0, 97, (1, 100))
    with torch.inference_mode():
        plain = model(ids).logits
        with rope_scaled(model, {"rope_type": "dynamic", "factor": 2.0}):
            dynamic = model(ids).logits
    assert torch.allclose(dynamic[:, :1], plain[:, :1], atol=1e-5)  # position 0 never rotates
    assert not torch.allclose(dynamic, plain, atol=1e-4)


def test_linear_at_p_equals_unscaled_at_p_over_s():
    model = _llama()
    ids = torch.randint(0, 97, (1, 40))
    s = 4.0
    positions = torch.arange(40)[None]
    with torch.inference_mode():
        with rope_scaled(model, {"rope_type": "linear", "factor": s}):
            scaled = model(ids, position_ids=positions).logits
        # unscaled at fractional positions p / s: rotary takes position ids as floats
        rotary = model.model.rotary_emb
        hooked = rotary.register_forward_pre_hook(
            lambda mod, args, kwargs: (args, {**kwargs, "position_ids": kwargs["position_ids"] / s}),
            with_kwargs=True)
        try:
            fractional = model(ids, position_ids=positions).logits
        finally:
            hooked.remove()
    assert torch.allclose(scaled, fractional, atol=1e-5)


@pytest.mark.parametrize("factor", [2.0, 4.0, 16.0])
def test_yarn_attention_factor(factor):
    model = _llama()
    with rope_scaled(model, {"rope_type": "yarn", "factor": factor}):
        assert model.model.rotary_emb.attention_scaling == pytest.approx(0.1 * math.log(factor) + 1)
    with rope_scaled(model, {"rope_type": "yarn", "factor": factor, "attention_factor": 1.25}):
        assert model.model.rotary_emb.attention_scaling == 1.25
    assert model.model.rotary_emb.attention_scaling == 1.0


def test_provenance_records_the_resolved_parameters():
    import json

    model = _llama()
    with rope_scaled(model, rope_parameters("yarn:2")) as resolved:
        row = provenance("yarn:2", resolved)
    assert json.loads(row["rope_parameters"])["original_max_position_embeddings"] == 64
    assert row["rope_scaling"] == "yarn:2"
    assert json.loads(provenance("none", None, model.config)["rope_parameters"])["rope_type"] == "default"


def test_bfloat16_model_matches_transformers_own_in_bfloat16():
    model = _llama().to(torch.bfloat16)
    ids = torch.randint(0, 97, (1, 100))
    with torch.inference_mode(), rope_scaled(model, {"rope_type": "yarn", "factor": 2.0}) as resolved:
        scaled = model(ids).logits
        assert model.model.rotary_emb.inv_freq.dtype == torch.bfloat16
    own = _transformers_own(model.float(), resolved).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(scaled, own(ids).logits)


def test_hooks_on_the_rotary_module_are_refused_not_dropped():
    model = _llama()
    handle = model.model.rotary_emb.register_forward_hook(lambda *a: None)
    with pytest.raises(ModelError, match="enter rope_scaled before"), rope_scaled(model, {"rope_type": "linear", "factor": 2.0}):
        pass
    handle.remove()
    with rope_scaled(model, {"rope_type": "linear", "factor": 2.0}):
        model.model.rotary_emb.register_forward_hook(lambda *a: None)  # inside: on the new module
