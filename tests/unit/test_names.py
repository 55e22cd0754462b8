"""Every name of a vocabulary (pecli.runs.names) has an implementation, and no implementation
lacks a name: the registries users see and the code that runs them cannot drift apart."""

from __future__ import annotations

import pytest

from pecli.positions import interventions, masks
from pecli.runs import names


@pytest.mark.parametrize("vocabulary,implementations", [
    (names.INTERVENTIONS, {name: None for name, _ in interventions.IMPLEMENTATIONS}),
    (names.MASKS, masks.WEIGHTS),
    (names.MASK_SEMANTICS, masks.PROBS),
], ids=["interventions", "masks", "mask_semantics"])
def test_every_name_has_an_implementation_and_vice_versa(vocabulary, implementations):
    assert sorted(implementations) == sorted(vocabulary.names())


def test_every_intervention_implements_exactly_the_position_kinds_it_claims():
    """One table keyed by (name, kind): a name has an entry for each kind it applies to (and
    GPT-J's sin/cos table where it applies to rotary positions without acting inside the
    attention, which GPT-J's own attention refuses), and none for any other."""
    for name, term in names.INTERVENTIONS.items():
        kinds = {kind for n, kind in interventions.IMPLEMENTATIONS if n == name}
        sincos = "rotary" in term.applies_to and name not in interventions.ACTS_IN_ATTENTION
        assert kinds == {*term.applies_to, *([interventions.SINCOS] if sincos else [])}, name


def test_every_position_kind_has_its_implementations():
    from pecli.models.architectures import POSITION_KINDS

    kinds = {kind for _, kind in interventions.IMPLEMENTATIONS}
    assert kinds == {*POSITION_KINDS, interventions.SINCOS}
    assert {k for t in names.INTERVENTIONS.values() for k in t.applies_to} == set(POSITION_KINDS)


def test_each_remapping_is_one_map_of_positions():
    """reverse, shift and shuffle are written once, as maps of positions, and mean the same
    for learned rows, rotary position ids and GPT-J's sin/cos rows."""
    import torch

    n, p = 8, torch.arange(8)
    assert interventions.MAPS["reverse"](n, None, 0)(p).tolist() == [7, 6, 5, 4, 3, 2, 1, 0]
    assert interventions.MAPS["shift"](n, "3", 0)(p).tolist() == list(range(3, 11))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(5))
    assert torch.equal(interventions.MAPS["shuffle"](n, None, 5)(p), perm)
    rows = torch.arange(n * 2, dtype=torch.float32).view(n, 2)
    edit = interventions._mapped_rows(interventions.MAPS["shift"])
    assert edit(None, rows, "3", 0)[:, 0].tolist() == [6, 8, 10, 12, 14, 14, 14, 14]  # clamped
    table = interventions._sincos_at(p, 4)
    sincos = interventions._mapped_sincos(interventions.MAPS["reverse"])
    assert torch.equal(sincos(table, None, 0), table.flip(0))
    shifted = interventions._mapped_sincos(interventions.MAPS["shift"])(table, "3", 0)
    assert torch.equal(shifted, interventions._sincos_at(p + 3, 4))  # computed past the table


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
