"""How fast is pecli's ablate loop? Tokens/s against common loops, GFLOP/s against a matmul.

On the same texts, in one run, each loop computes the same thing: hidden states at every
layer with the model's own positions and with `zero`, and the per-token cosine.

- pecli: `pecli.experiments.ablate.measure` (one tokenisation, length-bucketed batches
  under a token budget, inference_mode);
- naive16: batches of 16 in dataset order, each tokenised and padded to its longest;
- single: one text at a time (no padding);
- fwd-only: pecli's batches and the two forward passes, nothing else (the loop's floor);
- pecli@4096: pecli with the CPU token budget it had before (4096 padded tokens, not 512);
- ceiling: a plain float32 matmul (2048 x 2048) sustained for 1.5 s before and after every
  timed run of every loop.

The baselines run first, pecli last; the cosines of naive16 and single must agree with
pecli's to float noise (max |difference| printed). Each loop's time is the best of --reps;
its share of the ceiling is the median over its runs of (the run's GFLOP/s / the mean of
the two ceilings measured around it): the machine's speed drifts by 10-30 % within a run
when its cores are shared, and a ratio to a ceiling measured seconds away follows it.

GFLOP/s counts the useful work only: 2 x (weights of the blocks' linear layers) per real
token plus attention's 4 x t^2 x d per layer and sequence (QK^T and AV), for both passes.

    python benchmarks/bench_ablate.py --model minilm --texts 64 --questions 512 --reps 3 --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from timing import load_average

from pecli.data.datasets import load_data
from pecli.experiments.ablate import measure
from pecli.measures.metrics import cosine_by_layer
from pecli.models.architectures import resolve
from pecli.models.loading import load_model
from pecli.positions.interventions import prepare
from pecli.runs import batching
from pecli.runs.batching import (
    CPU_HIDDEN_STATE_BUDGET,
    default_token_budget,
    encode,
    pad,
    tight_batches,
)


def useful_flops(loaded, lengths: list[int], passes: int) -> float:
    """Forward FLOPs on real tokens: linear layers of every block + attention scores/values."""
    blocks = resolve(loaded.model, loaded.spec, loaded.spec.layers)
    linear = sum(p.numel() for p in blocks.parameters() if p.dim() == 2)  # all blocks
    width = loaded.model.config.hidden_size
    attn = len(blocks) * sum(4 * t * t * width for t in lengths)
    return passes * (2 * linear * sum(lengths) + attn)


def matmul_gflops(n: int = 2048, seconds: float = 1.5) -> float:
    """Sustained float32 matmul GFLOP/s over `seconds` (not a lucky best: the machine is shared)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm up
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        done += 1
    return 2 * n**3 * done / (time.perf_counter() - start) / 1e9


def forward_only(loaded, texts: list[str]) -> None:
    """pecli's batches, the two forward passes and nothing else: the loop's floor."""
    enc = encode(loaded.tokenizer, texts, loaded.max_positions)
    base = loaded.model.base_model
    zero = prepare(loaded, "zero")
    with torch.inference_mode():
        for batch in tight_batches([len(x) for x in enc.ids],
                                   default_token_budget(loaded.device, CPU_HIDDEN_STATE_BUDGET)):
            ids, mask = pad([enc.ids[i] for i in batch], loaded.tokenizer.pad_token_id,
                            loaded.device)
            base(input_ids=ids, attention_mask=mask)
            with zero():
                base(input_ids=ids, attention_mask=mask)


def naive_loop(loaded, texts: list[str], batch: int) -> np.ndarray:
    """The common loop: dataset order, tokenise each batch, pad to its longest, two passes.
    Cosines [l, n] of every token, in text order."""
    base = loaded.model.base_model
    zero = prepare(loaded, "zero")
    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch):
            enc = loaded.tokenizer(texts[i:i + batch], padding=True, truncation=True,
                                   max_length=loaded.max_positions, return_tensors="pt")
            ref = base(**enc, output_hidden_states=True).hidden_states  # l x [b, t, d]
            with zero():
                h = base(**enc, output_hidden_states=True).hidden_states
            out.append(cosine_by_layer(ref, h, enc["attention_mask"]).numpy())
    return np.concatenate(out, axis=1)


