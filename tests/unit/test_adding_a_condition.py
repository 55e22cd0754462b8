"""Adding a kind of condition (CONTRIBUTING's worked example), end to end, as
test_adding_an_experiment does for an experiment: a throwaway kind, `temperature` (the output
logits divided by T), written in the three places CONTRIBUTING lists (a field on Condition, a
Kind in conditions.KINDS, a Part in labels.PARTS) is crossed by every experiment's grid,
applied in the one stack, named in the tables' columns and labels, and read back by pecli
compare. Leaving out any one of the three places fails."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager, nullcontext

import numpy as np
import pandas as pd
import pytest
import torch

from pecli.positions import conditions as C
from pecli.positions import labels

PLACES = ("field", "kind", "part")
T = 2.0


def add_temperature(monkeypatch, leave_out: str | None = None) -> None:
    """The kind, in each of its places but `leave_out`."""
    if leave_out != "field":  # 1. a field on Condition (None: unchanged)
        with_field = dataclasses.make_dataclass(
            "Condition", [("temperature", float | None, dataclasses.field(default=None))],
            bases=(C.Condition,), frozen=True)
        monkeypatch.setattr(C, "Condition", with_field)

    def prepare(c, loaded, seed):
        if c.temperature is None:
            return nullcontext

        @contextmanager
        def divided():
            weight = loaded.model.get_output_embeddings().weight
            saved = weight.detach().clone()
            with torch.no_grad():
                weight.div_(c.temperature)
            try:
                yield
            finally:
                with torch.no_grad():
                    weight.copy_(saved)

        return divided

    if leave_out != "kind":  # 2. its Kind: columns, check, context, place in the stack
        kind = C.Kind("temperature", ("temperature",), 3,
                      lambda c, loaded: {"temperature": str(c.temperature or "none")},
                      lambda c, ref: None, prepare)
        monkeypatch.setattr(C, "KINDS", (*C.KINDS, kind))
    if leave_out != "part":  # 3. its columns and its part of the label, read from a row
        monkeypatch.setitem(labels.PARTS, "temperature", labels.Part(
            ("temperature",),
            lambda row: None if str(row.get("temperature", "none")) in ("none", "nan") else
            f"T={row['temperature']}"))


def _grids() -> dict:
    """Every experiment that crosses conditions, by its own grid entry, on options that give
    the new kind's field (object.__setattr__: the option itself is not part of the test)."""
    from pecli.experiments import EXPERIMENTS, attn, length, mc, passkey, perplexity, ruler  # noqa: F401
    from pecli.integrations import lm_eval

    # each experiment's own entry where it has one; attn, ruler and lm-eval call grid itself
    entries = {"perplexity": perplexity.conditions, "length": length.conditions,
               "passkey": passkey.conditions, "mc": mc.conditions, "attn": C.grid,
               "ruler": C.grid}
    out = {}
    for name, entry in entries.items():
        o = EXPERIMENTS.get(name).options.build({"intervention": "zero"}, "test")
        object.__setattr__(o, "temperature", (T,))
        out[name] = entry(o)
    o = lm_eval.LmEvalOptions.build({"intervention": "zero"}, "test")
    object.__setattr__(o, "temperature", (T,))
    out["lm-eval"] = C.grid(o)
    return out


def _end_to_end(tiny, tmp_path) -> None:
    from pecli.experiments import EXPERIMENTS, perplexity
    from pecli.experiments.compare import headline_rows

    # crossed by every experiment's grid, and named in every condition's columns
    for name, grid in _grids().items():
        assert {c.temperature for c in grid} == {None, T}, name
        assert all(c.columns()["temperature"] == str(c.temperature or "none") for c in grid), name
        assert {c.label for c in grid} >= {"intact", f"T={T}", f"zero + T={T}"}, name
    assert "temperature" in labels.columns()

    # applied in the one stack, and named in a table's columns and labels
    loaded = tiny("gpt2")
    pd.DataFrame({"text": ["a short text to score, twice over", "and another one here"]}
                 ).to_csv(tmp_path / "t.csv", index=False)
    o = EXPERIMENTS.get("perplexity").options.build({"dataset": str(tmp_path / "t.csv"), "intervention": "intact"}, "t")
    object.__setattr__(o, "temperature", (T,))
    before = loaded.model.get_output_embeddings().weight.detach().clone()
    table = perplexity.run(o, loaded=loaded)["perplexity"]
    assert torch.equal(loaded.model.get_output_embeddings().weight, before)  # restored
    corpus = table[table["aggregation"] == "corpus"].set_index("condition")["value"]
    assert list(corpus.index) == ["intact", f"T={T}"]
    assert np.isfinite(corpus).all() and corpus["intact"] != corpus[f"T={T}"]
    assert list(table["temperature"].unique()) == ["none", str(T)]

    # read by compare, from the columns
    read = headline_rows(table.drop(columns="condition"))
    assert list(read["condition"]) == ["intact", f"T={T}"]
    assert [labels.changed(r) for _, r in read.iterrows()] == [{}, {"temperature": f"T={T}"}]


def test_a_kind_written_in_three_places_is_crossed_applied_named_and_compared(
        monkeypatch, tiny, tmp_path):
    add_temperature(monkeypatch)
    _end_to_end(tiny, tmp_path)


@pytest.mark.parametrize("left_out", PLACES)
def test_leaving_out_one_place_fails(monkeypatch, tiny, tmp_path, left_out):
    add_temperature(monkeypatch, leave_out=left_out)
    with pytest.raises((AssertionError, AttributeError, KeyError, TypeError)):
        _end_to_end(tiny, tmp_path)
