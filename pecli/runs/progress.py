"""Progress that suits where the output goes: a Rich bar in a terminal; when stderr is piped
or captured (a log, a CI job), a plain line about every 10 % or 30 s, so a long run is never
silent and never floods a log.

    with progress_bar("scoring", BarColumn(), console=console) as p:
        task = p.add_task("scoring", total=n)
        p.update(task, advance=1)

`progress_bar` takes Rich's Progress arguments and returns a Rich Progress or a `PlainProgress`,
which understands the same add_task / update / advance calls.
"""

from __future__ import annotations

import sys
import time

STEP = 0.10  # a line at every further 10 % ...
EVERY = 30.0  # ... or after 30 s without one


class PlainProgress:
    """Progress lines on stderr: `pecli: ablate (69 batches): 30 % (21/69), 12 s`."""

    def __init__(self, stream=None, step: float = STEP, every: float = EVERY):
        self.stream = stream or sys.stderr
        self.step, self.every = step, every
        self.tasks: dict[int, dict] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, description: str, total: float | None = None, completed: float = 0,
                 **_fields) -> int:
        now = time.monotonic()
        self.tasks[len(self.tasks)] = {"what": description, "total": total, "done": completed,
                                       "start": now, "said_at": now, "said": 0}
        return len(self.tasks) - 1

    def advance(self, task: int, advance: float = 1) -> None:
        self.update(task, advance=advance)

    def update(self, task: int, *, advance: float = 0, completed: float | None = None,
               total: float | None = None, description: str | None = None, **_fields) -> None:
        t = self.tasks[task]
        if total is not None:
            t["total"] = total
        if description is not None:
            t["what"] = description
        t["done"] = completed if completed is not None else t["done"] + advance
        now = time.monotonic()
        fraction = t["done"] / t["total"] if t["total"] else None
        due = now - t["said_at"] >= self.every
        level = int(fraction / self.step + 1e-9) if fraction is not None else 0  # tenths reached
        if level > t["said"] or (fraction is not None and fraction >= 1 > t["said"] * self.step):
            due = True
        if due:
            t["said_at"] = now
            t["said"] = max(level, t["said"])
            done = f"{t['done']:,.0f}"
            share = f"{100 * fraction:.0f} % ({done}/{t['total']:,.0f})" if fraction is not None else done
            print(f"pecli: {t['what']}: {share}, {now - t['start']:.0f} s", file=self.stream,
                  flush=True)


def progress_bar(*columns, console=None, disable: bool = False, **kwargs):
    """A Rich Progress when `console` (default: stderr's) is a terminal, else PlainProgress."""
    from rich.console import Console
    from rich.progress import Progress

    console = console or Console(stderr=True)
    if disable or console.is_terminal:
        return Progress(*columns, console=console, disable=disable, **kwargs)
    return PlainProgress()