def pecli_cosines(loaded, texts: list[str], cpu_tokens: int = CPU_HIDDEN_STATE_BUDGET) -> np.ndarray:
    """measure()'s cosines [l, n] put in text order (its tokens come in batch order), with
    `cpu_tokens` as the CPU token budget of hidden-state loops."""
    saved, batching.CPU_HIDDEN_STATE_BUDGET = batching.CPU_HIDDEN_STATE_BUDGET, cpu_tokens
    try:
        m = measure(loaded, texts, ["zero"], checkpoint_every=None)
    finally:
        batching.CPU_HIDDEN_STATE_BUDGET = saved
    return m.cosine["zero"][:, np.lexsort((m.position, m.text))]


def bracketed(fn, reps: int, flops: float):
    """fn's result, its best time, and per run its GFLOP/s over the mean of the two matmul
    ceilings measured just before and just after it."""
    ceilings, times = [matmul_gflops()], []
    for _ in range(reps):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
        ceilings.append(matmul_gflops())
    around = [(a + b) / 2 for a, b in zip(ceilings[:-1], ceilings[1:], strict=True)]
    shares = [flops / t / 1e9 / c for t, c in zip(times, around, strict=True)]
    return out, min(times), shares, ceilings


def bench(loaded, label: str, texts: list[str], reps: int) -> None:
    enc = encode(loaded.tokenizer, texts, loaded.max_positions)
    lengths = [len(x) for x in enc.ids]
    tokens = 2 * sum(lengths)  # two passes
    flops = useful_flops(loaded, lengths, passes=2)
    loops = {  # baselines first, pecli last
        "naive16": lambda: naive_loop(loaded, texts, 16),
        "single": lambda: naive_loop(loaded, texts, 1),
        "fwd-only": lambda: forward_only(loaded, texts),
        "pecli@4096": lambda: pecli_cosines(loaded, texts, cpu_tokens=4096),
        "pecli": lambda: pecli_cosines(loaded, texts),
    }
    padded16 = sum(max(lengths[i:i + 16]) * len(lengths[i:i + 16])
                   for i in range(0, len(lengths), 16))
    print(f"\n{label}: {len(texts)} texts, mean {sum(lengths) / len(lengths):.0f} tokens "
          f"(max {max(lengths)}), naive16 pads to {padded16 / sum(lengths):.2f}x the real tokens")
    secs, cos = {}, {}
    for name, fn in loops.items():
        cos[name], secs[name], shares, ceilings = bracketed(fn, reps, flops)
        print(f"  {name:10s} {secs[name]:7.2f} s  {tokens / secs[name]:8.0f} tokens/s  "
              f"{flops / secs[name] / 1e9:6.1f} GFLOP/s; of the matmul ceiling "
              f"{100 * statistics.median(shares):.0f} % (runs: "
              f"{', '.join(f'{100 * x:.0f}' for x in shares)}; ceiling "
              f"{min(ceilings):.0f}-{max(ceilings):.0f} GFLOP/s)", flush=True)
    diff = max(float(np.abs(cos[name] - cos["pecli"]).max())
               for name in ("naive16", "single", "pecli@4096"))
    print(f"  pecli vs fwd-only: {secs['fwd-only'] / secs['pecli']:.2f}x   "
          f"pecli vs pecli@4096: {secs['pecli@4096'] / secs['pecli']:.2f}x   "
          f"pecli vs naive16: {secs['naive16'] / secs['pecli']:.2f}x   "
          f"pecli vs single: {secs['single'] / secs['pecli']:.2f}x   "
          f"max |cosine difference| vs naive16, single and pecli@4096: {diff:.1e}   "
          f"load average {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--texts", type=int, default=64, help="IMDB reviews")
    parser.add_argument("--questions", type=int, default=512,
                        help="TruthfulQA questions (short: more of them, for a stable timing)")
    parser.add_argument("--reps", type=int, default=3,
                        help="runs per loop (time: the best; share of the ceiling: the median)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model, device="cpu")
    print(f"{args.model} on CPU, {torch.get_num_threads()} threads, load average "
          f"{load_average()}", flush=True)
    imdb = load_data("imdb", "test", data_dir_=args.data_dir, limit=args.texts, seed=0)
    tqa = load_data("truthfulqa", data_dir_=args.data_dir, limit=args.questions, seed=0)
    measure(loaded, imdb.texts()[:4], ["zero"], checkpoint_every=None)  # warm up
    bench(loaded, "IMDB reviews", imdb.texts(), args.reps)
    bench(loaded, "TruthfulQA questions", tqa.texts("question"), args.reps)


if __name__ == "__main__":
    main()
