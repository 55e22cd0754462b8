"""Every name of a vocabulary (pecli.runs.names) has an implementation, and no implementation
lacks a name: the registries users see and the code that runs them cannot drift apart."""

from __future__ import annotations

import pytest

from pecli.positions import interventions, masks
from pecli.runs import names


@pytest.mark.parametrize("vocabulary,implementations", [
    (names.INTERVENTIONS, interventions.IMPLEMENTATIONS),
    (names.MASKS, masks.WEIGHTS),
    (names.MASK_SEMANTICS, masks.PROBS),
], ids=["interventions", "masks", "mask_semantics"])
def test_every_name_has_an_implementation_and_vice_versa(vocabulary, implementations):
    assert list(implementations) == vocabulary.names()


def test_every_intervention_implements_the_position_kinds_it_claims():
    for name, term in names.INTERVENTIONS.items():
        impl = interventions.IMPLEMENTATIONS[name]
        for kind, field in interventions.KIND_FIELDS.items():
            if kind in term.applies_to:
                assert getattr(impl, field) is not None, (name, kind)
        fields = {interventions.KIND_FIELDS[k] for k in term.applies_to}
        for field in set(interventions.KIND_FIELDS.values()) - fields:
            assert getattr(impl, field) is None, (name, field)


def test_every_position_kind_has_its_implementations():
    from pecli.models.architectures import POSITION_KINDS

    assert set(interventions.KIND_FIELDS) == set(POSITION_KINDS)
    assert {k for t in names.INTERVENTIONS.values() for k in t.applies_to} == set(POSITION_KINDS)


@pytest.mark.parametrize("protocol", names.PROTOCOLS.names())
@pytest.mark.parametrize("semantics", names.MASK_SEMANTICS.names())
@pytest.mark.parametrize("mask", names.MASKS.names())
def test_every_protocol_is_planned_for_every_mask_and_semantics(mask, semantics, protocol):
    from pecli.measures.lm_scoring import plan
    from pecli.positions.masks import MODES

    for fast in (True, False):
        how = plan(mask, semantics, protocol, fast=fast)
        assert how.passes in ("one-pass", "prefix-by-prefix")
        if how.attention is not None:  # an attention pecli.positions.masks can build
            assert how.attention.mode in MODES
            assert how.attention.mask.name in masks.WEIGHTS
            assert how.attention.semantics.name in masks.PROBS
        assert (str(how.mask), str(how.mask_semantics), str(how.protocol)) == (
            mask, semantics, protocol)


def test_every_long_text_treatment_makes_windows():
    from pecli.measures.lm_scoring import windows_for

    for name in names.LONG_TEXT.names():
        prepared = windows_for([list(range(20))], 8, None, name)
        assert prepared.long_text == name and prepared.windows


def test_traits_the_plan_reads_match_the_weights():
    import torch

    for name, term in names.MASKS.items():
        w = masks.key_weights(name, 6, heads=8)  # [heads, q], oldest key first
        rising = bool((w[:, 1:] > w[:, :-1]).all())
        assert ("rises_to_newest" in term.traits) == rising, name
        far = masks.key_weights(name, 400, heads=8)  # alibi's steepest head reaches 0 (fp32)
        assert ("positive" in term.traits) == bool((far > 0).all()), name
    assert torch.equal(masks.key_weights("default", 3), torch.ones(1, 3))
