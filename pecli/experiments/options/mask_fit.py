"""The options of `pecli mask fit` (pecli.experiments.mask_fit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pecli.runs import names
from pecli.runs.errors import ConfigError
from pecli.runs.fields import MAX_RESAMPLES, option
from pecli.runs.names import Choice
from pecli.runs.options import BOOTSTRAP_HELP, MAX_STEPS, MIN_LR, MODEL_HELP, Running


@dataclass(frozen=True)
class MaskFitOptions(Running):
    """`pecli mask fit` and the `mask-fit` experiment: a mask of a small form fitted, with the
    model frozen and its positions removed, on IMDB train texts; judged on held-out texts."""

    FLAGS: ClassVar[str] = ("model form intervention train_limit steps batch lr max_length limit "
                            "eval_data bootstrap seed device dtype data_dir out force")

    model: str = option("models/tiny-gpt2-imdb", flag={"argument": "optional"}, help=MODEL_HELP)
    form: Choice = option(
        "bucket", vocabulary=names.MASK_FORMS,
        help="bucket (a bias per distance bucket, shared by heads), bucket-head (per head), slope "
             "(ALiBi's form: a slope per head), linear (the study's shape, its oldest weight "
             "fitted per head).")
    intervention: Choice = option("zero", vocabulary=names.INTERVENTIONS,
                                  help="How positions are removed while fitting and judging.")
    train_limit: int = option(256, low=2, flag={"min": 2},
                              help="IMDB train texts the mask is fitted on.")
    steps: int = option(40, low=1, high=MAX_STEPS, flag={"min": 1}, help="Adam steps.")
    batch: int = option(8, low=1, flag={"min": 1}, help="Texts per step.")
    lr: float = option(0.1, low=MIN_LR, high=10.0,
                       help="Adam's learning rate (a mask value moves by about lr per step).")
    max_length: int = option(128, low=2, flag={"min": 2},
                             help="Tokens per text, start token included (fit and evaluation; at "
                                  "most the model's positions).")
    limit: int = option(48, low=2, flag={"min": 2}, help="Held-out texts per evaluation set (seeded).")
    eval_data: tuple[str, ...] | str = option(
        ("imdb:test", "truthfulqa"), flag={"type": list[str] | None, "decls": ("--eval-data",)},
        help="Held-out sets, dataset[:split] (repeat or a,b). Default: imdb:test and truthfulqa.")
    bootstrap: int = option(1000, low=0, high=MAX_RESAMPLES, help=BOOTSTRAP_HELP)
    save_dir: str | None = option(None, location=True)  # where mask.json is written

    def check(self) -> None:
        super().check()
        items = tuple(names.split_names(self.eval_data))
        if not items:
            raise ConfigError("eval_data (--eval-data): give at least one dataset[:split], e.g. imdb:test")
        if any(i.partition(":")[0] == "imdb" and i.partition(":")[2] in ("", "train") for i in items):
            raise ConfigError("eval_data (--eval-data): the mask is fitted on IMDB train texts; "
                              "judge it on held-out texts (imdb:test, truthfulqa)")
        object.__setattr__(self, "eval_data", items)
        if self.intervention.name == names.INTACT:
            raise ConfigError("intervention (--intervention): a mask stands in for positions "
                              "that were removed; give zero (or another intervention)")
