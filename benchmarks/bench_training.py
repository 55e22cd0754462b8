"""Training throughput of pecli's loop (pecli.measures.training.train) against a plain
PyTorch loop on the same model, the same batches and the same optimiser.

    python benchmarks/bench_training.py            # toy length's model and batch, and train lm's
    python benchmarks/bench_training.py --steps 30 --reps 3

The plain loop is what one writes by hand: AdamW (same groups and betas), forward, backward,
step; no schedule, no clipping, no loss read back. pecli's loop adds the warm-up/cosine
schedule, gradient clipping, the loss as a float per step and the token count. Each side
trains a fresh copy of the same initial weights on the same pre-built batches, best of
`--reps` after a warm-up; tokens per second count input tokens (the attention mask's ones).
Ratio = pecli's tokens/s over the plain loop's (goal: at least 0.9).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from timing import best_of, load_average

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def plain_loop(model, batches: list[dict], lr: float) -> int:
    """The loop by hand; returns the input tokens it trained on."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.01},
                             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    model.train()
    for batch in batches:
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return sum(int(b["attention_mask"].sum()) for b in batches)


def pecli_loop(model, batches: list[dict], lr: float) -> int:
    from pecli.measures.training import TrainConfig, train

    return train(model, iter(batches), TrainConfig(steps=len(batches), lr=lr, warmup=5))["tokens"]


def row(name: str, scheme: str, model, batches: list[dict], reps: int) -> float:
    start = copy.deepcopy(model.state_dict())

    def run(loop):
        model.load_state_dict(start)  # same initial weights each time
        return loop(model, batches, 3e-3)

    run(plain_loop)  # warm-up
    tokens, t_plain = best_of(lambda: run(plain_loop), reps)
    _, t_pecli = best_of(lambda: run(pecli_loop), reps)
    plain, ours = tokens / t_plain, tokens / t_pecli
    print(f"{name}, {scheme}: {len(batches)} steps, {tokens:,} tokens: plain PyTorch loop "
          f"{plain:,.0f} tokens/s, pecli train {ours:,.0f} tokens/s -> ratio {ours / plain:.2f}x "
          f"(load {load_average()})")
    return ours / plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from pecli.experiments.options.toy_length import ToyLengthOptions
    from pecli.experiments.options.train_lm import TrainLmOptions
    from pecli.experiments.toy import char_tokenizer
    from pecli.experiments.toy_length import Encoder, training_batches
    from pecli.measures.training import ModelSize, build_model

    ratios = []
    o = ToyLengthOptions()
    enc = Encoder(char_tokenizer())
    for scheme in ("learned", "rope", "alibi", "t5"):
        model = build_model(scheme, len(enc.vocab), ModelSize(o.layers, o.width, o.heads, 80),
                            pad_token_id=enc.pad, bos_token_id=enc.bos, eos_token_id=enc.eos)
        it = training_batches("reverse", enc, o.train_length, o.batch, seed=0)
        ratios.append(row(f"toy length ({o.layers} x {o.width}, batch {o.batch}, lengths "
                          f"1-{o.train_length})", scheme, model,
                          [next(it) for _ in range(args.steps)], args.reps))
    lm = TrainLmOptions()
    gen = torch.Generator().manual_seed(0)
    for scheme in ("learned", "rope"):
        model = build_model(scheme, lm.vocab, ModelSize(lm.layers, lm.width, lm.heads, lm.context),
                            pad_token_id=0, bos_token_id=0, eos_token_id=0)
        batches = []
        for _ in range(args.steps):
            ids = torch.randint(0, lm.vocab, (lm.batch, lm.context), generator=gen)
            batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
        ratios.append(row(f"train lm ({lm.layers} x {lm.width}, {lm.batch} x {lm.context} tokens, "
                          f"vocab {lm.vocab})", scheme, model, batches, args.reps))
    print(f"smallest ratio {min(ratios):.2f}x (goal: at least 0.9x)")


if __name__ == "__main__":
    main()
