"""The options of `pecli passkey` (pecli.experiments.passkey)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pecli.positions.rope_scaling import RopeScaled
from pecli.runs import names
from pecli.runs.errors import ConfigError
from pecli.runs.fields import option
from pecli.runs.names import Choice
from pecli.runs.options import (
    CAUSAL_MODELS_HELP,
    Running,
    _model_names,
    _token_counts,
    interventions,
    models,
)


@dataclass(frozen=True)
class PasskeyOptions(Running, RopeScaled):
    """`pecli passkey` and the `passkey` experiment: a number hidden in filler, retrieved by
    greedy decoding, by prompt length and depth (pecli.measures.passkey)."""

    DEFAULTS_BEFORE: ClassVar[dict[str, str]] = {"draws": "fixed"}  # the default until 2026-12
    FLAGS: ClassVar[str] = ("model lengths depths trials draws rope_scaling rope_scaling_on "
                            "intervention batch_size seed "
                            "device dtype out force")

    model: tuple[str, ...] | str = models(("random:llama",), CAUSAL_MODELS_HELP)  # "a,b" or a list
    intervention: tuple[Choice, ...] = interventions(
        ("intact",),
        "intact (the model unchanged; default), zero, ...; the intact model "
        "always runs first")
    lengths: tuple[int, ...] | str = option((256, 512), help="Prompt lengths in tokens (special "
                                            "tokens included), e.g. 1024,4096,16384.")
    depths: tuple[float, ...] | str = option((0.0, 0.5, 1.0), help="Fractions of the filler before "
                                             "the key, e.g. 0,0.5,1 (default).")
    trials: int = option(5, low=1, high=10_000, flag={"type": int | None, "default": None, "min": 1},
                         help="Trials per (length, depth), each with its own seeded key (default 5).")
    draws: str = option(
        "independent", choices=("independent", "fixed"),
        help="What a trial draws besides its key: independent (default: its own depth within "
             "0.05, filler order and offset, so trials share only the template; Wilson "
             "intervals) or fixed (the same filler and depth in every trial of a cell, the "
             "remedies' grid's design; no interval, since the trials are not independent).")

    @property
    def independent(self) -> bool:
        """Whether every trial is its own draw (--draws independent), so that trials are
        independent units with intervals."""
        return self.draws == "independent"

    def check(self) -> None:
        super().check()
        object.__setattr__(self, "model", _model_names(self.model))
        object.__setattr__(self, "lengths", _token_counts(self.lengths, "prompt lengths"))
        depths = self.depths
        try:
            depths = [float(x) for x in (names.split_names(depths) if isinstance(depths, str) else depths)]
        except (TypeError, ValueError):
            depths = []
        if not depths or not all(0.0 <= d <= 1.0 for d in depths):
            raise ConfigError(f"depths (--depths): {self.depths!r}: give fractions of the filler "
                              "before the key, from 0 to 1, e.g. 0,0.5,1")
        object.__setattr__(self, "depths", tuple(dict.fromkeys(depths)))
