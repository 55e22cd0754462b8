"""The JSON sidecars record the batch plan (issue 16): batch_size, batches, max_batch_tokens."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pecli.runs.batching import length_batches
from pecli.runs.io import write_table

TEXTS = ["a short one", "Good.", "The film was long, slow and in the end rather pointless.",
         "Two words", "An average movie with an average cast and an average script.", "What a ride",
         "I liked the music and the acting but the plot had holes big enough to drive through."]


ITEMS = [{"question": q, "mc1_targets": {"choices": c[:3], "labels": [1, 0, 0]},
          "mc2_targets": {"choices": c, "labels": [1] + [0] * (len(c) - 1)}}
         for q, c in [("Is the sky blue?", ["Yes.", "No.", "It is green.", "Only at night, sadly."]),
                      ("What is 2+2?", ["4", "5", "22"]),
                      ("Where is Paris?", ["In France.", "In Texas only.", "On the moon", "Nowhere"])]]


def _by_hand(lengths: list[int], size: int) -> tuple[int, int]:
    """Batches of `size` texts, longest first: (how many, largest rows x longest)."""
    desc = sorted(lengths, reverse=True)
    chunks = [desc[i:i + size] for i in range(0, len(desc), size)]
    return len(chunks), max(len(c) * c[0] for c in chunks)


def _resolved(df: pd.DataFrame, tmp_path) -> dict:
    write_table(df, tmp_path, "t", {})
    return json.loads((tmp_path / "t.json").read_text())["resolved"]


@pytest.mark.parametrize("batch_size", [None, 2])
def test_ablate_sidecar_records_the_batch_plan(tiny, tmp_path, batch_size):
    from pecli.experiments.ablate import measure, tables, tight_batches
    from pecli.runs.batching import CPU_HIDDEN_STATE_BUDGET

    loaded = tiny("bert")
    lengths = [len(x) for x in loaded.tokenizer(TEXTS)["input_ids"]]  # all under 64 positions
    m = measure(loaded, TEXTS, ["zero"], batch_size=batch_size, checkpoint_every=None)
    prov = {**loaded.provenance(), "dataset": "t", "split": "s", "rows": len(TEXTS)}
    got = _resolved(tables(m, prov, seed=0, baseline_pairs=100, bootstrap=0)["ablate"], tmp_path)
    if batch_size is None:
        plan = tight_batches(lengths, CPU_HIDDEN_STATE_BUDGET)  # the CPU budget of hidden-state loops
        want = (len(plan), max(len(b) * max(lengths[i] for i in b) for b in plan))
        assert got["batch_size"] == "token budget"
    else:
        want = _by_hand(lengths, batch_size)
        assert got["batch_size"] == batch_size
    assert (got["batches"], got["max_batch_tokens"]) == want
    assert want[0] > 1 or batch_size is None  # a real plan of several batches when sized


def test_perplexity_sidecar_records_each_computations_plan(tiny, tmp_path):
    from pecli.experiments import perplexity as exp

    loaded = tiny("gpt2")
    pd.DataFrame({"text": TEXTS}).to_csv(tmp_path / "t.csv", index=False)
    frames = exp.run(exp.PerplexityOptions.build(dict(
        dataset=str(tmp_path / "t.csv"), mask="default,linear", mask_semantics=["log-bias"],
        protocol=["relative", "study"], batch_size=3), "test"), loaded=loaded)
    df = frames["perplexity"]
    # one pass per text (BOS + its tokens) or one per scored prefix (lengths 1 .. n-1)
    windows = [len(x) + 1 for x in loaded.tokenizer(TEXTS)["input_ids"]]
    prefixes = [t for n in windows for t in range(1, n)]
    for passes, lengths in (("one-pass", windows), ("prefix-by-prefix", prefixes)):
        rows = df[df["passes"] == passes]
        assert len(rows), passes
        assert set(zip(rows["batches"], rows["max_batch_tokens"], strict=True)) == {_by_hand(lengths, 3)}
        plan = length_batches(lengths, 0, max_batch=3)
        assert rows["batches"].iloc[0] == len(plan)
    got = _resolved(df, tmp_path)
    assert got["batch_size"] == 3
    assert sorted(got["batches"]) == sorted({_by_hand(windows, 3)[0], _by_hand(prefixes, 3)[0]})


@pytest.mark.parametrize("batch_size", [None, 3])
def test_mc_sidecar_records_each_computations_plan(tiny, tmp_path, batch_size):
    from pecli.data import items as item_files
    from pecli.experiments.mc import McOptions, run
    from pecli.measures import mc_scoring as mc

    loaded = tiny("gpt2", n_positions=512)
    (tmp_path / "items.json").write_text(json.dumps(ITEMS))
    df = run(McOptions.build(dict(dataset=str(tmp_path / "items.json"), mask="linear",
                                  mask_semantics="log-bias", protocol="study",
                                  batch_size=batch_size, bootstrap=0), "test"), loaded=loaded)["mc"]
    reqs = mc.requests(loaded.tokenizer, item_files.parse_items(ITEMS, "t"))
    # shared context (every pair fits): items longest context first, grouped within 3 choice
    # rows (every item has >= 3 choices: one item a group) or the CPU's 4096 padded tokens
    # (all three items fit: one group); a group pads to rows x (longest context + choice)
    groups = [[r] for r in reqs] if batch_size else [reqs]
    sizes = [sum(len(r.continuations) for r in g) * (max(len(r.context) for r in g)
             + max(len(c) for r in g for c in r.continuations)) for g in groups]
    assert all(len(r.continuations) >= 3 for r in reqs) and sum(sizes) < 4096
    shared = df[df["passes"] == "shared-context"]
    assert set(zip(shared["batches"], shared["max_batch_tokens"], strict=True)) == {(len(groups), max(sizes))}
    # prefix by prefix: one pass per choice token over context + the choice before it
    prefixes = [len(r.context) + k for r in reqs for c in r.continuations for k in range(len(c))]
    plan = length_batches(prefixes, 4096, max_batch=batch_size)
    want = (len(plan), max(len(b) * max(prefixes[i] for i in b) for b in plan))
    if batch_size:
        assert want == _by_hand(prefixes, batch_size)
    keys = df[df["passes"] == "prefix-by-prefix"]
    assert len(keys) and set(zip(keys["batches"], keys["max_batch_tokens"], strict=True)) == {want}
    assert sorted(_resolved(df, tmp_path)["batches"]) == sorted({len(groups), want[0]})
