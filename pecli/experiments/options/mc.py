"""The options of `pecli mc` (pecli.experiments.mc)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pecli.runs.errors import ConfigError
from pecli.runs.fields import MAX_RESAMPLES, option
from pecli.runs.names import Choice
from pecli.runs.options import MaskGrid, interventions


@dataclass(frozen=True)
class McOptions(MaskGrid):
    """`pecli mc` and the `mc` experiment (TruthfulQA multiple choice)."""

    FLAGS: ClassVar[str] = ("model intervention pe mask mask_semantics protocol dataset limit "
                            "bootstrap batch_size seed device dtype data_dir out force")

    intervention: tuple[Choice, ...] = interventions(
        ("intact",),
        "intact (the model unchanged; default), zero, ..., crossed with --mask")
    dataset: str = option("truthfulqa-mc", help="truthfulqa-mc, or a JSON list / JSONL file of items "
                          "with question, mc1_targets, mc2_targets ({choice: label} or "
                          "{\"choices\": [...], \"labels\": [...]}).")
    bootstrap: int = option(1000, low=0, high=MAX_RESAMPLES,
                            help="Bootstrap resamples over items for the 95 % intervals (0: off).")

    def check(self) -> None:
        super().check()
        if self.split is not None or self.text_field is not None:
            raise ConfigError("split and text_field do not apply to mc: an item is its question "
                              "and choices (see --dataset); drop them")
