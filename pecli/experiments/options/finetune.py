"""The options of `pecli finetune` (pecli.experiments.finetune)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pecli.runs import names
from pecli.runs.fields import MAX_RESAMPLES, option
from pecli.runs.names import Choice
from pecli.runs.options import BOOTSTRAP_HELP, MAX_LR, MAX_STEPS, MIN_LR, MODEL_HELP, Running


@dataclass(frozen=True)
class FinetuneOptions(Running):
    """`pecli finetune` and the `finetune` experiment: a model trained after its positions are
    removed. An encoder learns IMDB sentiment (a linear head on its mean-pooled features); a
    causal LM relearns next-token prediction on IMDB train texts, its held-out perplexity
    measured as it trains. Which, the model's config decides."""

    FLAGS: ClassVar[str] = ("model intervention mask seeds train_limit limit max_length batch lr "
                            "head_lr epochs train_layers steps eval_every model_out bootstrap seed "
                            "device dtype data_dir out force")

    model: str = option("minilm", flag={"argument": "optional"}, help=MODEL_HELP)
    # default: encoder intact, zero, shuffle; causal LM intact (the control) and zero
    intervention: tuple[Choice, ...] | None = option(
        None, vocabulary=names.INTERVENTIONS, many=True, flag={"decls": ("--intervention",)},
        help="Conditions trained (repeat or a,b). Default: intact, zero, shuffle (encoder); "
             "intact (the control) and zero (causal LM).")
    mask: Choice | None = option(None, vocabulary=names.MASKS,
                                 help="Causal LM: also start from zero + this mask (a file of pecli "
                                      "mask fit, log-bias), held while training.")
    seeds: int = option(3, low=1, flag={"min": 1}, help="Training seeds: --seed, --seed + 1, ...")
    train_limit: int = option(512, low=4, flag={"min": 4}, help="IMDB train texts.")
    limit: int | None = option(None, low=4, flag={"min": 4}, help="IMDB test texts (default 400 for "
                               "an encoder, 48 for a causal LM).")
    max_length: int = option(128, low=2, flag={"min": 2}, help="Tokens per text.")
    batch: int | None = option(None, low=1, flag={"min": 1}, help="Texts per step (default 16 for "
                               "an encoder, 8 for a causal LM).")
    lr: float = option(1e-4, low=MIN_LR, high=MAX_LR, help="AdamW's learning rate for the model.")
    head_lr: float = option(1e-3, low=MIN_LR, high=MAX_LR, help="Encoder: the head's learning rate.")
    epochs: int = option(1, low=1, flag={"min": 1}, help="Encoder: passes over the train texts.")
    train_layers: int | None = option(None, low=1, flag={"min": 1},  # None: full fine-tuning
                                      help="Encoder: train only the last N layers and the head "
                                           "(default: every layer).")
    steps: int = option(60, low=1, high=MAX_STEPS, flag={"min": 1}, help="Causal LM: training steps.")
    eval_every: int = option(10, low=1, flag={"min": 1},
                             help="Causal LM: held-out perplexity every N steps.")
    bootstrap: int = option(1000, low=0, high=MAX_RESAMPLES, help=BOOTSTRAP_HELP)
    model_out: str | None = option(  # a checkpoint per condition (first seed)
        None, location=True, flag={"type": Path | None},
        help="Save the first seed's model of each condition as MODEL_OUT/<condition> (loadable by "
             "every pecli command; its revision is the weights' sha256).")
