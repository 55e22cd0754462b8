"""pecli.conditions, the Python API (docs/api.md): parse and build give the commands' one
Condition; `applied` acts as the commands' path does and leaves the model bit for bit as it
was; `model.generate` runs under a remedy with the KV cache."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import pecli.conditions as pc
from pecli.positions.interventions import intervene
from pecli.positions.remedies import attention_modules
from pecli.runs.errors import PecliError


def _state(model) -> dict:
    """Everything `applied` could leave behind: tensors, hooks, attributes, the attention."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    modules = dict(model.named_modules())
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
             "_forward_pre_hooks_with_kwargs", "_backward_hooks")
    return {
        "tensors": {k: v.clone() for k, v in [*model.state_dict().items(), *model.named_buffers()]},
        "hooks": {name: [dict(getattr(m, h)) for h in hooks] for name, m in modules.items()},
        "attributes": {name: sorted(vars(m)) for name, m in modules.items()},
        "classes": {name: type(m) for name, m in modules.items()},
        "attention": model.config._attn_implementation,
        "rope": repr(getattr(model.config, "rope_parameters", None)),
        "registries": [dict(r._global_mapping) for r in (AttentionInterface, AttentionMaskInterface)],
    }


def _same(a: dict, b: dict) -> None:
    assert a["tensors"].keys() == b["tensors"].keys()
    for k in a["tensors"]:
        assert torch.equal(a["tensors"][k], b["tensors"][k]), k
    for key in ("hooks", "attributes", "classes", "attention", "rope", "registries"):
        assert a[key] == b[key], key


def _ids(model, n=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (1, n), generator=gen)


@pytest.mark.parametrize("condition", ["selfextend:2:8", "sinks:2:5", "rerope:8:4", "zero", "zero@0",
                                       "droplow:0.5", "shift:3@1"])
def test_leaving_a_condition_restores_the_model_bit_for_bit(tiny, condition):
    loaded = tiny("llama", initializer_range=0.3)
    model = loaded.model
    ids = _ids(model)
    before, intact = _state(model), model(input_ids=ids).logits
    with pc.applied(model, condition), torch.no_grad():
        changed = model(input_ids=ids).logits
    _same(before, _state(model))
    assert torch.equal(model(input_ids=ids).logits, intact)
    if not condition.startswith("shift"):
        assert not torch.allclose(changed, intact)


def test_a_rope_scaling_is_restored_too(tiny):
    loaded = tiny("llama", initializer_range=0.3)
    before = _state(loaded.model)
    with pc.applied(loaded.model, pc.parse("selfextend:2:8", rope="yarn:2")):
        pass
    _same(before, _state(loaded.model))


def test_a_condition_inside_another_is_refused_and_the_outer_one_stays(tiny):
    """Entered one inside the other, two conditions composed by accident (zero inside
    Self-Extend gave logits equal to neither): refused in one line, the outer condition still
    applied, and the model restored on leaving it."""
    loaded = tiny("llama", initializer_range=0.3)
    model = loaded.model
    ids = _ids(model)
    before = _state(model)
    with torch.no_grad(), pc.applied(model, "selfextend:2:8"):
        outer = model(input_ids=ids).logits
        with pytest.raises(PecliError, match="already under condition 'selfextend:2:8'; apply one "
                                             "condition at a time"):
            with pc.applied(model, "zero"):
                pass
        assert torch.equal(model(input_ids=ids).logits, outer)
    _same(before, _state(model))
    with pc.applied(model, "zero"):  # one after the other is fine
        pass


def test_a_transformers_model_equals_the_commands_path(tiny):
    """`applied` on the bare transformers model gives the numbers `intervene` (the commands'
    Condition.applied) gives on pecli's LoadedModel."""
    loaded = tiny("pythia", initializer_range=0.3)
    ids = _ids(loaded.model)
    with torch.no_grad():
        with pc.applied(loaded.model, "selfextend:2:8"):
            ours = loaded.model(input_ids=ids).logits
        with intervene(loaded, "selfextend:2:8"):
            theirs = loaded.model(input_ids=ids).logits
    assert torch.equal(ours, theirs)


def test_generate_under_a_remedy_equals_greedy_full_passes(tiny):
    """model.generate (KV cache on) under sinks:2:5: each new token is the argmax of a full
    pass over its prefix under the same remedy."""
    loaded = tiny("llama", initializer_range=0.3)
    model = loaded.model
    ids = _ids(model, 12)
    with pc.applied(model, "sinks:2:5"), torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                             do_sample=False, use_cache=True, pad_token_id=0)
        for t in range(12, out.shape[1]):
            assert model(input_ids=out[:, :t]).logits[0, -1].argmax() == out[0, t]
    with torch.no_grad():
        plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                               do_sample=False, use_cache=True, pad_token_id=0)
    assert not torch.equal(out, plain)  # the remedy acted


def test_build_and_parse_give_one_condition():
    assert pc.build("selfextend", group=4, window=1024) == pc.parse("selfextend:4:1024")
    assert pc.build("selfextend", 4, window=1024) == pc.parse("selfextend:4:1024")
    assert pc.build("rerope", window=8, leak=4.0) == pc.parse("rerope:8:4")
    assert pc.build("lminfinite", sinks=4, window=64) == pc.parse("lminfinite:4:64")
    assert pc.build("shift", 3) == pc.parse("shift:3")
    assert pc.build("zero", layers="even") == pc.parse("zero@even")
    assert pc.parse("selfextend:4:1024", rope="yarn:2").label == "selfextend:4:1024 + yarn:2"


@pytest.mark.parametrize("call, words", [
    (lambda: pc.build("selfextend", group=4, width=8), "no parameter width"),
    (lambda: pc.build("rerope", leak=2.0), "give window"),
    (lambda: pc.parse("selfextend:4"), "selfextend takes"),
    (lambda: pc.parse("stretch:2"), "stretch"),
])
def test_bad_conditions_are_one_line_errors(call, words):
    with pytest.raises(PecliError) as err:
        call()
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("family, condition, words", [
    ("gpt2", "rerope:8", "learned positions"),
    ("modernbert", "sinks:2:8", "an encoder"),
])
def test_meaningless_conditions_are_refused_before_anything_changes(tiny, family, condition, words):
    loaded = tiny(family)
    before = _state(loaded.model)
    with pytest.raises(PecliError) as err:
        with pc.applied(loaded.model, condition):
            pass
    assert words in str(err.value) and "\n" not in str(err.value)
    _same(before, _state(loaded.model))


def test_the_docs_example_runs(smollm2):
    """docs/api.md's example, as written, on SmolLM2 (a short prompt)."""
    text = (Path(__file__).parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    code = code.replace('load_model("smollm2", device="cpu")', "smollm2")  # the session's copy
    scope = {"smollm2": smollm2}
    before = _state(smollm2.model)
    exec(compile(code, "docs/api.md", "exec"), scope)
    assert scope["out"].shape[1] > scope["inputs"]["input_ids"].shape[1]
    assert torch.isfinite(scope["loss"]) and scope["loss"] > 0
    inputs = scope["inputs"]
    with torch.no_grad(), pc.applied(smollm2.model, "zero"):  # SmolLM2: every layer is full attention
        zero = smollm2.model(**inputs, labels=inputs["input_ids"]).loss
    torch.testing.assert_close(scope["loss"].detach(), zero, rtol=1e-6, atol=0)
    _same(before, _state(smollm2.model))
    assert len(attention_modules(smollm2)) == smollm2.model.config.num_hidden_layers
