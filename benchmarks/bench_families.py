"""Cost of an intervention per family: the intervened forward against the plain forward of the
same random model (the reference config of each family) on the same batch, in one run.

    python benchmarks/bench_families.py                       # every family
    python benchmarks/bench_families.py --families pythia,bloom --repeats 5

For each family and each intervention that applies to its position kind, the forward is
timed plain and inside the intervention, interleaved, and the medians compared (the bar:
at most 1.1x). Entering and leaving the intervention alone is timed too: it is what a batch
pays on top of the forward, and it stays far below a forward because nothing is copied per
batch (a learned table's replacement is made once, in `prepare`; rotary, ALiBi and relative
bias changes are hooks or swapped references).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from timing import load_average

INTERVENTIONS = ("zero", "shuffle", "reverse", "shift:3")
TEXT = ("The film opens on a long shot of the harbour, and for a while nothing happens; then the "
        "story finds its feet and the last hour is as tense as anything I have seen this year.")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_family(family: str, args) -> float:
    """Print one row per intervention that applies to FAMILY; return its largest ratio."""
    from pecli.models.loading import load_model
    from pecli.positions.interventions import prepare
    from pecli.runs.names import INTERVENTIONS as TERMS

    loaded = load_model(f"random:{family}", device="cpu")
    model, kind = loaded.model, loaded.spec.position
    ids = loaded.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    ids = (ids * (args.tokens // len(ids) + 1))[:args.tokens]
    batch = {"input_ids": torch.tensor([ids] * args.batch)}
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])

    def forward():
        with torch.inference_mode():
            model(**batch)

    forward()  # warm-up
    worst = 0.0
    for name in INTERVENTIONS:
        if kind not in TERMS.get(name.split(":")[0]).applies_to:
            continue
        apply = prepare(loaded, name, seed=0)  # the slow part, once per run

        def intervened(apply=apply):
            with apply():
                forward()

        def enter_exit(apply=apply):
            with apply():
                pass

        intervened()  # warm-up
        plain, inside, edges = [], [], []
        for _ in range(args.repeats):
            plain.append(timed(forward))
            inside.append(timed(intervened))
            edges.append(timed(enter_exit))
        p, i = statistics.median(plain), statistics.median(inside)
        worst = max(worst, i / p)
        flag = "  ABOVE 1.1x" if i / p > 1.1 else ""
        print(f"{family:<11} {kind:<15} {name:<12} {p:8.3f} {i:12.3f} {i / p:6.2f} "
              f"{1000 * statistics.median(edges):13.3f}{flag}", flush=True)
    return worst


def main() -> None:
    from pecli.models.architectures import ARCHITECTURES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(ARCHITECTURES.names()))
    parser.add_argument("--batch", type=int, default=4, help="sequences per forward")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    print(f"{args.batch} x {args.tokens} tokens, median of {args.repeats} interleaved repeats, "
          f"{torch.get_num_threads()} threads, load {load_average()}")
    print(f"{'family':<11} {'positions':<15} {'intervention':<12} {'plain s':>8} "
          f"{'intervened s':>12} {'ratio':>6} {'enter+exit ms':>13}")
    worst = max(bench_family(family, args) for family in args.families.split(","))
    print(f"largest ratio: {worst:.2f}x (bar: 1.1x)")


if __name__ == "__main__":
    main()
