"""Speed of pecli's perplexity paths on the same TruthfulQA rows, in one run.

    python benchmarks/bench_perplexity.py --limit 20

1. one pass per text (relative protocol) against the same numbers prefix by prefix;
2. the study protocol under `legacy`: its self-only one-pass fast path against the literal
   prefix passes;
3. the study protocol's length-bucketed prefix batches against one prefix at a time;
4. pecli's plain evaluation (length buckets, LM head on scored rows only) against an
   `evaluate`-style loop (all texts padded to the longest of the set, batches of 16, full logits).
Each pair must give the same numbers (checked); the ratios are printed.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def evaluate_style(loaded, texts: list[str], batch_size: int = 16) -> list[float]:
    """Per-text perplexities the way `evaluate`'s perplexity loop computes them."""
    tok = loaded.tokenizer
    tok.padding_side = "right"
    enc = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")  # longest of the set
    ppls = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            ids = enc["input_ids"][start:start + batch_size]
            att = enc["attention_mask"][start:start + batch_size]
            bos = torch.full((ids.shape[0], 1), tok.bos_token_id)
            ids, att = torch.cat([bos, ids], 1), torch.cat([torch.ones_like(bos), att], 1)
            logits = loaded.model(input_ids=ids, attention_mask=att).logits  # [b, t, vocab]
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:],
                                                     reduction="none")
            m = att[:, 1:]
            ppls += torch.exp((loss * m).sum(1) / m.sum(1)).tolist()
    return ppls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--data-dir", default=os.environ.get("PECLI_DATA_DIR"))
    args = parser.parse_args()

    from pecli.batching import encode
    from pecli.data import load_data
    from pecli.lm_scoring import prepare, score
    from pecli.loading import load_model
    from pecli.metrics import aggregate

    loaded = load_model(args.model, device="cpu")
    data = load_data("truthfulqa", data_dir_=args.data_dir, limit=args.limit, seed=0)
    texts = data.texts()
    ids = encode(loaded.tokenizer, texts, 10**12, add_special_tokens=False).ids
    prep = prepare(ids, loaded.max_positions, loaded.tokenizer.bos_token_id)
    lengths = [len(w.ids) for w in prep.windows]
    print(f"{args.model}, {len(texts)} TruthfulQA questions, {prep.tokens} scored tokens, "
          f"mean length {np.mean(lengths):.1f} (with start token), torch threads {torch.get_num_threads()}")

    rows = []

    def compare(label, fast_label, fast, slow_label, slow, passes):
        (a, _), ta = fast
        (b, _), tb = slow
        diff = (torch.cat(a) - torch.cat(b)).abs().max().item()
        rows.append((label, fast_label, ta, slow_label, tb, passes, diff))

    # 1. relative: one pass per text vs one pass per prefix
    compare("relative linear/log-bias", "one pass per text",
            _timed(lambda: score(loaded, prep, "linear", "log-bias", "relative")),
            "prefix by prefix (batched)",
            _timed(lambda: score(loaded, prep, "linear", "log-bias", "relative", fast=False)),
            f"{len(prep.windows)} vs {prep.prefixes} sequences")
    # 2. study + legacy: the self-only identity vs the literal protocol
    compare("study linear/legacy", "self-only one pass",
            _timed(lambda: score(loaded, prep, "linear", "legacy", "study")),
            "prefix passes (batched)",
            _timed(lambda: score(loaded, prep, "linear", "legacy", "study", fast=False)),
            f"{len(prep.windows)} vs {prep.prefixes} sequences")
    # 3. study batching
    compare("study linear/log-bias", "prefixes length-bucketed",
            _timed(lambda: score(loaded, prep, "linear", "log-bias", "study")),
            "one prefix at a time",
            _timed(lambda: score(loaded, prep, "linear", "log-bias", "study", batch_size=1)),
            f"{prep.prefixes} sequences either way")
    # 4. pecli vs evaluate's loop (mean_per_text compared)
    (nlls, _), t_pecli = _timed(lambda: score(loaded, prep))
    ppls, t_eval = _timed(lambda: evaluate_style(loaded, texts))
    ours = aggregate(nlls)["mean_per_text"]
    rows.append(("plain model", "pecli (buckets, head on scored rows)", t_pecli,
                 "evaluate-style (pad to longest, b=16)", t_eval, f"{len(texts)} texts",
                 abs(ours - float(np.mean(ppls))) / float(np.mean(ppls))))

    print(f"{'what':26} {'fast path':38} {'s':>7} {'reference':38} {'s':>7} {'speed-up':>8}  passes; max diff")
    for label, fl, ta, sl, tb, passes, diff in rows:
        print(f"{label:26} {fl:38} {ta:7.2f} {sl:38} {tb:7.2f} {tb / ta:7.1f}x  {passes}; {diff:.1e}")
    print("max diff: largest |NLL difference| (last row: relative difference of mean_per_text)")


if __name__ == "__main__":
    main()
