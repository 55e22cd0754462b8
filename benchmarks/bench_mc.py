"""Speed of `pecli mc`'s shared context against the naive loop, on the same TruthfulQA items.

    python benchmarks/bench_mc.py --limit 20

Naive: one forward pass per (item, choice) over primer + question + answer, full logits,
as a plain harness loop does (each distinct choice of an item once, so the ratio counts
only the sharing). pecli: the primer's cache once, each batch of contexts once, all of an
item's choices as rows after it. The log-likelihoods must agree to float noise (checked:
max |difference| is printed); the ratio must be at least 3.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
from timing import best_of


def naive(loaded, reqs) -> list[np.ndarray]:
    out = []
    with torch.inference_mode():
        for req in reqs:
            lls = []
            for cont in req.continuations:
                seq = torch.tensor([(req.context + cont)[:-1]])
                logp = loaded.model(input_ids=seq).logits[0, -len(cont):].log_softmax(-1)  # [n, vocab]
                lls.append(logp[torch.arange(len(cont)), cont].sum().item())
            out.append(np.array(lls))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--data-dir", default=os.environ.get("PECLI_DATA_DIR"))
    args = parser.parse_args()

    from pecli.data import items as item_files
    from pecli.measures import mc_scoring as mc
    from pecli.models.loading import load_model

    loaded = load_model(args.model, device="cpu")
    items, _ = item_files.load_items("truthfulqa-mc", args.data_dir, args.limit, seed=0)
    reqs = mc.requests(loaded.tokenizer, items)
    choices = sum(len(r.continuations) for r in reqs)
    tokens = sum(len(r.context) + len(c) - 1 for r in reqs for c in r.continuations)
    mc.score(loaded, reqs[:1])  # warm-up (allocations, first-call dispatch)

    slow, t_naive = best_of(lambda: naive(loaded, reqs))
    (fast, how), t_fast = best_of(lambda: mc.score(loaded, reqs))

    diff = max(float(np.abs(a - b).max()) for a, b in zip(fast, slow, strict=True))
    ratio = t_naive / t_fast
    print(f"{loaded.name} on {len(items)} TruthfulQA items, {choices} distinct choices, "
          f"{tokens} naive input tokens, {torch.get_num_threads()} threads")
    print(f"naive, one forward per choice : {t_naive:8.2f} s")
    print(f"pecli mc, {how.passes}   : {t_fast:8.2f} s")
    print(f"speed-up {ratio:.2f}x; max |log-likelihood difference| {diff:.2e}")
    assert diff < 1e-3, f"the shared context disagrees with the naive loop by {diff}"
    if ratio < 3:
        print("WARNING: speed-up below 3x")


if __name__ == "__main__":
    main()
