"""The one batch loop: every batched forward pass of ablate, LM scoring and MC scoring runs here.

A measurement plans its batches from all its inputs first (lists of indices into them,
`pecli.runs.batching`), then hands the plan and a `compute(rows, width)` to `run_batches`,
which

1. spreads the plan so that every process gets a batch (`parallel.spread`; the identity in
   one process),
2. resumes the batches a checkpoint holds (only the main process reads it; the others are
   told which batches to skip),
3. shards the rest across processes, balanced by padded tokens (`parallel.shards`),
4. computes each of its batches, halving one that runs out of device memory
   (`batching.halving_on_oom`; `compute` gets the whole batch's padded `width`, so halves
   can keep it) and joining the halves' results (`joined`),
5. gathers every process's result after each step (every process takes part in every step),
   advancing a progress bar and saving the checkpoint,
6. adds every process's out-of-memory splits to the main process's run notes.

Results come back on every process as {batch index in the spread plan: result}, in plan
order, with the spread plan: the same at any process count.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Saved(Protocol):
    """What a checkpoint of the loop does (`pecli.runs.io.Checkpoint` behind an adapter that
    knows the results' layout)."""

    def load(self) -> dict[int, Any] | None: ...  # finished batches saved before, or None

    def save(self, done: dict[int, Any]) -> None: ...  # may skip (not due yet)

    def clear(self) -> None: ...  # the run finished: nothing to resume


def joined(parts: list):
    """A batch's result from its halves' results, in order (a batch halved after running out
    of memory): lists chained, numpy arrays and torch tensors concatenated."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], list):
        return [x for part in parts for x in part]
    if type(parts[0]).__module__ == "numpy":
        import numpy as np

        return np.concatenate(parts)
    import torch

    return torch.cat(parts)


def run_batches(plan: list[list[int]], lengths: list[int], compute: Callable[[list[int], int], T],
                *, join: Callable[[list[T]], T] = joined,
                checkpoint: Callable[[list[list[int]]], Saved | None] | None = None,
                progress: str | None = None) -> tuple[list[list[int]], dict[int, T]]:
    """(the spread plan, {batch: compute(its rows, its padded width)}) on every process.

    Args:
        plan: the whole run's batches, indices into `lengths` (before spreading).
        lengths: each input's length: a batch's cost (rows x longest) and padded width.
        compute: one batch's result; called with the rows (a batch, or half of one after an
            out-of-memory error) and the whole batch's width (its longest input).
        join: the result of a batch from its halves' (default `joined`).
        checkpoint: given the spread plan, where finished batches are saved and resumed from
            (called in the main process only; None, or returning None: never saved).
        progress: a progress bar over batches named so (main process only; also says how
            many batches a resumed run found done); None: quiet.
    """
    from pecli.runs import parallel

    batches = parallel.spread(plan)
    saved = checkpoint(batches) if checkpoint is not None and parallel.is_main() else None
    done: dict[int, T] = dict(parallel.from_main(saved.load() if saved is not None else None) or {})
    shown = progress is not None and parallel.is_main()
    if done and shown:
        print(f"resuming: {len(done)} of {len(batches)} batches were done before", file=sys.stderr)
    todo = [b for b in range(len(batches)) if b not in done]
    shares = [[todo[i] for i in s] for s in parallel.shards([batches[b] for b in todo], lengths)]
    with _counted_splits(), _bar(shown, len(batches), progress) as advance:
        for _ in done:
            advance()
        _steps(batches, lengths, shares[parallel.rank()], max(map(len, shares)), compute, join,
               done, saved, advance)
    if saved is not None:
        saved.clear()
    return batches, done


def _steps(batches, lengths, mine, steps, compute, join, done, saved, advance) -> None:
    """The loop itself: in each step this process computes its next batch (if any), then every
    process's batch of the step is gathered into `done`."""
    from pecli.runs import parallel
    from pecli.runs.batching import halving_on_oom

    for step in range(steps):
        new = {}
        if step < len(mine):
            rows = batches[mine[step]]
            width = max(lengths[i] for i in rows)
            new[mine[step]] = join(halving_on_oom(lambda r, w=width: compute(r, w), rows))
        for b, result in parallel.gather(new).items():
            done[b] = result
            advance()
        if saved is not None and len(done) < len(batches):
            saved.save(done)


class _counted_splits:
    """Every process's out-of-memory splits of the loop, in the main process's run notes
    (`oom_splits`, which rows carry)."""

    def __enter__(self):
        from pecli.runs.provenance import RUN_NOTES

        self.before = RUN_NOTES.get("oom_splits", 0)

    def __exit__(self, *exc):
        if exc[0] is not None:
            return False
        from pecli.runs import parallel
        from pecli.runs.provenance import RUN_NOTES

        mine = RUN_NOTES.get("oom_splits", 0) - self.before
        splits = sum(parallel.gather({parallel.rank(): mine}).values())
        if splits:
            RUN_NOTES["oom_splits"] = self.before + splits
        return False


class _bar:
    """A rich progress bar over batches (its `advance`), or nothing."""

    def __init__(self, enabled: bool, total: int, what: str | None):
        self.enabled, self.total, self.what = enabled, total, what

    def __enter__(self):
        if not self.enabled:
            return lambda: None
        from pecli.runs.progress import progress_bar

        # a terminal gets a bar; piped or captured output, a line every ~10 % or 30 s
        self.bar = progress_bar(transient=True)
        self.bar.__enter__()
        task = self.bar.add_task(f"{self.what} ({self.total} batches)", total=self.total)
        return lambda: self.bar.advance(task)

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.__exit__(*exc)
        return False
