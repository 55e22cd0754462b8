"""Memory and time of `pecli attn`'s capture against plain forwards, in one run, on SmolLM2.

    python benchmarks/bench_attn.py                 # one text of 8,192 tokens (the issue's size)
    python benchmarks/bench_attn.py --length 2048   # quicker

Routes, each in a fresh process (so that one's peak memory is not another's), on the same
token ids (one window of the IMDB reviews joined by EOS, the tokenizer's special tokens):

    sdpa      the plain forward: SmolLM2's base model as loaded (SDPA), no statistics
    eager     the plain eager forward (attn_implementation eager): the time baseline
    attn      pecli.measures.attention.capture + run_batch: every statistic of `pecli attn`,
              attention computed by layer in blocks of --block query rows, hidden-state
              hooks on (positional vectors, norms, 32 probe positions)
    literal   output_attentions=True, eager: every layer's maps at once (Gu et al.'s route).
              At 8,192 tokens it needs layers x heads x T^2 x 4 bytes (72 GiB): printed as
              computed, and measured at --literal-length (default 1,024) beside the attn
              route at that length.

Peak memory: the largest resident set (sampled every 5 ms from /proc/self/statm) during
the forward, minus the resident set just before it (the model loaded, a warm-up done at a
short length). Time: one forward after that warm-up.
Goals (issue 35): attn peak <= 1.5 x the plain forward's + 1 GiB; attn time <= 3 x eager.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GiB = 2**30


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Peak:
    """The largest resident set seen while the block runs (a sampling thread)."""

    def __enter__(self):
        self.start, self.peak, self._stop = _rss(), _rss(), False
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop:
            self.peak = max(self.peak, _rss())
            time.sleep(0.005)

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def extra(self) -> int:
        return self.peak - self.start


def ids_for(loaded, length: int):
    import torch

    from pecli.data.datasets import load_data
    from pecli.experiments.attn import select_texts

    data = load_data("imdb", "test", limit=400, seed=0)
    ids, _ = select_texts(loaded.tokenizer, data.texts(), length, 2, 0, join=True)
    return ids[:1].to(torch.long)


def one_route(route: str, length: int, block: int) -> dict:
    import torch

    from pecli.measures.attention import Stats, capture, heads_of, run_batch
    from pecli.models.loading import load_model

    torch.set_grad_enabled(False)
    loaded = load_model("smollm2", device="cpu")
    base = loaded.model.base_model
    layers = len(base.layers)
    if route in ("eager", "literal"):
        loaded.model.set_attn_implementation("eager")

    def forward(ids):
        if route in ("sdpa", "eager"):
            base(input_ids=ids)
        elif route == "literal":
            out = base(input_ids=ids, output_attentions=True)
            assert len(out.attentions) == layers
        else:
            stats = Stats(1, layers, heads_of(loaded), ids.shape[1], True, block,
                          tuple(range(0, ids.shape[1], max(1, ids.shape[1] // 32))))
            with capture(loaded, stats):
                run_batch(loaded, stats, ids)
            assert len(stats.seen_layers) == layers

    forward(ids_for(loaded, 64))  # warm-up
    ids = ids_for(loaded, length)
    with Peak() as peak:
        start = time.perf_counter()
        forward(ids)
        seconds = time.perf_counter() - start
    return {"route": route, "length": length, "seconds": seconds, "peak_extra": peak.extra,
            "layers": layers, "heads": heads_of(loaded)}


def run_route(route: str, length: int, block: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--route", route, "--length", str(length),
                          "--block", str(block)], capture_output=True, text=True, check=False,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode:
        sys.exit(f"route {route} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from timing import load_average

    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--literal-length", type=int, default=1024)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--route", choices=("sdpa", "eager", "attn", "literal"))
    a = ap.parse_args()
    if a.route:
        print(json.dumps(one_route(a.route, a.length, a.block)))
        return
    print(f"SmolLM2 (30 layers x 9 heads), one text of {a.length} tokens, CPU, fp32; "
          f"load average {load_average()}")
    got = {r: run_route(r, a.length, a.block) for r in ("sdpa", "eager", "attn")}
    lit = {r: run_route(r, a.literal_length, a.block) for r in ("sdpa", "attn", "literal")}
    L, H = got["attn"]["layers"], got["attn"]["heads"]
    print(f"\n{'route':<10}{'tokens':>8}{'time s':>9}{'peak extra GiB':>16}")
    for rows in (got, lit):
        for r in rows.values():
            print(f"{r['route']:<10}{r['length']:>8}{r['seconds']:>9.1f}{r['peak_extra'] / GiB:>16.3f}")
    sd, eg, at = got["sdpa"], got["eager"], got["attn"]
    bound = 1.5 * sd["peak_extra"] + GiB
    print(f"\nat {a.length} tokens:")
    print(f"  time   attn / plain eager forward = {at['seconds'] / eg['seconds']:.2f}x (goal <= 3x); "
          f"attn / plain sdpa = {at['seconds'] / sd['seconds']:.2f}x")
    print(f"  memory attn peak extra {at['peak_extra'] / GiB:.3f} GiB; 1.5 x plain forward + 1 GiB = "
          f"{bound / GiB:.3f} GiB: {'within' if at['peak_extra'] <= bound else 'OVER'} the goal "
          f"(plain eager forward: {eg['peak_extra'] / GiB:.3f} GiB)")
    maps = L * H * a.length**2 * 4
    print(f"  literal output_attentions route: every layer's maps are {L} x {H} x {a.length}^2 x 4 B "
          f"= {maps / GiB:.1f} GiB, not run at this length")
    print(f"at {a.literal_length} tokens (measured): literal / attn memory = "
          f"{lit['literal']['peak_extra'] / max(lit['attn']['peak_extra'], 1):.1f}x "
          f"({lit['literal']['peak_extra'] / GiB:.3f} vs {lit['attn']['peak_extra'] / GiB:.3f} GiB; "
          f"plain sdpa {lit['sdpa']['peak_extra'] / GiB:.3f} GiB)")


if __name__ == "__main__":
    main()
