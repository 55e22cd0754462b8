"""pecli.runs.parallel's sharding and reassembly (processes simulated), and the OOM fallback."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from conftest import make_tiny

from pecli.runs import parallel


def test_balance_is_deterministic_complete_and_even():
    costs = [50, 10, 40, 30, 30, 20, 5, 5, 60]
    shards = parallel.balance(costs, 3)
    assert shards == parallel.balance(costs, 3)
    assert sorted(i for s in shards for i in s) == list(range(len(costs)))
    loads = [sum(costs[i] for i in s) for s in shards]
    assert max(loads) - min(loads) <= max(costs) and sum(loads) == sum(costs)
    assert all(s == sorted(s) for s in shards)
    assert parallel.balance([7], 2) == [[0], []]  # more processes than batches


def test_shard_balances_padded_tokens_not_texts(monkeypatch):
    # one batch of 1 long text costs as much as 8 short ones: by tokens, 1 vs 1 batch
    lengths = [400] + [50] * 8
    batches = [[0], list(range(1, 9)), [1]]
    monkeypatch.setattr(parallel, "world_size", lambda: 2)
    monkeypatch.setattr(parallel, "rank", lambda: 1)
    assert parallel.shard(batches, lengths) == [1]  # 400 + 50 vs 400 padded tokens
    assert parallel.shard(batches[:2], lengths) == [1]


def test_not_launched_is_one_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert (parallel.world_size(), parallel.rank(), parallel.is_main()) == (1, 0, True)
    assert parallel.gather({2: "b", 0: "a"}) == {0: "a", 2: "b"}
    assert parallel.from_main([1]) == [1]
    assert parallel.shard([[0], [1]], [3, 4]) == [0, 1]
    assert parallel.shards([[0], [1]], [3, 4]) == [[0, 1]]


def _tight_memory(model, most: int, sizes: list[int]):
    """A hook that raises the CUDA out-of-memory error on batches of more than `most` rows."""
    def forward(module, args, kwargs):
        sizes.append(kwargs["input_ids"].shape[0])
        if kwargs["input_ids"].shape[0] > most:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    return model.register_forward_pre_hook(forward, with_kwargs=True)


def test_ablate_halves_a_batch_out_of_memory_to_the_same_tables(monkeypatch, capsys):
    """ablate on a model that runs out of memory above 2 sequences: batches of 5 are split
    (5 -> 2 + 3 -> 2 + 1 + 2) and every table equals the unhindered run's: the same rows,
    tokens and order exactly, the numbers to float noise (a matrix product of fewer rows may
    round differently; measured 1.2e-7); the splits are logged and counted in `oom_splits`."""
    import pecli.runs.provenance
    from pecli.experiments.ablate import measure, tables

    texts = ["a film about a dog", "the ending was far too long for me and my friends", "fine",
             "I laughed", "a quiet story of two sisters in a small town", "no", "lovely score",
             "the acting, the music and the light were all wonderful", "dull", "it was ok"]
    loaded = make_tiny("bert")
    kwargs = dict(batch_size=5, pooled=True, checkpoint_every=None)
    monkeypatch.setattr(pecli.runs.provenance, "RUN_NOTES", {})
    plain = measure(loaded, texts, ["zero", "shuffle"], **kwargs)
    prov = {**loaded.provenance(), "dataset": "t", "split": "s", "rows": len(texts)}
    plain_tables = tables(plain, prov, seed=0, baseline_pairs=50, bootstrap=20)
    sizes: list[int] = []
    handle = _tight_memory(loaded.model.base_model, 2, sizes)
    try:
        split = measure(loaded, texts, ["zero", "shuffle"], **kwargs)
    finally:
        handle.remove()
    assert max(sizes) == 5 and set(sizes) >= {1, 2}  # it hit the limit, then fit
    assert pecli.runs.provenance.RUN_NOTES["oom_splits"] == 4  # two batches, each split twice
    assert capsys.readouterr().err.count("out of device memory on a batch of") == 4
    for name in ("text", "position", "special"):
        np.testing.assert_array_equal(getattr(split, name), getattr(plain, name))
    for name in plain.cosine:
        np.testing.assert_allclose(split.cosine[name], plain.cosine[name], rtol=1e-6)
    for name in plain.pooled:
        np.testing.assert_allclose(split.pooled[name], plain.pooled[name], rtol=1e-5, atol=1e-7)
    split_tables = tables(split, prov, seed=0, baseline_pairs=50, bootstrap=20)
    for name, table in plain_tables.items():
        assert (split_tables[name]["oom_splits"] == 4).all() and "oom_splits" not in table
        pd.testing.assert_frame_equal(split_tables[name].drop(columns="oom_splits"), table,
                                      check_exact=False, rtol=1e-5, obj=name)


def test_perplexity_halves_a_batch_out_of_memory_and_tables_match(tmp_path, monkeypatch):
    """A model that runs out of memory on batches of more than 2 sequences: the run splits
    them, finishes, says so in `oom_splits`, and its numbers equal an unhindered run's."""
    from pecli.experiments.perplexity import PerplexityOptions, run

    texts = ["a film about a dog", "the ending was far too long for me", "fine", "I laughed",
             "a quiet story of two sisters in a small town", "no", "the score is lovely"]
    data = tmp_path / "texts.csv"
    pd.DataFrame({"text": texts}).to_csv(data, index=False)
    loaded = make_tiny("gpt2")
    kwargs = dict(options=PerplexityOptions.build(dict(
        dataset=str(data), mask="default,linear", mask_semantics="log-bias",
        protocol="relative,study", bootstrap=0), "test"), loaded=loaded)
    monkeypatch.setattr("pecli.runs.provenance.RUN_NOTES", {})
    plain = run(**kwargs)

    sizes: list[int] = []
    handle = _tight_memory(loaded.model.base_model, 2, sizes)
    try:
        split = run(**kwargs)
    finally:
        handle.remove()
    assert max(sizes) > 2 and any(s <= 2 for s in sizes)  # it did hit the limit, then fit
    import pecli.runs.provenance

    splits = pecli.runs.provenance.RUN_NOTES["oom_splits"]
    assert splits > 0 and "oom_splits" not in plain["perplexity"]
    for name in ("perplexity", "texts"):
        a, b = plain[name], split[name]
        assert (b["oom_splits"] == splits).all()
        pd.testing.assert_frame_equal(a, b.drop(columns="oom_splits"), check_exact=False, rtol=1e-5)
