"""The options of `pecli toy arithmetic` (pecli.experiments.toy)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from pecli.runs import names
from pecli.runs.errors import ConfigError
from pecli.runs.fields import option
from pecli.runs.names import Choice
from pecli.runs.options import MAX_STEPS, MAX_THREADS, Training

TOY_PROBE = re.compile(r"(\d+)[+-](\d+)=")


@dataclass(frozen=True)
class ToyOptions(Training):
    """`pecli toy arithmetic` and the `toy` experiment."""

    FLAGS: ClassVar[str] = "pe max_n steps seeds probe layers width heads threads workers save_models seed out force"

    pe: tuple[Choice, ...] = option(
        ("learned", "sinusoidal", "none", "rope", "alibi"), vocabulary=names.PE_SCHEMES, many=True,
        flag={"decls": ("--pe",)},
        help="Position encoding(s) to train with: learned, sinusoidal, none, rope, alibi, t5, p-rope "
             "(repeat the flag or comma-separate; default: the first five).")
    max_n: int = option(100, low=2, flag={"decls": ("--max",)}, help="Operands 0 <= i, j < MAX.")
    steps: int = option(2000, low=1, high=MAX_STEPS)
    seeds: int = option(1, low=1, help="Training seeds per scheme: --seed, --seed + 1, ... (every seed "
                                       "trains on --seed's split and answers the same test sums).")
    layers: int = option(2, low=1)
    width: int = option(64, low=1)
    heads: int = option(4, low=1)
    batch: int = option(128, low=1)
    test_fraction: float = option(0.2, low=0.0, high=1.0)
    probe: str | None = option(None, help="Input whose attention is drawn (default 21+211= if "
                                          "--max > 211, else 21+21=, or 1+1= below 22).")
    eval_limit: int | None = option(None, low=1)
    threads: int | None = option(1, low=1, high=MAX_THREADS, flag={"type": int},
                                 help="torch threads (1 is fastest at this size).")
    workers: int = option(1, low=1, location=True, help="Models trained at once, each in its own "
                                                        "one-thread process (same numbers).")

    def check(self) -> None:
        super().check()
        if any(c.name == "randomized" for c in self.pe):  # its positions are sampled while training
            raise ConfigError("pe (--pe): randomized is trained by pecli toy length and pecli train lm, "
                              "not toy arithmetic; give learned, sinusoidal, none, rope, alibi, t5 or p-rope")
        match = TOY_PROBE.fullmatch(self.probe) if self.probe is not None else None
        if self.probe is not None and not (match and all(int(g) < self.max_n for g in match.groups())):
            raise ConfigError(f"probe (--probe): {self.probe!r} must look like 'i+j=' or 'i-j=' "
                              f"with i, j < --max {self.max_n}")
