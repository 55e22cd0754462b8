"""The options of `pecli perplexity` (pecli.experiments.perplexity)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pecli.runs import names
from pecli.runs.errors import ConfigError
from pecli.runs.fields import option
from pecli.runs.names import Choice
from pecli.runs.options import MaskGrid, interventions


@dataclass(frozen=True)
class PerplexityOptions(MaskGrid):
    """`pecli perplexity` and the `perplexity` experiment (study E2, E3).

    intervention None is the study's E2/E3 grid (see experiments.perplexity.conditions).
    """

    RENAMED: ClassVar[dict[str, str]] = {**MaskGrid.RENAMED, "add_start_token": "start_token"}
    KEYED_AS: ClassVar[dict[str, str]] = {**MaskGrid.KEYED_AS, "start_token": "add_start_token"}

    FLAGS: ClassVar[str] = ("model intervention pe mask mask_semantics protocol dataset split "
                            "text_field text limit start_token long_text stride batch_size "
                            "bootstrap seed device dtype device_map max_memory data_dir out force")

    intervention: tuple[Choice, ...] | None = interventions(
        None,
        "intact (the model unchanged), zero, ..., crossed with --mask. "
        "Default: the study's E2/E3: intact, and with a --mask shape also "
        "zero + default and zero + that shape")
    dataset: str = option("truthfulqa", help="truthfulqa, imdb, or a CSV/JSONL/parquet file.")
    start_token: bool = option(True, help="Prepend the tokenizer's start token and score the first "
                                          "token too (evaluate's add_start_token).")
    long_text: Choice = option("truncate", vocabulary=names.LONG_TEXT,
                               help="Texts longer than the model's positions: truncate, or window "
                                    "(sliding, see --stride).")
    stride: int | None = option(None, low=1, flag={"min": 1}, help="Window step for --long-text "
                                "window (default: half the positions).")
    padding_side: str = option("right", choices=("left", "right"))

    def check(self) -> None:
        super().check()
        if self.stride is not None and self.long_text.name != "window":
            raise ConfigError("stride (--stride) steps the windows of long_text: window; "
                              "add --long-text window or drop --stride")
