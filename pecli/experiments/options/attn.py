"""The options of `pecli attn` (pecli.experiments.attn)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pecli.positions.rope_scaling import RopeScaled
from pecli.runs import names
from pecli.runs.errors import ConfigError
from pecli.runs.fields import option
from pecli.runs.names import Choice
from pecli.runs.options import MaskGrid, _model_names, interventions, models


@dataclass(frozen=True)
class AttnOptions(MaskGrid, RopeScaled):
    """`pecli attn` and the `attn` experiment: attention and hidden-state diagnostics
    (pecli.measures.attention) on the first `length` tokens of each text, under every
    condition (the intact model first)."""

    FLAGS: ClassVar[str] = ("model length join intervention mask mask_semantics rope_scaling epsilon "
                            "block buckets probe_positions hidden dataset split text_field limit "
                            "batch_size bootstrap seed device dtype data_dir out force")

    model: tuple[str, ...] | str = models(
        ("random:gpt2",), "One or more models, causal or encoder: smollm2, minilm, "
        "models/tiny-gpt2-imdb, random:<family> (pecli models), a checkpoint directory, a hub id.")
    intervention: tuple[Choice, ...] = interventions(
        (names.INTACT,),
        "intact (the unmodified model; default), zero, ..., crossed with --mask")
    dataset: str = "imdb"
    limit: int | None = option(32, low=2, flag={"default": None, "min": 2},
                               help="Texts of at least --length tokens, drawn in a seeded order "
                                    "(default 32).")
    length: int = option(  # Gu et al.'s 64
        64, low=2, flag={"type": int | None, "default": None, "min": 2},
        help="Tokens per text: the first T of each document, with the tokenizer's default special "
             "tokens (shorter documents are skipped and counted; default 64, Gu et al.'s).")
    join: bool = option(False, help="Cut windows of --length tokens from the documents joined by "
                                    "EOS (each wrapped in the tokenizer's special tokens), for "
                                    "lengths no document reaches.")
    epsilon: float = option(
        0.3, low=0.0, high=1.0, flag={"type": float | None, "default": None},
        help="Sink threshold: a head is a sink when its mean attention to the first token exceeds "
             "it (default 0.3, Gu et al.'s).")
    block: int = option(
        256, low=1, flag={"type": int | None, "default": None, "min": 1},
        help="Query rows whose attention is computed at once (default 256): memory grows with "
             "block x length per layer, never with the layers.")
    buckets: int | None = option(None, low=1, flag={"min": 1},  # default: 16, or one per position below 16
                                 help="Position buckets of the by-position tables (default 16; at "
                                      "most --length).")
    probe_positions: int | None = option(
        None, low=0, flag={"min": 0},
        help="Positions per text the position probe reads, evenly spaced (default 32 or --length "
             "if shorter; 0: no probe).")
    hidden: bool = option(True, help="Hidden-state diagnostics: norms by position, positional "
                                     "vectors, the probe.")

    def check(self) -> None:
        super().check()
        object.__setattr__(self, "model", _model_names(self.model))
        if self.protocol != (names.parse(names.PROTOCOLS, "relative"),):
            raise ConfigError("protocol (--protocol): attn runs every text in one pass "
                              "(relative); drop --protocol")
        if self.buckets is None:
            object.__setattr__(self, "buckets", min(16, self.length))
        if self.buckets > self.length:  # each bucket at least one position: none empty
            raise ConfigError(f"buckets (--buckets): {self.buckets} position buckets do not fit "
                              f"the {self.length} positions of --length; give at most {self.length}")
        if self.epsilon in (0.0, 1.0):  # a mean attention exceeds 0 always, 1 never
            raise ConfigError(f"epsilon (--epsilon): {self.epsilon:g} makes "
                              f"{'every' if self.epsilon == 0 else 'no'} head a sink; give a "
                              "threshold between 0 and 1 (Gu et al.: 0.3)")
        if self.probe_positions and self.probe_positions > self.length:
            raise ConfigError(f"probe_positions (--probe-positions) {self.probe_positions} is more "
                              f"than the {self.length} positions of --length")
