"""The options of `pecli ablate` (pecli.experiments.ablate)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pecli.runs import names
from pecli.runs.errors import ConfigError
from pecli.runs.fields import option
from pecli.runs.names import Choice
from pecli.runs.options import OnData, interventions


@dataclass(frozen=True)
class AblateOptions(OnData):
    """`pecli ablate` and the `ablate` experiment (study E1, E2's cosine)."""

    RENAMED: ClassVar[dict[str, str]] = {"interventions": "intervention", "pe": "intervention",
                                         "text": "text_field"}
    KEYED_AS: ClassVar[dict[str, str]] = {"intervention": "interventions"}
    DEFAULT_LIMIT: ClassVar[int] = 48  # `pecli ablate minilm` in about a minute on 2 CPU cores

    FLAGS: ClassVar[str] = ("model intervention pe dataset split text_field text limit probe layers "
                            "baseline_pairs batch_size bootstrap seed device dtype device_map "
                            "max_memory data_dir out force")

    intervention: tuple[Choice, ...] = interventions(
        ("zero",),
        "compared with the model's own positions: zero (default), shuffle, "
        "reverse, shift:K, sinusoidal, random, swap:MODEL")
    limit: int | None = option(
        DEFAULT_LIMIT, low=1, flag={"default": None, "show_default": False},
        help=f"Seeded random subset of N rows (stratified by label where there is one). Default: "
             f"{DEFAULT_LIMIT}, or every row of smaller data.")
    limit_at_most: bool = False  # a limit beyond the data's rows takes every row (the CLI default)
    layers: bool = option(True, help="Measure every layer (else the final one only).")
    probe: bool = option(False, help="Also fit a logistic-regression probe on mean-pooled final "
                                     "features (labelled data, e.g. imdb) with and without the "
                                     "intervention; report held-out accuracy.")
    baseline_pairs: int = option(10_000, low=2, help="Random pairs of standard-normal vectors for "
                                                     "the chance baseline.")

    def check(self) -> None:
        super().check()
        if any(c.name == names.INTACT for c in self.intervention):
            raise ConfigError("intervention: `intact` is the baseline every intervention "
                              "is compared with; pass another (zero, shuffle, ...)")
