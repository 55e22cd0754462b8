"""The options of `pecli toy length` (pecli.experiments.toy_length)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import ClassVar

from pecli.runs import names
from pecli.runs.errors import ConfigError
from pecli.runs.fields import MAX_TOKENS, option
from pecli.runs.names import Choice
from pecli.runs.options import MAX_LR, MAX_STEPS, MAX_THREADS, MIN_LR, Training

TOY_TASKS = ("copy", "reverse", "addition", "sort")


@dataclass(frozen=True)
class ToyLengthOptions(Training):
    """`pecli toy length` and the `toy-length` experiment."""

    FLAGS: ClassVar[str] = ("task pe train_length test_lengths seeds eval_items steps batch lr "
                            "layers width heads threads workers save_models seed out force")

    pe: tuple[Choice, ...] = option(
        tuple(names.PE_SCHEMES), vocabulary=names.PE_SCHEMES, many=True, flag={"decls": ("--pe",)},
        help="Position encoding(s) to train with: learned, sinusoidal, none, rope, alibi, t5, "
             "randomized, p-rope (repeat or comma-separate; default: all eight).")
    task: tuple[str, ...] | str = option(  # of TOY_TASKS; "a,b" too
        ("copy", "reverse", "sort"), flag={"type": list[str] | None},
        help=f"Task(s): {', '.join(TOY_TASKS)} (repeat or comma-separate; default: copy, reverse, "
             "sort).")
    train_length: int = option(4, low=1, high=MAX_TOKENS, help="N: training instances have lengths 1..N.")
    test_lengths: tuple[int, ...] | str = option(
        (), help="Test lengths, e.g. 8,16,24 (default: N/2, N, 1.5N, 2N, 2.5N, 3N).")
    seeds: int = option(3, low=1, help="Training seeds per (task, scheme): --seed, --seed + 1, ...")
    eval_items: int = option(64, low=1, help="Test instances per length.")
    steps: int = option(300, low=1, high=MAX_STEPS, help="Optimiser steps per model.")
    layers: int = option(2, low=1)
    width: int = option(64, low=1)
    heads: int = option(4, low=1)
    batch: int = option(32, low=1, help="Instances per step.")
    lr: float = option(1e-2, low=MIN_LR, high=MAX_LR, help="Peak learning rate.")
    threads: int | None = option(1, low=1, high=MAX_THREADS, flag={"type": int},
                                 help="torch threads (1 is fastest at this size).")
    workers: int = option(1, low=1, location=True, help="Models trained at once, each in its own "
                                                        "one-thread process (same numbers).")

    def check(self) -> None:
        super().check()
        given = [self.task] if isinstance(self.task, str) else list(self.task)
        tasks = [t for item in given for t in names.split_names(item)]
        for task in tasks:
            if task not in TOY_TASKS:
                close = difflib.get_close_matches(str(task), TOY_TASKS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"task (--task): unknown task {task!r}{hint}; use one or more of "
                                  f"{', '.join(TOY_TASKS)}")
        if not tasks:
            raise ConfigError(f"task (--task): name at least one of {', '.join(TOY_TASKS)}")
        object.__setattr__(self, "task", tuple(dict.fromkeys(tasks)))
        if self.test_lengths in ((), ""):
            n = self.train_length
            lengths = sorted({max(1, n // 2), n, *(max(1, round(n * k / 2)) for k in range(3, 7))})
        else:
            given = self.test_lengths
            try:
                lengths = [int(x) for x in (names.split_names(given) if isinstance(given, str) else given)]
            except (TypeError, ValueError):
                lengths = []
            if not lengths or min(lengths) < 1:
                raise ConfigError(f"test_lengths (--test-lengths): {given!r}: give instance lengths "
                                  "of at least 1, e.g. 8,16,24")
            lengths = sorted(set(lengths))
        object.__setattr__(self, "test_lengths", tuple(lengths))
        if max(self.test_lengths) <= self.train_length:  # the headline and ranking are past it
            n = self.train_length
            raise ConfigError(f"test_lengths (--test-lengths): none is past the training length "
                              f"{n}; test beyond it too, e.g. {n},{2 * n},{3 * n}")
