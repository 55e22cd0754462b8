"""Speed of `pecli mc` against lm-evaluation-harness (truthfulqa_mc1 + mc2 through the lm-eval
model `pecli`) on the same TruthfulQA items, in one run.

    python benchmarks/bench_lm_eval.py --limit 20

The baseline is lm-eval: one request per (item, choice), batched by its own collator.
pecli mc scores the primer once and each item's context once with all its choices after it.
Both score the same items under the same model (loaded once); printed: each one's time,
forward passes and input positions computed, the ratio, and the largest difference in a
choice's log-likelihood (agreement, not a timing).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from timing import best_of, load_average

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "lm_eval"


class Counter:
    """Forward passes and input positions that reach the model: a hook on its token
    embedding, which every forward (the whole model's or its base model's) goes through."""

    def __init__(self, model):
        self.calls = self.positions = 0
        self.handle = model.get_input_embeddings().register_forward_hook(self.count)

    def count(self, module, args, output):
        self.calls += 1
        self.positions += args[0].numel()

    def reset(self):
        self.calls = self.positions = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8, help="lm-eval's batch size")
    parser.add_argument("--data-dir", default=os.environ.get("PECLI_DATA_DIR"))
    args = parser.parse_args()
    if not args.data_dir:
        raise SystemExit("set PECLI_DATA_DIR or pass --data-dir (the layout of shared/data)")
    os.environ["PECLI_DATA_DIR"] = args.data_dir

    import lm_eval
    from lm_eval.tasks import TaskManager

    from pecli.experiments.mc import run as mc_run
    from pecli.experiments.options.mc import McOptions
    from pecli.integrations.lm_eval import PecliLM
    from pecli.models.loading import load_model

    loaded = load_model(args.model, device="cpu")
    items = json.loads((Path(args.data_dir) / "truthfulqa" / "mc_task.json").read_text())
    path = Path(tempfile.mkdtemp()) / "items.json"
    path.write_text(json.dumps(items[:args.limit]))  # lm-eval's --limit: the first N
    options = McOptions.build({"model": loaded.name, "dataset": str(path), "bootstrap": 0}, "bench")
    manager = TaskManager(include_path=str(CONFIGS))
    counter = Counter(loaded.model)

    def harness():
        lm = PecliLM(pretrained=loaded.name, loaded=loaded, batch_size=args.batch_size)
        try:
            return lm_eval.simple_evaluate(model=lm, tasks=["truthfulqa_mc1", "truthfulqa_mc2"],
                                           limit=args.limit, task_manager=manager,
                                           log_samples=True, bootstrap_iters=0)
        finally:
            lm.close()

    mc_run(options, loaded=loaded)  # warm-up
    counter.reset()
    ours, t_ours = best_of(lambda: mc_run(options, loaded=loaded)["mc_items"])
    ours_calls, ours_positions = counter.calls, counter.positions
    counter.reset()
    theirs, t_theirs = best_of(harness)
    theirs_calls, theirs_positions = counter.calls, counter.positions

    diff = 0.0
    for task in ("mc1", "mc2"):
        for s in theirs["samples"][f"truthfulqa_{task}"]:
            rows = ours[(ours["task"] == task) & (ours["text_id"] == s["doc_id"])]
            ll = rows.sort_values("choice_index")["value"].to_numpy()
            diff = max(diff, float(np.abs(ll - [r[0][0] for r in s["resps"]]).max()))
    print(f"{loaded.name} on the first {args.limit} TruthfulQA items (MC1 + MC2), "
          f"{torch.get_num_threads()} threads, load {load_average()}")
    print(f"lm-eval via the pecli model (baseline): {t_theirs:7.2f} s, {theirs_calls} forwards, "
          f"{theirs_positions} input positions (batch {args.batch_size})")
    print(f"pecli mc (shared context)             : {t_ours:7.2f} s, {ours_calls} forwards, "
          f"{ours_positions} input positions")
    print(f"speed-up {t_theirs / t_ours:.2f}x; positions computed {theirs_positions / max(ours_positions, 1):.2f}x "
          f"fewer; max |choice log-likelihood difference| {diff:.2e}")


if __name__ == "__main__":
    main()
