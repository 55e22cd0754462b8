"""Speed of pecli's perplexity paths on the same TruthfulQA rows, in one run.

    python benchmarks/bench_perplexity.py            # rows 1-3 on 20 questions, row 4 on all 817
    python benchmarks/bench_perplexity.py --quick    # 8 and 64 questions: a smoke test

1. one pass per text (relative protocol) against the same numbers prefix by prefix, with the
   bound by FLOPs near which such a speed-up lands (about L/2 for L tokens), and
   (1b) the same on a few IMDB reviews cut to 64 tokens, where the bound is higher;
2. the study protocol under `legacy`: its self-only one-pass fast path against the literal
   prefix passes;
3. the study protocol's length-bucketed prefix batches against one prefix at a time;
4. pecli's plain evaluation (length buckets, LM head on scored rows only) against an
   `evaluate`-style loop (all texts padded to the longest of the set, batches of 16, full
   logits), on all 817 questions by default: padding to the longest shows its cost only at
   the real set size.
Each pair must give the same numbers (checked: max difference printed); the ratios are
printed. Every pair is timed in this run, the reference first, after one warm-up pass that
pages the weights in; rows 1-3 take the best of --reps runs.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
from timing import best_of, load_average


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


def flop_bound(loaded, prep) -> float:
    """How many times more matrix-product work the prefix passes do than one pass per text,
    by the linear layers' FLOPs: the blocks' weights once per input token (every prefix is
    a fresh sequence), the LM head once per scored row (the same rows either way).
    Attention's t^2 terms and the per-pass overheads are left out (both favour one pass a
    little), so a measured speed-up lands near this figure, not far above it."""
    from pecli.models.architectures import resolve

    blocks = resolve(loaded.model, loaded.spec, loaded.spec.layers)
    body = sum(p.numel() for p in blocks.parameters() if p.dim() == 2)
    head = loaded.model.get_output_embeddings().weight.numel()
    one_pass = sum(len(w.ids) for w in prep.windows)
    prefix = sum(t for w in prep.windows for t in range(w.first, len(w.ids)))
    return (body * prefix + head * prep.tokens) / (body * one_pass + head * prep.tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--limit", type=int, default=20, help="questions of rows 1-3")
    parser.add_argument("--eval-limit", type=int, default=817,
                        help="questions of row 4 (pecli vs the evaluate-style loop); 817 = all")
    parser.add_argument("--reviews", type=int, default=4,
                        help="IMDB reviews cut to --review-tokens for row 1b (0: no row 1b)")
    parser.add_argument("--review-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="8 and 64 questions")
    parser.add_argument("--reps", type=int, default=2, help="best of N runs (rows 1-3)")
    parser.add_argument("--data-dir", default=os.environ.get("PECLI_DATA_DIR"))
    args = parser.parse_args()
    if args.quick:
        args.limit, args.eval_limit = 8, 64

    from pecli.data.datasets import load_data
    from pecli.measures.lm_scoring import score, windows_for
    from pecli.measures.metrics import aggregate
    from pecli.models.loading import load_model
    from pecli.runs.batching import encode

    loaded = load_model(args.model, device="cpu")

    def prepared(limit: int, dataset: str = "truthfulqa", tokens: int | None = None):
        data = load_data(dataset, "test" if dataset == "imdb" else None, data_dir_=args.data_dir,
                         limit=limit, seed=0, at_most=True)
        texts = data.texts()
        ids = encode(loaded.tokenizer, texts, 10**12, add_special_tokens=False).ids
        return texts, windows_for(ids, tokens or loaded.max_positions, loaded.tokenizer.bos_token_id)

    texts, prep = prepared(args.limit)
    lengths = [len(w.ids) for w in prep.windows]
    print(f"{args.model}, {len(texts)} TruthfulQA questions, {prep.tokens} scored tokens, "
          f"mean length {np.mean(lengths):.1f} (with start token), torch threads "
          f"{torch.get_num_threads()}, load average "
          f"{load_average()}", flush=True)
    score(loaded, prep)  # warm up: page the weights in
    score(loaded, prep, "linear", "log-bias", "relative")

    print(f"{'what':26} {'fast path':38} {'s':>7} {'reference':38} {'s':>7} {'speed-up':>8}  "
          "passes; max diff; load", flush=True)

    def row(label, fast_label, ta, slow_label, tb, passes, diff):
        print(f"{label:26} {fast_label:38} {ta:7.2f} {slow_label:38} {tb:7.2f} {tb / ta:7.1f}x  "
              f"{passes}; {diff:.1e}; {os.getloadavg()[0]:.2f}", flush=True)

    def compare(label, fast_label, fast, slow_label, slow, passes):
        (b, _), tb = best_of(slow, args.reps)  # the reference first
        (a, _), ta = best_of(fast, args.reps)
        row(label, fast_label, ta, slow_label, tb, passes,
            (torch.cat(a) - torch.cat(b)).abs().max().item())

    # 1. relative: one pass per text vs one pass per prefix
    compare("relative linear/log-bias", "one pass per text",
            lambda: score(loaded, prep, "linear", "log-bias", "relative"),
            "prefix by prefix (batched)",
            lambda: score(loaded, prep, "linear", "log-bias", "relative", fast=False),
            f"{len(prep.windows)} vs {prep.prefixes} sequences")
    print(f"{'':26} the bound by FLOPs (linear layers, flop_bound): {flop_bound(loaded, prep):.1f}x; "
          "it grows with text length, about L/2 for L tokens", flush=True)
    if args.reviews:  # 1b. the same on longer texts, where the bound is higher
        _, long = prepared(args.reviews, "imdb", args.review_tokens)
        compare(f"  1b. {args.reviews} reviews, {args.review_tokens} tok", "one pass per text",
                lambda: score(loaded, long, "linear", "log-bias", "relative"),
                "prefix by prefix (batched)",
                lambda: score(loaded, long, "linear", "log-bias", "relative", fast=False),
                f"{len(long.windows)} vs {long.prefixes} sequences")
        print(f"{'':26} the bound by FLOPs: {flop_bound(loaded, long):.1f}x", flush=True)
    # 2. study + legacy: the self-only identity vs the literal protocol
    compare("study linear/legacy", "self-only one pass",
            lambda: score(loaded, prep, "linear", "legacy", "study"),
            "prefix passes (batched)",
            lambda: score(loaded, prep, "linear", "legacy", "study", fast=False),
            f"{len(prep.windows)} vs {prep.prefixes} sequences")
    # 3. study batching
    compare("study linear/log-bias", "prefixes length-bucketed",
            lambda: score(loaded, prep, "linear", "log-bias", "study"),
            "one prefix at a time",
            lambda: score(loaded, prep, "linear", "log-bias", "study", batch_size=1),
            f"{prep.prefixes} sequences either way")
    # 4. pecli vs evaluate's loop (mean_per_text compared), on --eval-limit questions
    texts, prep = prepared(args.eval_limit)
    ppls, t_eval = best_of(lambda: evaluate_style(loaded, texts))
    (nlls, _), t_pecli = best_of(lambda: score(loaded, prep))
    ours = aggregate(nlls)["mean_per_text"]
    row("plain model", "pecli (buckets, head on scored rows)", t_pecli,
        "evaluate-style (pad to longest, b=16)", t_eval, f"{len(texts)} texts",
        abs(ours - float(np.mean(ppls))) / float(np.mean(ppls)))
    print("max diff: largest |NLL difference| (last row: relative difference of mean_per_text); "
          f"load: 1-minute load average after the row; now {load_average()}")


if __name__ == "__main__":
    main()
