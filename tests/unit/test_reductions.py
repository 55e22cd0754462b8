"""Every condition that cannot change a pair at this length is the intact model, on every
family (issue 43 §2): sinks with K+W >= the length, Self-Extend with group 1, ReRoPE with
W >= the length, droplow:0, a per-layer condition on no layers, a mask of weight 1. The
families include layouts whose attention does more than rotate: sliding windows (Mistral,
Gemma 2), query scaling by query_pre_attn_scalar and logit soft-capping (Gemma 2). Each
reduction runs twice: as pecli runs it (the exact shortcut: 1e-6 relative) and through the
remedies' blocked path (their merged score sets: float noise), on a batch with a left-padded row.
"""

from __future__ import annotations

import pytest
import torch

from pecli.models.architectures import ARCHITECTURES, layer_types
from pecli.positions.interventions import check_applies, intervene
from pecli.positions.remedies import attention_modules
from pecli.runs.errors import InterventionError, ModelError

N = 24  # tokens: three sliding windows of 8
REDUCTIONS = [f"sinks:4:{N}", f"sinks:0:{N}", "selfextend:1:4", f"rerope:{N}", f"rerope:{N}:4",
              f"lminfinite:2:{N}", "droplow:0", "drophigh:0", "zero@none", "selfextend:2:4@none"]
BLOCKED = {f"sinks:4:{N}", "selfextend:1:4", f"rerope:{N}", f"lminfinite:2:{N}"}
WINDOWED = [f for f in ARCHITECTURES.names()
            if "sliding_attention" in layer_types(ARCHITECTURES.get(f).random_config())
            and ARCHITECTURES.get(f).causal]


@pytest.fixture(params=ARCHITECTURES.names())
def model(request, tiny):
    return tiny(request.param, initializer_range=0.3)


def _hidden(loaded, ids, mask):
    pos = (mask.cumsum(-1) - 1).clamp(min=0) + loaded.spec.position_ids_offset
    with torch.no_grad():
        return loaded.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                            output_hidden_states=True).hidden_states[-1]


def _batch(loaded):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, min(200, loaded.model.config.vocab_size), (2, N), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # one left-padded row
    return ids, mask


def _relative(out, ref, mask):
    real = mask.bool()
    return float((out - ref)[real].abs().max() / ref[real].abs().max())


def test_each_reduction_is_the_intact_model(model):
    ids, mask = _batch(model)
    intact = _hidden(model, ids, mask)
    ran = []
    for name in REDUCTIONS:
        try:
            check_applies(model, name)
        except (InterventionError, ModelError) as err:  # where it has no meaning: one line
            assert "\n" not in str(err)
            continue
        with intervene(model, name):
            assert _relative(_hidden(model, ids, mask), intact, mask) <= 1e-6, name
        ran.append(name)
        if name not in BLOCKED:
            continue
        modules = attention_modules(model)
        for m in modules:
            m.pecli_remedy_literal = True  # skip the exact shortcut: the blocked path itself
        try:
            with intervene(model, name):
                assert _relative(_hidden(model, ids, mask), intact, mask) <= 1e-5, name
        finally:
            for m in modules:
                del m.pecli_remedy_literal
    assert ran or model.spec.own_attention or not model.spec.rotates  # a rotary decoder: all
    assert torch.equal(_hidden(model, ids, mask), intact)  # and restored


def test_the_default_mask_is_the_intact_model(model):
    """The plain mask under every semantics keeps the layer's window, scaling and soft-cap."""
    from pecli.positions.masks import check_maskable, masked_attention

    try:
        check_maskable(model)
    except ModelError:
        pytest.skip("its own attention code: masks are refused")
    ids, mask = _batch(model)
    intact = _hidden(model, ids, mask)
    for semantics in ("legacy", "boolean", "log-bias", "scale"):
        with masked_attention(model.model, "default", semantics):
            assert _relative(_hidden(model, ids, mask), intact, mask) <= 1e-5, semantics


@pytest.mark.parametrize("family", WINDOWED)
def test_the_window_is_what_the_remedies_keep(family, tiny):
    """The windows do matter: without its window the model answers otherwise, so the
    reductions' equality is not vacuous."""
    loaded = tiny(family, initializer_range=0.3)
    ids, mask = _batch(loaded)
    own = _hidden(loaded, ids, mask)
    loaded.model.config.sliding_window = 10 * N  # the masks are built from the config
    assert _relative(_hidden(loaded, ids, mask), own, mask) > 1e-3
