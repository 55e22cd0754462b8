"""The options of `pecli length` (pecli.experiments.length)."""

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
    MaskGrid,
    _model_names,
    _token_counts,
    interventions,
    models,
)

LENGTH_WINDOWS = ("nonoverlapping", "sliding", "band")


@dataclass(frozen=True)
class LengthOptions(MaskGrid, RopeScaled):
    """`pecli length` and the `length` experiment: loss by position and window length.

    The dataset's documents (a seeded `limit` of them, kept in source order) joined by the
    tokenizer's EOS make one token stream, cut into windows of each of `lengths` tokens.
    """

    FLAGS: ClassVar[str] = ("model lengths windows stride start_token rope_scaling rope_scaling_on "
                            "intervention "
                            "mask mask_semantics buckets dataset split text_field limit batch_size "
                            "bootstrap seed device dtype data_dir out force")

    model: tuple[str, ...] | str = models(("random:llama",), CAUSAL_MODELS_HELP)  # "a,b" or a list
    intervention: tuple[Choice, ...] = interventions(
        ("intact",),
        "intact (the model unchanged; default), zero, ..., crossed with --mask")
    dataset: str = "imdb"
    limit: int | None = option(64, low=1, flag={"default": None, "min": 1},
                               help="Documents in the stream: a seeded subset, kept in source "
                                    "order (default 64; fewer in the data: all).")
    lengths: tuple[int, ...] | str = option((128, 256, 512),
                                            help="Window lengths in tokens, e.g. 128,256,512.")
    windows: str = option(
        "nonoverlapping", choices=LENGTH_WINDOWS, flag={"default": None},
        help="nonoverlapping (default: full windows, the remainder dropped and counted), sliding "
             "(every token scored once with up to L-1 tokens of context; see --stride) or band "
             "(one pass, each token attending to its L-2 predecessors in every layer: "
             "sliding-window attention; docs/length.md).")
    stride: int | None = option(None, low=1, flag={"min": 1},
                                help="Step of --windows sliding (default 1).")
    start_token: bool = option(False, help="Begin every window with the tokenizer's start token "
                                           "(and score its first token).")
    buckets: int = option(8, low=1, flag={"default": None, "min": 1},  # equal widths
                          help="Position buckets per window (default 8).")

    def check(self) -> None:
        super().check()
        object.__setattr__(self, "model", _model_names(self.model))
        object.__setattr__(self, "lengths", _token_counts(self.lengths, "window lengths"))
        if self.protocol != (names.parse(names.PROTOCOLS, "relative"),):
            raise ConfigError("protocol (--protocol): length scores each window in one pass "
                              "(relative); drop --protocol")
        if self.buckets > min(self.lengths) // 2:  # each at least 2 positions: none empty
            raise ConfigError(f"buckets (--buckets): {self.buckets} position buckets do not fit a "
                              f"window of {min(self.lengths)} tokens (--lengths), whose position 0 "
                              f"is never a target; use at most {min(self.lengths) // 2}")
        body = min(self.lengths) - bool(self.start_token)  # stream tokens of the shortest window
        if self.stride is not None and self.stride > body:
            raise ConfigError(f"stride (--stride): {self.stride} is past the shortest window's "
                              f"{body} stream tokens (--lengths {min(self.lengths)}"
                              f"{', --start-token' if self.start_token else ''}); use at most {body}")
        if self.windows == "nonoverlapping" and self.stride is not None:
            raise ConfigError("stride (--stride) steps sliding windows; add --windows sliding "
                              "or drop --stride")
        if self.windows == "band" and self.start_token:
            raise ConfigError("start_token (--start-token): the band pass runs over the stream "
                              "in one pass, with no window starts to put it at; use --windows "
                              "sliding --start-token")
