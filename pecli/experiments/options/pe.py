"""The options of `pecli pe probe and pe sinusoidal` (pecli.experiments.pe)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pecli.runs import names
from pecli.runs.errors import ConfigError
from pecli.runs.fields import Options, option
from pecli.runs.names import Choice
from pecli.runs.options import SEED_MAX, OnModels


@dataclass(frozen=True)
class ProbeOptions(OnModels):
    """`pecli pe probe` and the `pe-probe` experiment."""

    RENAMED: ClassVar[dict[str, str]] = {**OnModels.RENAMED, "interventions": "intervention"}
    KEYED_AS: ClassVar[dict[str, str]] = {**OnModels.KEYED_AS, "intervention": "interventions"}

    FLAGS: ClassVar[str] = ("models dataset split limit max_length folds pairs intervention "
                            "text_field text device dtype seed data_dir batch_size device_map "
                            "max_memory out force")

    pairs: int = option(1000, low=1, help="Training pairs per fold of the order classifier.")
    intervention: tuple[Choice, ...] = option(
        ("intact", "zero"), vocabulary=names.INTERVENTIONS, many=True,
        flag={"decls": ("--intervention",)},
        help="Conditions of the hidden-state probe, repeatable (default: intact and zero).")


MAX_ROWS = 2048 * (2048 + 512)  # pe sinusoidal's tables: positions^2 dot products, positions x dim values


@dataclass(frozen=True)
class SinusoidOptions(Options):
    """`pecli pe sinusoidal` and the `pe-sinusoidal` experiment."""

    FLAGS: ClassVar[str] = "positions dim base out force"

    positions: int = option(16, low=1, help="Positions 0..N-1 to encode (positions x (positions + dim) "
                                             "at most 2,048 x 2,560: the tables' rows).")
    dim: int = option(32, low=2, help="Width of the encoding (even: (sin, cos) pairs).")
    base: float = option(10000.0, help="Wavelength base (> 1): pair i turns at base^(-2i/dim).")
    seed: int = option(0, low=0, high=SEED_MAX)  # changes nothing (deterministic); recorded

    def check(self) -> None:
        if self.dim % 2:
            raise ConfigError(f"dim (--dim): {self.dim} is odd; dimensions come in (sin, cos) "
                              "pairs, use an even width")
        if not self.base > 1:
            raise ConfigError(f"base (--base): {self.base:g} must be greater than 1; the usual "
                              "value is 10000")
        rows = self.positions * (self.positions + self.dim)
        if rows > MAX_ROWS:  # 4,096 x 512 would take some 15 GB and 20 minutes
            raise ConfigError(f"positions (--positions): {self.positions:,} x {self.dim:,} would write "
                              f"{rows:,} rows (a dot product per pair of positions, a value per "
                              f"coordinate); give at most {MAX_ROWS:,}, e.g. --positions 2048 --dim 512 "
                              "(about 4 GB of memory and 5 minutes on 2 cores)")
