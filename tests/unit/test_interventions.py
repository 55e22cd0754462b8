"""Interventions: exact restore, effect, errors; parametrised over every family."""

from __future__ import annotations

import re

import pytest
import torch

from pecli.models.architectures import ARCHITECTURES, position_embedding
from pecli.positions.interventions import (
    INTERVENTIONS,
    intervene,
    intervention_names,
    sinusoidal_table,
)
from pecli.runs.errors import InterventionError

FAMILIES = ARCHITECTURES.names()



def _applicable(family: str) -> list[str]:
    from pecli.positions.interventions import ACTS_IN_ATTENTION, REMEDIES

    spec = ARCHITECTURES.get(family)
    names = []
    for name in intervention_names():
        base = re.split(r"[:\[]", name)[0]  # shift:K, logscale[:c]
        iv = INTERVENTIONS.get(base)
        if spec.position not in iv.applies_to:
            continue
        if base in ACTS_IN_ATTENTION and (spec.sincos or spec.own_attention
                                          or family in ("modernbert", "gemma3")  # a rotation per layer type
                                          or (base in REMEDIES and not spec.causal)):
            continue  # refused (tests/unit/test_remedies.py)
        if ARGUMENTS.get(name, name) is not None:
            names.append(ARGUMENTS.get(name, name))
    return names


# 12-token batches: windows short enough that every remedy changes something
ARGUMENTS = {"shift:K": "shift:3", "swap:MODEL": "swap:donor", "sinks:K:W": "sinks:1:4",
             "lminfinite:K:W[:D]": "lminfinite:1:4", "selfextend:G:W": "selfextend:2:4",
             "rerope:W[:k]": "rerope:4", "droplow:F": "droplow:1", "drophigh:F": "drophigh:1",
             "string:S[:W]": "string:2:4", "dca:C[:L]": "dca:6:1", "temperature:T": "temperature:0.5",
             # the log-length scale acts past the trained context only, far beyond 12 tokens
             # (tests/unit/test_remedies_more.py checks it where it acts)
             "logscale[:c]": None}


CASES = [(f, n) for f in FAMILIES for n in _applicable(f)]


@pytest.fixture
def donor(monkeypatch, tiny):
    """swap:donor lends the rows of a differently seeded tiny model of the same family."""
    made = {}

    def load(name, seed):
        return made[name]

    monkeypatch.setattr("pecli.positions.interventions.load_donor", load)
    return made


def _batch(loaded, n=2, length=12, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 200, (n, length), generator=gen)
    return ids, torch.ones_like(ids)


def _hidden(loaded, ids, mask):
    with torch.inference_mode():
        out = loaded.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    return out.hidden_states[-1]


@pytest.mark.parametrize("family,name", CASES)
def test_restores_bit_identical_and_changes_output(family, name, tiny, donor):
    loaded = tiny(family)
    donor["donor"] = tiny(family, seed=7)
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    ids, mask = _batch(loaded)
    ref = _hidden(loaded, ids, mask)
    with intervene(loaded, name, seed=0):
        inside = _hidden(loaded, ids, mask)
    after = loaded.model.state_dict()
    assert before.keys() == after.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), key
    assert torch.equal(_hidden(loaded, ids, mask), ref)  # hooks are gone too
    changed = not torch.allclose(inside, ref, atol=1e-4)
    # learned is the baseline; a shift of rotary ids keeps every relative offset.
    expect_change = name != "intact" and not (ARCHITECTURES.get(family).rotates
                                               and name.startswith("shift"))
    assert changed == expect_change


@pytest.mark.parametrize("family", FAMILIES)
def test_restores_after_an_error_inside(family, tiny):
    loaded = tiny(family)
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    with pytest.raises(RuntimeError), intervene(loaded, "zero"):
        raise RuntimeError("boom")
    for key, value in loaded.model.state_dict().items():
        assert torch.equal(before[key], value), key


