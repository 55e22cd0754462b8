"""Fault injection, rope parameters: one check whatever their spelling (TYPE:FACTOR or a
JSON dict), decided before any condition is scored.

Classes: a value that is not a finite number of its kind (NaN, inf, 1e400, a string, a bool,
negative, a factor below 1, a base of at most 1), keys a type requires or does not take, pairs
out of order, and what only the model's config decides (longrope's lists, one value per
rotated frequency; a model with no rotary positions), refused before the intact model is
scored.
"""

from __future__ import annotations

import pandas as pd
import pytest
import transformers

from pecli.positions.rope_scaling import RopeScaled
from pecli.positions.rotary import check_scalings, resolve
from pecli.runs.errors import ConfigError, ModelError

TEXTS = ["The cat sat on the mat and looked around the room for a while.",
         "A boat drifted across the lake under a grey and quiet sky."] * 4


def _refused(text: str) -> str:
    """The one-line refusal of an item: by the options (its spelling and values) or by the
    condition's check before loading (transformers' rope types and their keys)."""
    from pecli.positions.conditions import plan

    with pytest.raises(ConfigError) as err:
        for rope in RopeScaled.build({"rope_scaling": text}, where="pecli length").rope_scaling:
            plan(rope=rope).check("random:llama")
    message = str(err.value)
    assert "\n" not in message
    assert message.removeprefix("pecli length: ").startswith("rope_scaling (--rope-scaling)")
    return message


# The same value spelt both ways is refused with the same message: one path of checks.
@pytest.mark.parametrize("short, json_value", [
    ("linear:nan", "NaN"), ("linear:inf", "Infinity"), ("dynamic:inf", "1e400"),
    ("linear:-2", "-2.0"), ("yarn:0.5", "0.5"), ("yarn:0", "0.0"), ("dynamic:abc", '"abc"'),
])
def test_a_bad_factor_is_refused_alike_in_both_spellings(short, json_value):
    kind = short.split(":")[0]
    by_short = _refused(short)
    by_json = _refused(f'{{"rope_type": "{kind}", "factor": {json_value}}}')
    assert "must be a finite number of at least 1" in by_short
    assert by_short == by_json


@pytest.mark.parametrize("params, words", [
    ({"rope_type": "linear", "factor": 2, "rope_theta": -10000}, "rope_theta -10000 must be a finite number greater than 1"),
    ({"rope_type": "linear", "factor": 2, "rope_theta": 1}, "rope_theta 1 must be"),
    ({"rope_type": "linear", "factor": True}, "factor True must be"),
    ({"rope_type": "linear", "factor": [2]}, "factor [2] must be"),
    ({"rope_type": "linear", "factor": 2, "partial_rotary_factor": 1.5}, "partial_rotary_factor 1.5 must be a number in (0, 1]"),
    ({"rope_type": "yarn", "factor": 2, "beta_fast": "fast"}, "beta_fast 'fast' must be a finite positive number"),
    ({"rope_type": "yarn", "factor": 2, "truncate": "yes"}, "truncate 'yes' must be true or false"),
    ({"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 12.5}, "must be a positive integer"),
    ({"rope_type": "yarn", "factor": 2, "beta_fast": 1, "beta_slow": 32}, "beta_fast (1) must be greater than beta_slow (32)"),
    ({"rope_type": "yarn", "factor": 2, "attention_factor": -1}, "attention_factor -1 must be"),
    ({"rope_type": "llama3", "factor": 8}, "llama3 needs low_freq_factor and high_freq_factor"),
    ({"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1}, "high_freq_factor (1) must be greater"),
    ({"rope_type": "longrope", "short_factor": [1.0, 1.0]}, "longrope needs long_factor"),
    ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0, None]}, "long_factor [1.0, None] must be a non-empty list"),
    ({"rope_type": "longrope", "short_factor": [], "long_factor": [1.0]}, "short_factor [] must be a non-empty list"),
    ({"rope_type": "linear"}, "linear needs factor"),
    ({"rope_type": "linear", "factor": 2, "scale": 3}, "linear takes no scale; it takes factor"),
    ({"type": "linear", "rope_type": "linear", "factor": 2}, "gives both type and rope_type"),
    ({"rope_type": 3, "factor": 2}, "needs rope_type, a string naming one of"),
])
def test_json_rope_parameters_are_checked_key_by_key(params, words):
    import json

    assert words in _refused(json.dumps(params))


def test_good_parameters_pass_in_both_spellings():
    a = RopeScaled.build({"rope_scaling": "yarn:2"}, where="t").rope_conditions()[1][1]
    b = RopeScaled.build({"rope_scaling": '{"type": "yarn", "factor": 2.0, "beta_fast": 32, '
                                          '"beta_slow": 1}'}, where="t").rope_conditions()[1][1]
    assert a == {"rope_type": "yarn", "factor": 2.0}
    assert b == {"rope_type": "yarn", "factor": 2.0, "beta_fast": 32, "beta_slow": 1}


def _llama_config(**overrides):
    return transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **overrides)


