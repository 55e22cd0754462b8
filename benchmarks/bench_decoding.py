"""Greedy decoding of pecli's small trained models (toy, toy length): the KV cache
(pecli.measures.training.greedy_tokens) against the whole sequence again at every new token
(what both did before), in one run, as ratios.

    python benchmarks/bench_decoding.py                  # toy length's model, reverse at 3N = 12
    python benchmarks/bench_decoding.py --length 100 --items 64 --reps 3

Both sides decode the same items (one length, one batch, no padding) with the same untrained
model of each scheme for len(answer) + 1 tokens, the steps toy length's exact match takes; the
tokens are checked equal first. Time: best of --reps after a warm-up. Peak memory: the kernel's
high-water mark of the resident set above the resident set before (bench_remedies.measured).
Ratio = the cache's time over the whole-sequence loop's (below 1: faster).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from bench_remedies import measured
from timing import best_of, load_average

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@torch.inference_mode()
def whole_sequence(model, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """The reference: every step one forward over the prompt and every token so far."""
    seq = ids
    for _ in range(steps):
        logits = model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[:, ids.shape[1]:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=12, help="instance length (toy length's 3N)")
    parser.add_argument("--items", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from pecli.experiments.options.toy_length import ToyLengthOptions
    from pecli.experiments.toy import char_tokenizer
    from pecli.experiments.toy_length import Encoder, held_out_items, sequence_length
    from pecli.measures.training import ModelSize, build_model, greedy_tokens

    o, enc = ToyLengthOptions(), Encoder(char_tokenizer())
    items = held_out_items("reverse", args.length, args.items, seed=0)
    ids = torch.tensor([[enc.bos, *enc.ids(p)] for p, _ in items])
    steps = len(enc.ids(items[0][1])) + 1
    positions = sequence_length("reverse", args.length)
    print(f"reverse at length {args.length}: {args.items} items, prompts of {ids.shape[1]} tokens, "
          f"{steps} new tokens each; {o.layers} x {o.width} (load {load_average()})")
    ratios = []
    for scheme in ("learned", "rope", "alibi", "t5"):
        model = build_model(scheme, len(enc.vocab), ModelSize(o.layers, o.width, o.heads, positions),
                            pad_token_id=enc.pad, bos_token_id=enc.bos, eos_token_id=enc.eos).eval()
        assert torch.equal(greedy_tokens(model, ids, steps), whole_sequence(model, ids, steps))
        _, plain = best_of(lambda m=model: whole_sequence(m, ids, steps), args.reps)
        _, cached = best_of(lambda m=model: greedy_tokens(m, ids, steps), args.reps)
        plain_mb = measured(lambda m=model: whole_sequence(m, ids, steps))[1] / 1e6
        cached_mb = measured(lambda m=model: greedy_tokens(m, ids, steps))[1] / 1e6
        ratios.append(cached / plain)
        print(f"{scheme:<8} whole sequence {plain * 1e3:8.1f} ms, {plain_mb:6.1f} MB; KV cache "
              f"{cached * 1e3:8.1f} ms, {cached_mb:6.1f} MB -> time ratio {cached / plain:.2f}x")
    print(f"largest time ratio {max(ratios):.2f}x (the cache over the whole sequence)")


if __name__ == "__main__":
    main()
