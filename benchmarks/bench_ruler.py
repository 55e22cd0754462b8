"""`pecli ruler` against `pecli passkey` on the same model, per token, in one run, as a ratio.

    python benchmarks/bench_ruler.py                      # SmolLM2, 1,024 tokens, 4 samples
    python benchmarks/bench_ruler.py --model random:llama --length 512 --samples 2

Both experiments' `run` on one loaded model (intact), the haystack built before timing: ruler's
niah_single_1 (RULER's passkey-like task) at --length tokens (its prompt plus RULER's 128 new
tokens; it decodes its cell's budget, measures.ruler.decode_budget) against passkey at the same
sequence length (its prompt plus up to 10 new tokens), the same number of samples/trials. Per
token: wall time over the sequence tokens (prompt + the most new tokens each may decode); and
over prompt tokens alone. Goal: ruler within 1.2x of
passkey per sequence token. Best of --repeats, interleaved.
"""

from __future__ import annotations

import argparse

from timing import best_of, load_average


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--task", default="niah_single_1")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    from pecli.experiments import load, ruler
    from pecli.experiments import passkey as pk
    from pecli.experiments.options.passkey import PasskeyOptions
    from pecli.measures.passkey import NEW_TOKENS

    r_opts = ruler.RulerOptions.build({"model": args.model, "tasks": args.task, "lengths": [args.length],
                                       "samples": args.samples, "bootstrap": 0}, "bench")
    p_opts = PasskeyOptions.build({"model": args.model, "lengths": [args.length - NEW_TOKENS],
                                   "depths": [0.5], "trials": args.samples}, "bench")
    loaded = load(args.model, r_opts)
    ruler.essay(r_opts.haystack, r_opts.data_dir)  # built once, outside the timing
    r_time = p_time = float("inf")
    for _ in range(args.repeats):
        r_out, t = best_of(lambda: ruler.run(r_opts, loaded=loaded))
        r_time = min(r_time, t)
        p_out, t = best_of(lambda: pk.run(p_opts, loaded=loaded))
        p_time = min(p_time, t)
    r_prompt = int(r_out["ruler_samples"]["tokens"].sum())
    p_prompt = int(p_out["passkey_trials"]["tokens"].sum())
    r_new = int(r_out["ruler_samples"]["max_new_tokens"].max())
    r_seq = r_prompt + args.samples * r_new
    p_seq = p_prompt + args.samples * NEW_TOKENS
    print(f"model {args.model}, {args.length} tokens, {args.samples} samples; load average {load_average()}")
    print(f"ruler {args.task}: {r_time:.1f} s, {r_prompt} prompt tokens (+ up to "
          f"{r_new} new each): {1e3 * r_time / r_seq:.2f} ms per sequence token, "
          f"{1e3 * r_time / r_prompt:.2f} ms per prompt token")
    print(f"passkey: {p_time:.1f} s, {p_prompt} prompt tokens (+ up to {NEW_TOKENS} new each): "
          f"{1e3 * p_time / p_seq:.2f} ms per sequence token, {1e3 * p_time / p_prompt:.2f} ms per prompt token")
    ratio = (r_time / r_seq) / (p_time / p_seq)
    print(f"ratio ruler/passkey per sequence token: {ratio:.2f}x (goal 1.2x); per prompt token: "
          f"{(r_time / r_prompt) / (p_time / p_prompt):.2f}x")


if __name__ == "__main__":
    main()
