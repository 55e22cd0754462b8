"""The JSON sidecars record the batch plan (issue 16): batch_size, batches, max_batch_tokens."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pecli.batching import length_batches
from pecli.io import write_table

TEXTS = ["a short one", "Good.", "The film was long, slow and in the end rather pointless.",
         "Two words", "An average movie with an average cast and an average script.", "What a ride",
         "I liked the music and the acting but the plot had holes big enough to drive through."]


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

    loaded = tiny("bert")
    lengths = [len(x) for x in loaded.tokenizer(TEXTS)["input_ids"]]  # all under 64 positions
    m = measure(loaded, TEXTS, ["zero"], batch_size=batch_size, checkpoint_every=None)
    prov = {**loaded.provenance(), "dataset": "t", "split": "s", "rows": len(TEXTS)}
    got = _resolved(tables(m, prov, seed=0, baseline_pairs=100, bootstrap=0)["ablate"], tmp_path)
    if batch_size is None:
        plan = tight_batches(lengths, 4096)  # CPU's token budget
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
    frames = exp.run(loaded=loaded, dataset=str(tmp_path / "t.csv"), masks="default,linear",
                     semantics=["log-bias"], protocol=["relative", "study"], batch_size=3)
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
