"""The options of `pecli pe recover` (pecli.experiments.recover)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pecli.runs.errors import ConfigError
from pecli.runs.fields import MAX_RESAMPLES, option
from pecli.runs.options import BOOTSTRAP_HELP, OnModels


@dataclass(frozen=True)
class RecoverOptions(OnModels):
    """`pecli pe recover` and the `pe-recover` experiment."""

    RENAMED: ClassVar[dict[str, str]] = {**OnModels.RENAMED, "n_boot": "bootstrap"}
    KEYED_AS: ClassVar[dict[str, str]] = {**OnModels.KEYED_AS, "bootstrap": "n_boot"}

    FLAGS: ClassVar[str] = ("models tokens dataset split limit max_length top_k folds bootstrap "
                            "n_boot text_field text device dtype seed data_dir batch_size "
                            "device_map max_memory out force")

    tokens: int = option(32, low=1, help="Tokens sampled from the real vocabulary, each put at "
                                         "every position.")
    limit: int | None = option(32, low=1, flag={"min": 1})
    max_length: int = option(128, low=2, help="Tokens kept per text for the hidden-state probe.")
    top_k: int = option(50, low=2, help="Classes of the hidden-state token probe: the K most "
                                        "frequent tokens.")
    bootstrap: int = option(1000, low=0, high=MAX_RESAMPLES, help=BOOTSTRAP_HELP)

    def check(self) -> None:
        super().check()
        if self.tokens < self.folds:  # the position probe's folds are over the sampled tokens
            raise ConfigError(f"tokens (--tokens): {self.tokens} is fewer than the {self.folds} "
                              f"folds; use --tokens {self.folds} or more")