@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2"])
def test_zero_zeroes_only_position_rows(family, tiny):
    loaded = tiny(family)
    table = position_embedding(loaded.model, loaded.spec)
    offset = loaded.spec.pos_offset
    reserved = table.weight[:offset].clone()
    with intervene(loaded, "zero"):
        assert torch.count_nonzero(table.weight[offset:]) == 0
        assert torch.equal(table.weight[:offset], reserved)  # RoBERTa's padding rows kept


def test_learned_edits_match_their_definitions(tiny):
    loaded = tiny("gpt2")
    table = position_embedding(loaded.model, loaded.spec)
    rows = table.weight.detach().clone()  # [64, 32]
    with intervene(loaded, "reverse"):
        assert torch.equal(table.weight[0], rows[-1])
    with intervene(loaded, "shift:3"):
        assert torch.equal(table.weight[0], rows[3])
        assert torch.equal(table.weight[-1], rows[-1])  # past the end: last row repeats
    with intervene(loaded, "shuffle", seed=0):
        a = table.weight.detach().clone()
    with intervene(loaded, "shuffle", seed=0):
        assert torch.equal(table.weight, a)  # seeded
    assert sorted(a.sum(1).tolist()) == pytest.approx(sorted(rows.sum(1).tolist()))
    with intervene(loaded, "sinusoidal"):
        norms = table.weight.norm(dim=1)
        assert norms.mean().item() == pytest.approx(rows.norm(dim=1).mean().item(), rel=1e-5)
    with intervene(loaded, "random", seed=0):
        w = table.weight.detach().double()
        assert w.mean().item() == pytest.approx(rows.double().mean().item(), abs=0.01)
        assert w.std().item() == pytest.approx(rows.double().std().item(), rel=0.05)


def test_sinusoidal_table_values():
    pe = sinusoidal_table(4, 6)
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert pe[1, 0].item() == pytest.approx(torch.sin(torch.tensor(1.0)).item())
    assert pe[2, 3].item() == pytest.approx(torch.cos(torch.tensor(2 / 10000 ** (2 / 6))).item())


def test_errors(tiny, donor):
    loaded = tiny("llama")
    with pytest.raises(InterventionError, match="does not apply"), intervene(loaded, "sinusoidal"):
        pass
    with pytest.raises(InterventionError, match="unknown intervention 'zeros'.*did you mean 'zero'"):
        with intervene(loaded, "zeros"):
            pass
    with pytest.raises(InterventionError, match="needs an argument"), intervene(loaded, "shift"):
        pass
    with pytest.raises(InterventionError, match="integer"), intervene(loaded, "shift:x"):
        pass
    gpt2 = tiny("gpt2")
    donor["wide"] = tiny("gpt2", n_embd=64)
    before = position_embedding(gpt2.model, gpt2.spec).weight.clone()
    with pytest.raises(InterventionError, match="width 64 does not match"):
        with intervene(gpt2, "swap:wide"):
            pass
    assert torch.equal(position_embedding(gpt2.model, gpt2.spec).weight, before)
    donor["rope"] = loaded
    with pytest.raises(InterventionError, match="rotary positions"), intervene(gpt2, "swap:rope"):
        pass


def test_swap_copies_rows_and_zero_fills(tiny, donor):
    gpt2 = tiny("gpt2")
    donor["bert"] = tiny("bert")  # 64 rows of width 32
    theirs = position_embedding(donor["bert"].model, donor["bert"].spec).weight
    with intervene(gpt2, "swap:bert"):
        assert torch.equal(position_embedding(gpt2.model, gpt2.spec).weight, theirs)
    short = tiny("bert", max_position_embeddings=16)
    donor["short"] = short
    with intervene(gpt2, "swap:short"):
        w = position_embedding(gpt2.model, gpt2.spec).weight
        assert torch.count_nonzero(w[16:]) == 0
        assert torch.equal(w[:16], position_embedding(short.model, short.spec).weight)
