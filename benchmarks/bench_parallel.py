"""Does sharding lose anything? ablate on 2 processes x 1 thread against 1 process x 2 threads.

    python benchmarks/bench_parallel.py --texts 48 --data-dir ../shared/data

Both runs score the same IMDB reviews with `pecli.experiments.ablate.measure` (MiniLM,
`zero`), on the same batch plan: 1 process with torch on 2 threads, then 2 processes
started by torchrun (gloo) with 1 thread each, each taking its share of the batches
(`pecli.runs.parallel`). Each run's time is that of measure() alone, between barriers (model
loading and imports excluded), best of --reps. The cosines must agree (max |difference|
printed); the ratio (1-process time / 2-process time) should be at least 0.9.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from timing import load_average


def worker(args) -> None:
    """One run (inside torchrun or alone): time measure(), rank 0 saves its cosines and time."""
    import torch

    from pecli.data.datasets import load_data
    from pecli.experiments.ablate import measure
    from pecli.models.loading import load_model
    from pecli.runs import parallel

    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, device="cpu")
    texts = load_data("imdb", "test", data_dir_=args.data_dir, limit=args.texts, seed=0).texts()
    measure(loaded, texts[:2], ["zero"], checkpoint_every=None)  # warm up
    best = float("inf")
    for _ in range(args.reps):
        parallel.barrier()
        start = time.perf_counter()
        m = measure(loaded, texts, ["zero"], checkpoint_every=None)
        parallel.barrier()
        best = min(best, time.perf_counter() - start)
    if parallel.is_main():
        np.savez(args.worker, cosine=m.cosine["zero"], seconds=best, tokens=m.tokens)


def run(args, processes: int, threads: int, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    me = [str(Path(__file__).resolve()), "--worker", str(out), "--threads", str(threads),
          "--model", args.model, "--texts", str(args.texts), "--reps", str(args.reps)]
    if args.data_dir:
        me += ["--data-dir", args.data_dir]
    if processes == 1:
        cmd = [sys.executable, *me]
    else:
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
        cmd = [torchrun, "--standalone", "--nproc_per_node", str(processes), *me]
    subprocess.run(cmd, env=env, check=True)
    with np.load(out) as saved:
        return {k: saved[k] for k in saved.files}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--texts", type=int, default=48, help="IMDB reviews")
    parser.add_argument("--reps", type=int, default=2, help="best of N runs each")
    parser.add_argument("--data-dir", default=os.environ.get("PECLI_DATA_DIR"))
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    print(f"{args.model} ablate (zero) on {args.texts} IMDB reviews, CPU; "
          f"load average {load_average()}", flush=True)
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_parallel_{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    one = run(args, 1, 2, tmp / "one.npz")
    two = run(args, 2, 1, tmp / "two.npz")
    shutil.rmtree(tmp, ignore_errors=True)
    diff = float(np.abs(one["cosine"] - two["cosine"]).max())
    tokens = 2 * int(one["tokens"])  # two passes
    for label, r in (("1 process x 2 threads", one), ("2 processes x 1 thread", two)):
        print(f"  {label:24s} {float(r['seconds']):7.2f} s  {tokens / float(r['seconds']):8.0f} tokens/s")
    print(f"  2x1 vs 1x2: {float(one['seconds']) / float(two['seconds']):.2f}x (wanted >= 0.9)   "
          f"max |cosine difference| {diff:.1e}   load average now "
          f"{load_average()}")


if __name__ == "__main__":
    main()
