"""The condition as one value (pecli.positions.conditions): one grid rule, one label, one
applicability check before and after loading, one context stack; `intact` for the
unmodified model, `learned` still read (with a warning) and old tables upgraded."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch

from pecli.experiments.options.length import LengthOptions
from pecli.experiments.options.mc import McOptions
from pecli.experiments.options.passkey import PasskeyOptions
from pecli.experiments.options.perplexity import PerplexityOptions
from pecli.positions import conditions as C
from pecli.positions import labels
from pecli.positions.interventions import intervene
from pecli.positions.rope_scaling import Rope
from pecli.positions.rotary import rope_scaled
from pecli.runs import names
from pecli.runs.errors import InterventionError, ModelError


def test_every_field_of_a_condition_has_its_kind_and_its_label_part():
    from pecli.positions.labels import PARTS

    covered = [f for kind in C.KINDS for f in kind.fields]
    assert sorted(covered) == sorted(C.condition_fields())
    assert len({k.order for k in C.KINDS}) == len(C.KINDS)  # one place in the stack each
    assert [k.name for k in C.KINDS] == list(PARTS)
    intact = C.plan()  # each kind writes its declared columns (the rope's provenance beside)
    assert all(list(k.columns(intact, None)) == list(PARTS[k.name].columns) for k in C.KINDS)
    assert list(intact.columns()) == ["condition", *labels.columns()]


@pytest.mark.parametrize("row, expected", [
    ({"intervention": "intact", "mask": "default"}, "intact"),
    ({"intervention": "learned"}, "intact"),  # written before 0.2
    ({"intervention": "zero", "mask": "default", "mask_semantics": "log-bias"}, "zero"),
    ({"intervention": "zero", "mask": "linear", "mask_semantics": "log-bias",
      "protocol": "relative"}, "zero + linear/log-bias"),
    ({"intervention": "intact", "mask": "linear", "mask_semantics": "legacy",
      "protocol": "study"}, "linear/legacy (study)"),
    ({"intervention": "intact", "rope_scaling": "yarn:2"}, "yarn:2"),
    ({"intervention": "shift:3", "rope_scaling": "none"}, "shift:3"),
    ({"intervention": "zero", "mask": "linear", "mask_semantics": "log-bias",
      "rope_scaling": "linear:2"}, "zero + linear/log-bias + linear:2"),
    ({"intervention": float("nan"), "rope_scaling": float("nan")}, "intact"),
])
def test_one_label_from_the_columns(row, expected):
    assert C.label(row) == expected


@pytest.mark.parametrize("short, full, other", [
    ("string:2731", "string:2731:2859", "string:2731:3000"),  # W = S + 128 left out
    ("dca:6144", "dca:6144:512", "dca:6144:256"),  # L = C / 12 left out
    ("selfextend:4:1024@full_attention", "selfextend:4:1024@full_attention", "selfextend:4:1024"),
])
def test_one_computation_spelled_two_ways_is_scored_once(short, full, other):
    """Experiments score identical computations once (keyed by `computes`): a remedy with its
    defaults left out is the same computation as spelled in full, one with another value or
    another layer set is not; each keeps its own label."""
    a, b, c = (C.plan(intervention=x) for x in (short, full, other))
    assert a.computes == b.computes and a.computes != c.computes
    assert (a.label, b.label) == (short, full)


def test_a_condition_labels_itself_as_its_row_does():
    c = C.plan("linear", "log-bias", "study", "zero", rope=Rope.parse("yarn:2"))
    cols = c.columns()
    assert cols["condition"] == c.label == C.label(cols) == "zero + linear/log-bias (study) + yarn:2"
    assert {k: cols[k] for k in c.names} == c.names and cols["rope_scaling"] == "yarn:2"


def test_learned_still_works_with_a_warning():
    with pytest.warns(FutureWarning, match="'learned' is deprecated; use 'intact'"):
        choice = names.parse(names.INTERVENTIONS, "learned")
    assert choice.name == "intact"
    with pytest.warns(FutureWarning):
        o = McOptions.build({"intervention": "learned,zero"}, "t")
    assert [str(c) for c in o.intervention] == ["intact", "zero"]


def _grid(options) -> list[tuple]:
    return [(str(c.intervention), str(c.mask), str(c.mask_semantics), str(c.protocol),
             str(c.rope or "none")) for c in C.grid(options)]


def test_one_grid_rule_intact_first_then_the_crossing():
    o = LengthOptions.build({"intervention": "zero", "mask": "default,linear",
                             "mask_semantics": "legacy,log-bias", "rope_scaling": "yarn:2"}, "t")
    assert _grid(o) == [
        ("intact", "default", "legacy", "relative", "none"),
        ("intact", "default", "legacy", "relative", "yarn:2"),
        ("zero", "default", "legacy", "relative", "none"),  # the default mask once
        ("zero", "default", "legacy", "relative", "yarn:2"),
        ("zero", "linear", "legacy", "relative", "none"),
        ("zero", "linear", "legacy", "relative", "yarn:2"),
        ("zero", "linear", "log-bias", "relative", "none"),
        ("zero", "linear", "log-bias", "relative", "yarn:2"),
    ]
    # perplexity names the default mask under every semantics asked (its tables always have)
    p = PerplexityOptions.build({"intervention": "intact", "mask_semantics": "legacy,log-bias"}, "t")
    assert [g[2] for g in _grid_of(p)] == ["legacy", "log-bias"]
    # passkey has no masks: interventions x rope scalings
    k = PasskeyOptions.build({"intervention": "zero", "rope_scaling": "linear:2"}, "t")
    assert [(g[0], g[4]) for g in _grid(k)] == [("intact", "none"), ("intact", "linear:2"),
                                                ("zero", "none"), ("zero", "linear:2")]
    # rope_scaling_on intact: the scalings as baselines, on the intact model only
    k = PasskeyOptions.build({"intervention": "zero,rerope:64", "rope_scaling": "linear:2,yarn:2",
                              "rope_scaling_on": "intact"}, "t")
    assert [(g[0], g[4]) for g in _grid(k)] == [("intact", "none"), ("intact", "linear:2"),
                                                ("intact", "yarn:2"), ("zero", "none"),
                                                ("rerope:64", "none")]


def _grid_of(p):
    return [(str(c.intervention), str(c.mask), str(c.mask_semantics)) for c in
            C.grid(p, default_once=False)]


def test_the_rope_item_is_parsed_once():
    o = LengthOptions.build({"rope_scaling": 'yarn:2,{"rope_type": "linear", "factor": 4}'}, "t")
    assert all(isinstance(r, Rope) for r in o.rope_scaling)
    assert [(r.type, r.parameters) for r in o.rope_scaling] == [
        ("yarn", {"rope_type": "yarn", "factor": 2.0}), ("linear", {"rope_type": "linear", "factor": 4})]
    assert o.as_dict()["rope_scaling"] == ["yarn:2", '{"rope_type": "linear", "factor": 4}']  # as typed
    assert o.replace(seed=1).rope_scaling == o.rope_scaling  # checked again, not re-parsed


@pytest.mark.parametrize("model, condition, error, message", [
    ("random:gpt2", C.plan(rope=Rope.parse("yarn:2")), ModelError, "--rope-scaling applies to rotary"),
    ("random:gptj", C.plan(rope=Rope.parse("yarn:2")), ModelError, "fixed sin/cos tables"),
    ("random:bloom", C.plan("linear", "log-bias"), ModelError, "masks do not apply"),
    ("random:llama", C.plan(intervention="sinusoidal"), InterventionError, "does not apply"),
    ("random:bert", C.plan(), ModelError, "encoder without a language-model head"),
])
def test_one_check_before_loading(model, condition, error, message):
    with pytest.raises(error, match=message):
        condition.check(model, causal=True)


def test_the_same_check_after_loading_decides_lengths(tiny):
    gpt2 = tiny("gpt2")  # 64 learned positions
    intact, shuffle = C.plan(), C.plan(intervention="shuffle")
    C.check_all([intact, shuffle], gpt2, causal=True)
    assert intact.reason(gpt2, 64) is None
    assert intact.reason(gpt2, 65) == "not applicable: 64 learned positions"
    llama = tiny("llama")
    assert shuffle.reason(llama, 64) is None
    assert shuffle.reason(llama, 65, "the prompt") == (
        "not applicable: shuffle permutes the model's 64 positions, fewer than the prompt")
    with pytest.raises(C.NotApplicable):
        shuffle.check(llama, 65)
    with pytest.raises(ModelError, match="rotary"):
        C.plan(rope=Rope.parse("linear:2")).check(gpt2)


def test_a_rope_scaling_is_validated_once_after_loading(tiny, monkeypatch):
    """transformers' validation runs in the check after loading; columns and the applied
    block read what it resolved (issue 45: checked once before loading and once after)."""
    from pecli.positions import rotary as rope_scaling

    calls = []
    real = rope_scaling.resolve
    monkeypatch.setattr(rope_scaling, "resolve", lambda *a: calls.append(a) or real(*a))
    loaded = tiny("llama")
    c = C.plan(rope=Rope.parse("yarn:2"))
    C.check_all([c], loaded, causal=True)
    assert len(calls) == 1
    with c.applied(loaded):
        scaled = c.columns(loaded)["rope_parameters"]
    assert len(calls) == 1 and json.loads(scaled)["factor"] == 2.0
    assert json.loads(c.columns(loaded)["rope_parameters"]) == json.loads(scaled)
    with pytest.raises(ModelError, match="rotary"):  # the band pass check is the same function
        C.plan(rope=Rope.parse("linear:2")).check(tiny("gpt2"), band=True)
    assert C.plan(intervention="zero").reason(loaded, 32, band=True).startswith(
        "not applicable: the band pass runs the model's own positions")
    assert C.plan().reason(loaded, 32, band=True) is None


def _out(loaded, ids):
    with torch.no_grad():
        return loaded.model(input_ids=ids).logits


def test_applied_is_the_documented_stack_and_restores(tiny):
    loaded = tiny("llama")
    ids = torch.tensor([[5, 9, 2, 7, 1, 3, 8, 4]])
    before = _out(loaded, ids)
    state = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    rope = Rope.parse("linear:2")
    c = C.plan("linear", "log-bias", "relative", "reverse", rope=rope)
    with c.applied(loaded, seed=0):
        got = _out(loaded, ids)
    # by hand, in the order the module documents: rope scaling, intervention, attention
    from pecli.positions.masks import masked_attention

    with rope_scaled(loaded.model, rope.parameters), intervene(loaded, "reverse"), \
            masked_attention(loaded.model, "linear", "log-bias"):
        expected = _out(loaded, ids)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert not torch.equal(got, before)
    torch.testing.assert_close(_out(loaded, ids), before, rtol=0, atol=0)
    assert all(torch.equal(v, state[k]) for k, v in loaded.model.state_dict().items())
    assert loaded.model.config._attn_implementation != "pecli_linear_log-bias_relative"


def test_an_old_table_is_upgraded_and_a_new_one_left_alone():
    old = pd.DataFrame({"intervention": ["learned", "zero"], "probe_trained_on": ["learned", "learned"],
                        "mask": ["default", "linear"], "mask_semantics": ["legacy", "log-bias"],
                        "value": ["1.5", "2.25"]})
    new = C.upgraded(old)
    assert list(new.columns) == ["condition", *old.columns]
    assert new["condition"].tolist() == ["intact", "zero + linear/log-bias"]
    assert new["intervention"].tolist() == ["intact", "zero"]
    assert new["probe_trained_on"].tolist() == ["intact", "intact"]
    assert new["value"].tolist() == old["value"].tolist()
    assert C.upgraded(new).equals(new)
    other = pd.DataFrame({"pe": ["learned"], "value": [1.0]})  # a trained scheme: not a condition
    assert C.upgraded(other).equals(other)


def test_migrate_rewrites_only_the_names_and_records_it(tmp_path):
    from pecli.experiments.migrate import migrate
    from pecli.runs.io import write_table
    from pecli.runs.provenance import read_sha256

    old = pd.DataFrame({"intervention": ["learned", "zero"], "value": [0.1 + 0.2, 1e-17],
                        "tokens": [3, None]})
    csv = write_table(old, tmp_path, "t", {"command": "x"})
    lines = csv.read_text().splitlines()
    assert migrate(tmp_path) == [csv] and migrate(tmp_path) == []
    now = csv.read_text().splitlines()
    assert now[0] == "condition," + lines[0]
    assert now[1:] == ["intact," + lines[1].replace("learned", "intact"), "zero," + lines[2]]
    meta = json.loads((tmp_path / "t.json").read_text())
    assert meta["table_sha256"] == read_sha256(csv) != meta["migrated"]["table_sha256_before"]


def test_migrate_renames_tunes_windowing_column_and_nothing_else(tmp_path):
    """tune wrote its windowing as `windows`, every other table's count of windows."""
    from pecli.experiments.migrate import migrate
    from pecli.runs.io import write_table

    old = pd.DataFrame({"condition": ["intact", "selfextend:4:2048"], "value": [82.5796, 38.1111],
                        "windows": ["nonoverlapping"] * 2, "units": [10, 10]})
    csv = write_table(old, tmp_path, "tune_report", {"command": "x"})
    counted = write_table(old.assign(windows=[3, 3]), tmp_path, "tune_curve", {"command": "x"})
    before, kept = csv.read_text().splitlines(), counted.read_text()
    assert migrate(tmp_path) == [csv] and migrate(tmp_path) == []
    now = csv.read_text().splitlines()
    assert now[0] == before[0].replace(",windows,", ",window_protocol,") and now[1:] == before[1:]
    assert counted.read_text() == kept  # a count stays `windows`
    assert "window_protocol" in json.loads((tmp_path / "tune_report.json").read_text())["renamed"]["note"]


