"""The options of `pecli train lm` (pecli.experiments.train_lm)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pecli.runs.errors import ConfigError
from pecli.runs.fields import option
from pecli.runs.options import DATA_DIR_HELP, Training, _token_counts


@dataclass(frozen=True)
class TrainLmOptions(Training):
    """`pecli train lm` and the `train-lm` experiment."""

    FLAGS: ClassVar[str] = ("pe steps tokenizer vocab layers width heads context batch limit "
                            "eval_limit eval_every seeds positions_removed threads workers model_out "
                            "test_lengths seed data_dir out force")

    tokenizer: str = option("bpe", choices=("bpe", "gpt2"), help="bpe (learned on IMDB train, saved "
                            "with the checkpoint) or gpt2 (50,257 rows).")
    vocab: int = option(4096, low=1, help="BPE vocabulary size (at least 300).")
    context: int = option(128, low=2, help="Tokens per training window (= positions).")
    limit: int | None = option(5000, low=1, help="IMDB train reviews (seeded, label-balanced subset).")
    eval_limit: int | None = option(400, low=1, help="IMDB test reviews scored.")
    eval_every: int = option(50, low=1, help="Steps between learning-curve points.")
    data_dir: str | None = option(None, location=True, help=DATA_DIR_HELP,
                                  flag={"type": Path | None, "envvar": "PECLI_DATA_DIR"})
    model_out: str | None = option(  # the checkpoint directory (one pe)
        None, location=True, flag={"type": Path | None},
        help="Save the checkpoint exactly here (one --pe), e.g. models/tiny-gpt2-imdb.")
    # "Train short, test long": after training, `pecli length` on the test reviews at these
    # window lengths (any multiple of `context`); () skips it
    test_lengths: tuple[int, ...] | str = option(
        (), help="Train short, test long: after training, pecli length on the test reviews at "
                 "these window lengths, e.g. 128,256,512,1024 (length.csv, figures/length.png).")
    seeds: int = option(3, low=1,  # training seeds per scheme: seed, seed + 1, ...
                        help="Training seeds per scheme (--seed, --seed + 1, ...): every perplexity "
                             "is their mean, its 95 % interval a two-level bootstrap over seeds and "
                             "test texts together (times and losses: a t interval over seeds).")
    # `pecli perplexity --intervention zero` on each checkpoint whose positions zero removes
    positions_removed: bool = option(True, help="pecli perplexity --intervention zero on each "
                                                "checkpoint with a position table or rotation "
                                                "(positions.csv).")

    def check(self) -> None:
        super().check()
        if self.test_lengths not in ((), ""):
            object.__setattr__(self, "test_lengths", _token_counts(self.test_lengths, "window lengths", "test_lengths"))
        if self.model_out is not None and (len(self.pe) != 1 or self.seeds != 1):
            raise ConfigError("model_out (--model-out) names one checkpoint directory: give "
                              "exactly one --pe and --seeds 1")
        if self.tokenizer == "bpe" and self.vocab < 300:
            raise ConfigError(f"vocab (--vocab): {self.vocab} is too small for a byte-level BPE; "
                              "use at least 300 (256 bytes + merges)")
