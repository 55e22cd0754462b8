"""Timing helpers shared by the benchmarks (run as scripts: `from timing import ...`)."""

from __future__ import annotations

import os
import time


def best_of(fn, reps: int = 1):
    """(fn's result, its best wall time in seconds over `reps` runs)."""
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return out, best


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages, e.g. "0.48, 1.58, 2.70"."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())