def test_a_preset_key_still_matches_results_saved_as_learned(tmp_path):
    from pecli.experiments.reproduce import load_preset

    def entry(intervention):
        path = tmp_path / f"{intervention}.yaml"
        path.write_text("experiments:\n  - {id: a, experiment: mc, options: {model: random:gpt2, "
                        f"intervention: [{intervention}, zero]}}}}\n")
        with pytest.warns() if intervention == "learned" else _nothing():
            return load_preset(str(path)).entries[0]

    old, new = entry("learned"), entry("intact")
    assert old.key(1) != new.key(1)
    assert old.key(1) in new.keys(1)  # a section saved before the renaming is done already


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_condition_is_frozen_and_hashable():
    c = C.plan(rope=Rope.parse("yarn:2"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.mask = None
    assert len({c, C.plan(rope=Rope.parse("yarn:2"))}) == 1


def test_outside_positions_every_condition_is_applied_through_condition_applied():
    """No module outside pecli/positions calls intervene, prepare or masked_attention itself:
    a scoring loop and a training loop alike enter `Condition.applied` (or its `applier`)."""
    import re
    from pathlib import Path

    import pecli

    root = Path(pecli.__file__).parent
    call = re.compile(r"\b(intervene|prepare|masked_attention)\(")
    found = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py") if "positions" not in p.parts
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if call.search(line.split("#")[0]) and not line.lstrip().startswith("def ")]
    assert found == []
