"""The options of `pecli lm-eval` (pecli.integrations.lm_eval)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pecli.positions.rope_scaling import RopeScaled
from pecli.runs import names
from pecli.runs.errors import ConfigError
from pecli.runs.fields import MAX_RESAMPLES, option
from pecli.runs.names import Choice
from pecli.runs.options import SEED_MAX, Masked, Running, interventions


@dataclass(frozen=True)
class LmEvalOptions(Running, RopeScaled, Masked):
    """`pecli lm-eval` and the lm-eval model `pecli` (pecli.integrations.lm_eval): the tasks of
    lm-evaluation-harness, scored by lm-eval itself, under each condition of pecli's grid."""

    # lm-eval's spellings; model, model_args and seed come from the command's --model_args and --seed
    FLAGS: ClassVar[str] = ("model_args tasks num_fewshot limit include_path batch_size metadata "
                            "output_path intervention mask mask_semantics protocol rope_scaling "
                            "bootstrap log_samples apply_chat_template fewshot_as_multiturn "
                            "system_instruction gen_kwargs predict_only seed device dtype data_dir "
                            "out force")

    model: str = "random:gpt2"  # lm-eval's model_args pretrained=
    intervention: tuple[Choice, ...] = interventions(
        ("intact",),
        "intact (the model unchanged; default), zero, ..., crossed with "
        "--mask and --rope-scaling")
    tasks: tuple[str, ...] | str = option(
        (), flag={"type": str, "default": "", "decls": ("--tasks",)},
        help="lm-eval task names, a,b (with --include_path: your own task YAMLs).")
    num_fewshot: int | None = option(None, low=0, flag={"decls": ("--num_fewshot",), "min": 0},
                                     help="Few-shot examples before each document (lm-eval's "
                                          "--num_fewshot; default: each task's own).")
    limit: int | None = option(None, low=1, flag={"decls": ("--limit",), "min": 1},
                               help="The first N documents of each task (lm-eval's --limit).")
    include_path: str | None = option(
        None, location=True, flag={"type": Path | None, "decls": ("--include_path",)},
        help="A folder of task YAMLs (configs/lm_eval: TruthfulQA MC1/MC2 on the local data "
             "directory).")
    batch_size: int | None = option(
        None, low=1, flag={"type": int, "default": 8, "min": 1, "decls": ("--batch_size",)},
        help="Requests per forward pass (lm-eval's --batch_size; it pads a batch on the left).")
    model_args: str = ""  # what else lm-eval's HFLM takes (max_length=..., ...)
    metadata: str = option(  # JSON for the tasks (lm-eval's --metadata), e.g. passkey's sizes
        "", flag={"decls": ("--metadata",)},
        help="JSON for the tasks (lm-eval's --metadata), e.g. passkey's sizes: '{\"passkey_lengths\": "
             "[1024, 4096], \"passkey_trials\": 5}'.")
    bootstrap: int = option(1000, low=0, high=MAX_RESAMPLES,
                            help="Resamples of the 95 % intervals over documents (and lm-eval's "
                                 "bootstrap_iters): 0 (none) or 100 to 100000.")
    save_dir: str | None = option(None, location=True)  # lm-eval's results JSON per condition
    # lm-eval's own options, as its command line takes them (pecli.integrations.lm_eval.run)
    log_samples: bool = option(
        False, flag={"decls": ("--log_samples", "-s")},
        help="Also write each document's samples JSONL beside lm-eval's results, as lm-eval does "
             "(pecli reads them either way: its intervals and paired differences are over documents).")
    apply_chat_template: bool = option(
        False, flag={"decls": ("--apply_chat_template",)},
        help="Format every prompt with the tokenizer's chat template, as lm-eval does (its SHA-256 "
             "in every row; a named template of a dict is not supported).")
    fewshot_as_multiturn: bool | None = option(  # None: as apply_chat_template (lm-eval's default)
        None, flag={"decls": ("--fewshot_as_multiturn/--no_fewshot_as_multiturn",)},
        help="Few-shot examples as chat turns (lm-eval's; default: on with --apply_chat_template, "
             "which it needs).")
    system_instruction: str | None = option(
        None, flag={"decls": ("--system_instruction",)},
        help="A system instruction before every prompt (lm-eval's).")
    gen_kwargs: str = option(
        "", flag={"decls": ("--gen_kwargs",)},
        help="Generation arguments of generate_until tasks, as lm-eval reads them: key=value,... "
             "e.g. temperature=0,max_gen_toks=64.")
    # lm-eval's four seeds (python, numpy, torch, few-shot; null leaves one unset): its default
    lm_eval_seed: tuple[int | None, ...] = (0, 1234, 1234, 1234)

    def check(self) -> None:
        super().check()
        object.__setattr__(self, "tasks", tuple(names.split_names(self.tasks)))
        if self.fewshot_as_multiturn is None:
            object.__setattr__(self, "fewshot_as_multiturn", self.apply_chat_template)
        elif self.fewshot_as_multiturn and not self.apply_chat_template:
            raise ConfigError("fewshot_as_multiturn (--fewshot_as_multiturn): few-shot examples "
                              "become chat turns only under a chat template; add "
                              "--apply_chat_template (as lm-eval requires)")
        seeds = self.lm_eval_seed
        if len(seeds) != 4 or any(s is not None and not 0 <= s <= SEED_MAX for s in seeds):
            raise ConfigError(f"lm_eval_seed (--seed): {list(seeds)} is not four seeds (python, "
                              "numpy, torch, few-shot), each 0 to 2^32 - 1 or null")
        try:
            meta = json.loads(self.metadata) if self.metadata else {}
        except ValueError:
            meta = None
        if not isinstance(meta, dict):
            raise ConfigError(f"metadata (--metadata): {self.metadata!r} is not a JSON object, "
                              "e.g. '{\"passkey_lengths\": [1024, 4096]}'")
        if self.protocol != (names.parse(names.PROTOCOLS, "relative"),):
            raise ConfigError("protocol (--protocol): lm-eval scores each request in one pass, "
                              "where every query weighs its own prefix (relative); drop --protocol")