@pytest.mark.parametrize("short, long", [(3, 4), (4, 3), (1, 1), (8, 8)])
def test_longrope_lists_must_have_one_value_per_rotated_frequency(short, long):
    config = _llama_config()  # head_dim 8: 4 frequencies
    params = {"rope_type": "longrope", "short_factor": [1.0] * short, "long_factor": [1.0] * long}
    with pytest.raises(ConfigError, match=r"has \d values; llama's heads rotate 4 frequencies"):
        check_scalings(config, [None, params])
    resolved = resolve(config, {**params, "short_factor": [1.0] * 4, "long_factor": [2.0] * 4})
    assert resolved["original_max_position_embeddings"] == 64


def _csv(tmp_path):
    path = tmp_path / "texts.csv"
    pd.DataFrame({"text": TEXTS}).to_csv(path, index=False)
    return path


def _one_line(result, fragment):
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and fragment in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.parametrize("command", ["length", "passkey"])
def test_what_the_config_decides_is_refused_before_the_intact_model_is_scored(
        command, tmp_path, use_tiny, invoke, monkeypatch):
    def scored(*args, **kwargs):
        raise AssertionError("a condition was scored before the bad rope scaling was refused")

    monkeypatch.setattr("pecli.measures.lm_scoring.score_windows", scored)
    monkeypatch.setattr("pecli.measures.passkey.decode", scored)
    wrong = '{"rope_type": "longrope", "short_factor": [1, 1, 1], "long_factor": [1, 1, 1]}'
    args = ["--dataset", str(_csv(tmp_path)), "--lengths", "16"] if command == "length" else \
        ["--lengths", "64", "--trials", "1"]
    _one_line(invoke(command, "llama", *args, "--rope-scaling", f"yarn:2,{wrong}",
                     "--out", str(tmp_path / "o")), "longrope: short_factor has 3 values")
    assert not (tmp_path / "o").exists()


def test_lm_eval_refuses_rope_scaling_on_a_learned_model_before_loading(tmp_path, invoke, monkeypatch):
    monkeypatch.setattr("pecli.models.loading.load_model",
                        lambda *a, **k: pytest.fail("loaded before refusing"))
    _one_line(invoke("lm-eval", "--model_args", "pretrained=random:gpt2", "--tasks", "x",
                     "--rope-scaling", "yarn:2", "--out", str(tmp_path / "o")),
              "random:gpt2 has learned positions; --rope-scaling applies to rotary")


def test_a_model_without_rotary_parameters_is_refused_by_the_config_check(tiny):
    with pytest.raises(ModelError, match="no rotary rope_parameters"):
        check_scalings(tiny("gpt2").model.config, [{"rope_type": "linear", "factor": 2.0}])
