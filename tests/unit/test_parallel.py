"""pecli.parallel's sharding and reassembly (processes simulated), and the OOM fallback."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from conftest import make_tiny

from pecli import parallel


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


def test_gather_batches_restores_one_process_order(monkeypatch):
    """Two processes' concatenated pieces come back exactly as one process concatenates them."""
    sizes = [3, 1, 2, 4]  # tokens of batches 0..3
    pieces = [np.arange(n) + 10 * b for b, n in enumerate(sizes)]  # batch b's tokens
    cos = [np.vstack([p, -p]) for p in pieces]  # [l=2, n_b]
    shards = {0: [0, 3], 1: [1, 2]}
    per_rank = {r: (mine, {"tok": np.concatenate([pieces[b] for b in mine]),
                           "cos": np.concatenate([cos[b] for b in mine], axis=1)})
                for r, mine in shards.items()}
    monkeypatch.setattr(parallel, "gather", lambda local: per_rank)  # what all_gather returns
    out = parallel.gather_batches(shards[0], per_rank[0][1],
                                  {"tok": (sizes, 0), "cos": (sizes, 1)})
    np.testing.assert_array_equal(out["tok"], np.concatenate(pieces))
    np.testing.assert_array_equal(out["cos"], np.concatenate(cos, axis=1))


def test_not_launched_is_one_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert (parallel.world_size(), parallel.rank(), parallel.is_main()) == (1, 0, True)
    assert parallel.gather({2: "b", 0: "a"}) == {0: "a", 2: "b"}
    assert parallel.from_main([1]) == [1]
    assert parallel.shard([[0], [1]], [3, 4]) == [0, 1]


def test_cuda_oom_halves_the_batch_and_tables_match(tmp_path, monkeypatch):
    """A model that runs out of memory on batches of more than 2 sequences: the run splits
    them, finishes, says so in `oom_splits`, and its numbers equal an unhindered run's."""
    from pecli.experiments.perplexity import run

    texts = ["a film about a dog", "the ending was far too long for me", "fine", "I laughed",
             "a quiet story of two sisters in a small town", "no", "the score is lovely"]
    data = tmp_path / "texts.csv"
    pd.DataFrame({"text": texts}).to_csv(data, index=False)
    loaded = make_tiny("gpt2")
    kwargs = dict(dataset=str(data), masks="default,linear", semantics="log-bias",
                  protocol="relative,study", loaded=loaded, bootstrap=0)
    monkeypatch.setattr("pecli.provenance.RUN_NOTES", {})
    plain = run(**kwargs)

    sizes = []

    def tight_memory(module, args, kwargs):
        sizes.append(kwargs["input_ids"].shape[0])
        if kwargs["input_ids"].shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    handle = loaded.model.base_model.register_forward_pre_hook(tight_memory, with_kwargs=True)
    try:
        split = run(**kwargs)
    finally:
        handle.remove()
    assert max(sizes) > 2 and any(s <= 2 for s in sizes)  # it did hit the limit, then fit
    import pecli.provenance

    splits = pecli.provenance.RUN_NOTES["oom_splits"]
    assert splits > 0 and "oom_splits" not in plain["perplexity"]
    for name in ("perplexity", "texts"):
        a, b = plain[name], split[name]
        assert (b["oom_splits"] == splits).all()
        pd.testing.assert_frame_equal(a, b.drop(columns="oom_splits"), check_exact=False, rtol=1e-5)
