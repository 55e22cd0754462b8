"""A 262k vocabulary without whole logits: peak memory and time of pecli's scoring against the
model's own forward without logits, in one run.

Each way runs in its own process, on the same tokens; its peak resident memory (Linux's VmHWM)
is counted from the model loaded (loading's own peak left out), so it holds the weights plus
what the way adds:

- hidden (the baseline): the model's own forward without logits, `model.base_model(ids)`: the
  weights plus the activations of one forward;
- pecli: the same forward, then every position's NLL from the final hidden states through the
  LM head in chunks of rows (64 at 262k: `pecli.measures.metrics.head_nll`, what perplexity,
  length and mc score with);
- logits (with --logits): the model's own forward with its whole [tokens, vocab] logits and
  cross-entropy on them (4.3 GB of fp32 logits at 4,096 tokens of Gemma 3), for scale.

Goals (issue 43): pecli's peak memory at most 1.5x the baseline's, its time at most 1.1x. The
LM head of a 262k vocabulary costs 2 x 640 x 262,144 FLOPs a position, 1.6x what Gemma 3 270M's
blocks cost: scoring every position cannot come within 1.1x of a forward that scores none, so
with --logits the time is also given against the model's own forward with its logits.
pecli's NLLs equal the logits' to float noise where both run (max |difference| printed).

    python benchmarks/bench_vocab.py --model gemma3 --tokens 8192 --reps 2

Measured at 8,192 tokens on a quiet 2-core machine (2026-12-04, float32, best of 1): peak
memory 1.10x the forward without logits, time 1.61x, with chunks of 256 rows (HEAD_LOGITS);
with the earlier 64-row chunks 0.97x and 1.73x (the 640 x 262,144 head, 670 MB, read once per
chunk). The 15 s above the forward is the head (2.7 TFLOP at 8,192 tokens), about 1.6x is
its floor on this CPU, and the 1.1x goal cannot be met by any way that scores every position.
At 2,048 tokens (2026-11-27, a shared machine): the whole logits 3.82x the memory, NLLs equal
to pecli's (0.0).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys

import torch
from timing import best_of, load_average


def peak_gib(reset: bool = False) -> float:
    """Peak resident memory of this process (Linux's VmHWM), since the last reset: a reset
    after loading leaves loading's own peak out (it sets the peak to what is resident now)."""
    if reset:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return kib / 2**20


def one(way: str, model_name: str, tokens: int, reps: int, seed: int) -> dict:
    """Load the model, run `way` on `tokens` random ids, report its time and peak memory."""
    from pecli.measures.metrics import head_nll
    from pecli.models.loading import load_model

    loaded = load_model(model_name, device="cpu")
    model = loaded.model
    ids = torch.randint(10, model.config.vocab_size, (1, tokens),
                        generator=torch.Generator().manual_seed(seed))
    gc.collect()
    loaded_gib = peak_gib(reset=True)  # the weights (and tokenizer) resident

    def run():
        with torch.inference_mode():
            if way == "logits":
                logits = model(input_ids=ids, use_cache=False).logits[0, :-1]
                return torch.nn.functional.cross_entropy(logits.float(), ids[0, 1:], reduction="none")
            hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state[0]
            if way == "hidden":
                return hidden[:0, 0]
            return head_nll(model, hidden[:-1], ids[0, 1:])

    nll, seconds = best_of(run, reps)
    return {"way": way, "seconds": seconds, "peak_gib": peak_gib(), "loaded_gib": loaded_gib,
            "nll": nll.tolist() if way != "hidden" else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logits", action="store_true", help="also the whole-logits forward")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: this way only
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.model, args.tokens, args.reps, args.seed)))
        return
    ways = ["hidden", "pecli"] + (["logits"] if args.logits else [])
    results = {}
    for way in ways:
        out = subprocess.run([sys.executable, __file__, "--one", way, "--model", args.model,
                              "--tokens", str(args.tokens), "--reps", str(args.reps),
                              "--seed", str(args.seed)], capture_output=True, text=True, check=True)
        results[way] = json.loads(out.stdout.strip().splitlines()[-1])
    base = results["hidden"]
    print(f"{args.model}, {args.tokens:,} tokens, best of {args.reps}; load average {load_average()}")
    print(f"{'way':8} {'seconds':>8} {'x time':>7} {'peak GiB':>9} {'x peak':>7} "
          f"{'above load GiB':>15}")
    for way, r in results.items():
        print(f"{way:8} {r['seconds']:8.2f} {r['seconds'] / base['seconds']:7.2f} "
              f"{r['peak_gib']:9.2f} {r['peak_gib'] / base['peak_gib']:7.2f} "
              f"{r['peak_gib'] - r['loaded_gib']:15.2f}")
    pecli = results["pecli"]
    print(f"goals: memory {pecli['peak_gib'] / base['peak_gib']:.2f}x (at most 1.5x), "
          f"time {pecli['seconds'] / base['seconds']:.2f}x (at most 1.1x) the forward without logits")
    if "logits" in results:
        full = results["logits"]
        print(f"against the whole-logits forward (the same work): time "
              f"{pecli['seconds'] / full['seconds']:.2f}x, memory above the weights "
              f"{(pecli['peak_gib'] - pecli['loaded_gib']) / (full['peak_gib'] - full['loaded_gib']):.2f}x")
        diff = (torch.tensor(pecli["nll"]) - torch.tensor(results["logits"]["nll"])).abs().max()
        print(f"pecli's NLLs against the whole logits': max |difference| {float(diff):.2e}")


if __name__ == "__main__":
    main()
