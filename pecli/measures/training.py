"""Small Transformers trained from scratch with a chosen position scheme.

Schemes (`SCHEMES`, the names of pecli.runs.names.PE_SCHEMES), each a stock transformers architecture so checkpoints save in the
Hugging Face format and load through `pecli.models.loading.load_model(<dir>)`:
- `learned`: GPT-2, trained `wpe`.
- `sinusoidal`: GPT-2 whose `wpe` holds the Vaswani et al. sinusoid (scaled to the token
  embeddings' initial RMS; `config.pecli_sinusoid_scale`), frozen.
- `none`: GPT-2 whose `wpe` is zero, frozen (NoPE: only the causal mask tells order).
- `rope`: Llama (rotary embeddings in every attention).
- `alibi`: GPT-2 with zero frozen `wpe` and the attention function `ALIBI_ATTENTION`
  (pecli.models.trained, registered through `transformers.AttentionInterface`; the `alibi`
  mask shape under log-bias semantics adds -slope_h * (q - k) to the logits). The name
  is written into config.json, so a reload uses it again once it is registered
  (pecli.models.trained registers it on import, and pecli.models.loading imports that module
  before loading any checkpoint pecli trained); loading an alibi checkpoint in a process that
  has not registered it fails loudly in transformers rather than silently running without
  positions.
- `t5`: GPT-2 with zero frozen `wpe` and the attention function `T5_ATTENTION`: T5's
  relative bias (Raffel et al. 2020), a learned scalar per head and distance bucket added to
  the logits, buckets from transformers' own `T5Attention._relative_position_bucket`
  (unidirectional, 32 buckets, exact up to distance 15, log-spaced to 128). T5 shares one
  table across layers; here each layer has its own (`attn.relative_bias`, an Embedding of
  [buckets, heads]). GPT-2 does not build that module, so `after_load` (pecli.models.trained)
  attaches it and reads its weights when pecli loads such a checkpoint.
- `randomized`: `rope` trained at randomised positions (Ruoss et al. 2023): each training
  sequence of t tokens gets t distinct positions drawn from [0, size.positions) and sorted
  (`random_position_ids`), so every position of the range, and long distances, are seen
  while training on short sequences. Evaluation draws positions the same way (seeded).
- `p-rope`: Llama whose rotary embedding turns only the highest 3/4 of the frequencies,
  the lowest quarter set to zero (Barbero et al. 2024's 0.75-RoPE; transformers' own
  `proportional` rope type with partial_rotary_factor 0.75, so it reloads from config.json).
Every checkpoint records its scheme in `config.pecli_position`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pecli.models.architectures import ARCHITECTURES, position_embedding
from pecli.models.trained import (  # noqa: F401  (the attention of alibi/t5 checkpoints, as before)
    ALIBI_ATTENTION,
    ATTENTION,
    T5_ATTENTION,
    T5_BUCKETS,
    T5_MAX_DISTANCE,
    after_load,
    attach_relative_bias,
    t5_bias_attention,
    t5_buckets,
)
from pecli.positions.sinusoid import sinusoidal_at
from pecli.runs import names
from pecli.runs.errors import ConfigError

# The architecture of each position encoding a model is trained with (the names of
# pecli.runs.names.PE_SCHEMES, checked when a toy / train-lm options object is built).
FAMILY = {"learned": "gpt2", "sinusoidal": "gpt2", "none": "gpt2", "rope": "llama", "alibi": "gpt2",
          "t5": "gpt2", "randomized": "llama", "p-rope": "llama"}
ROTARY = {"rope": 1.0, "randomized": 1.0, "p-rope": 0.75}  # fraction of frequencies turned
SCHEMES = tuple(name for name, _ in names.PE_SCHEMES.items())
assert set(FAMILY) == set(SCHEMES), "every position encoding needs an architecture, and no more"


@dataclass(frozen=True)
class ModelSize:
    layers: int
    width: int
    heads: int
    positions: int  # longest sequence (rows of wpe; RoPE/ALiBi models accept it too)


# --- position tables and ALiBi ---------------------------------------------------------


def sinusoid_table(n_positions: int, dim: int) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...): [n_positions, dim]
    float32, pecli.positions.sinusoid's one sinusoid."""
    return torch.from_numpy(sinusoidal_at(np.arange(n_positions), dim)).float()


def random_position_ids(batch: int, length: int, positions: int,
                        generator: torch.Generator) -> torch.Tensor:
    """Ruoss et al.'s positions: per row, `length` distinct positions of [0, positions),
    sorted. [batch, length] int64."""
    if length > positions:
        raise ConfigError(f"{length} tokens need at least {length} positions (have {positions})")
    draws = torch.rand(batch, positions, generator=generator).argsort(-1)[:, :length]
    return draws.sort(-1).values


def with_random_positions(batches: Iterator[dict], positions: int, seed: int) -> Iterator[dict]:
    """`batches` with Ruoss et al.'s `position_ids` added (the `randomized` scheme)."""
    generator = torch.Generator().manual_seed(seed)
    for batch in batches:
        b, t = batch["input_ids"].shape
        yield {**batch, "position_ids": random_position_ids(b, t, positions, generator)}


@torch.inference_mode()
def greedy_tokens(model, ids: torch.Tensor, steps: int, *, position_ids: torch.Tensor | None = None,
                  eos: int | None = None) -> torch.Tensor:
    """Greedy continuation of prompts of one length, `ids` [n, t], with the KV cache: one
    forward over the prompts, then one per new token over that token alone. At most `steps`
    new tokens [n, <= steps], fewer once every row has written `eos` (when given).
    `position_ids` [n, >= t + steps - 1]: the positions of every token (the `randomized`
    scheme); otherwise the model counts them (0, 1, ...)."""
    n, t = ids.shape
    at = (lambda a, b: {}) if position_ids is None else (lambda a, b: {"position_ids": position_ids[:, a:b]})
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, **at(0, t))
    new, ended = [], torch.zeros(n, dtype=torch.bool)
    for step in range(steps):
        token = out.logits[:, -1].argmax(-1)  # [n]
        new.append(token)
        if eos is not None:
            ended |= token == eos
        if step == steps - 1 or bool(ended.all()):
            break
        seen = t + step + 1  # tokens the cache and this one hold
        out = model(input_ids=token[:, None], attention_mask=ids.new_ones(n, seen),
                    past_key_values=out.past_key_values, use_cache=True, **at(seen - 1, seen))
    return torch.stack(new, dim=1) if new else ids.new_zeros(n, 0)


# --- models ---------------------------------------------------------------------------


def model_for(scheme: str, tokenizer, size: ModelSize, seed: int = 0):
    """`build_model` for a tokenizer: its vocabulary and its pad, start and end ids."""
    return build_model(scheme, len(tokenizer), size, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       seed=seed)


def build_model(scheme: str, vocab_size: int, size: ModelSize, *, pad_token_id: int,
                bos_token_id: int, eos_token_id: int, seed: int = 0):
    """A freshly initialised causal LM of `scheme` (see the module docstring), seeded."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    scheme = names.parse(names.PE_SCHEMES, str(scheme)).name  # a Choice or its name
    ids = dict(vocab_size=vocab_size, pad_token_id=pad_token_id, bos_token_id=bos_token_id,
               eos_token_id=eos_token_id, tie_word_embeddings=True)
    if scheme in ROTARY:
        rope = {"rope_type": "default", "rope_theta": 10000.0}
        if ROTARY[scheme] < 1:
            rope = {**rope, "rope_type": "proportional", "partial_rotary_factor": ROTARY[scheme]}
        config = LlamaConfig(
            hidden_size=size.width, num_hidden_layers=size.layers,
            num_attention_heads=size.heads, num_key_value_heads=size.heads,
            # Llama's MLP has three matrices: 8d/3 keeps the parameter count of GPT-2's 4d.
            intermediate_size=int(8 * size.width / 3), max_position_embeddings=size.positions,
            rope_parameters=rope, **ids)
    else:
        config = GPT2Config(n_embd=size.width, n_layer=size.layers, n_head=size.heads,
                            n_positions=size.positions, resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, **ids)
    config.pecli_position = scheme
    torch.manual_seed(seed)
    kwargs = {"attn_implementation": ATTENTION[scheme]} if scheme in ATTENTION else {}
    model = AutoModelForCausalLM.from_config(config, **kwargs)
    if scheme == "t5":
        attach_relative_bias(model)
    model.loss_type = "ForCausalLM"  # GPT2LMHeadModel's name does not tell transformers; same loss
    set_positions(model, scheme)
    return model


def set_positions(model, scheme: str) -> None:
    """Fill and freeze the position table of the fixed-table schemes; leave the others."""
    spec = ARCHITECTURES.get(FAMILY[scheme])
    if scheme == "learned" or scheme in ROTARY:
        return
    wpe = position_embedding(model, spec)
    with torch.no_grad():
        if scheme == "sinusoidal":
            # Scaled to entry RMS = the token embeddings' init std (the learned wpe's too): the
            # magnitude ratio of Vaswani et al., whose embeddings are multiplied by sqrt(d).
            # Unscaled (RMS 0.71 against 0.02) it drowns the tokens after the first LayerNorm:
            # measured, 17% toy exact match and worse-than-unigram IMDB perplexity.
            scale = model.config.initializer_range * math.sqrt(2)
            model.config.pecli_sinusoid_scale = scale
            wpe.weight.copy_(sinusoid_table(*wpe.weight.shape) * scale)
        else:  # none, alibi, t5: no absolute positions at all
            wpe.weight.zero_()
    wpe.weight.requires_grad_(False)


def scheme_of(model) -> str:
    return getattr(model.config, "pecli_position", "learned")


def count_parameters(model) -> int:
    """Distinct parameters (tied embeddings counted once), trainable or frozen."""
    return sum(p.numel() for p in model.parameters())


def save_checkpoint(model, tokenizer, out_dir: Path, card: dict | None = None) -> Path:
    """save_pretrained + tokenizer; the ALiBi attention name goes into config.json."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # pecli shows its own progress
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if scheme_of(model) in ATTENTION:
        # transformers does not serialise attn_implementation; PretrainedConfig reads it back.
        path = out_dir / "config.json"
        config = json.loads(path.read_text(encoding="utf-8"))
        config["attn_implementation"] = ATTENTION[scheme_of(model)]
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if card:
        (out_dir / "pecli_training.json").write_text(json.dumps(card, indent=2, default=str) + "\n",
                                                     encoding="utf-8")
    from pecli.runs.io import follow_umask

    follow_umask(out_dir)  # safetensors writes 0600; checkpoints are shared like tables
    return out_dir


def saved_as(model, tokenizer, out_dir: Path, card: dict) -> tuple[str, str]:
    """`save_checkpoint`, then the (model_id, model_revision) rows give the saved model: its
    portable path and the sha256 of its weights."""
    from pecli.models.loading import weights_sha256
    from pecli.runs.provenance import portable_model_id

    path = save_checkpoint(model, tokenizer, out_dir, card=card)
    return portable_model_id(path), weights_sha256(path)


# --- intervals over training seeds ----------------------------------------------------------

SEED_METHOD = "95 % Student t interval of the mean over training seeds"
OVER_SEEDS = "mean over training seeds"


def seed_interval(values) -> tuple[float, float]:
    """95 % Student t interval of the mean over training seeds (intervals.t_interval: NaN with
    fewer than 2 seeds or seeds that all agree)."""
    from pecli.measures.intervals import t_interval

    return t_interval(values)


def items_right(row) -> np.ndarray | None:
    """A per-seed exact-match row's 0/1 per test item, in the items' order (its `items_right`,
    a string of 0s and 1s); None for any other row, or one from before they were kept."""
    right = row.get("items_right")
    if row["metric"] != "exact_match" or not isinstance(right, str):  # a table from before they were kept
        return None
    if len(right) != int(row["rows"]):
        raise ValueError(f"items_right has {len(right)} items, the row {row['rows']}")
    return np.array([c == "1" for c in right], np.float64)


def over_seeds(by_seed, keys: list[str], texts_of=None, same_texts: bool = False,
               transform=None, weights_of=None):
    """One row per `keys` group of a per-seed table: the mean over its training seeds with
    `seed_interval` (ci_low, ci_high), `seeds` the count, their revisions joined. Where
    `texts_of(row)` gives a row's per-text (per-item) values, the interval resamples seeds and
    texts together (intervals.seeds_and_texts_interval); `same_texts`: every seed was scored
    on the same texts in the same order (crossed, not nested); `transform` maps each seed's
    mean over texts before the mean over seeds (exp: a corpus perplexity from mean NLLs);
    `weights_of(row)` weighs the texts in that mean (their token counts)."""
    import pandas as pd

    from pecli.measures.intervals import (
        DIFF_COLUMNS,
        SEEDS_AND_TEXTS,
        SEEDS_CROSSED_TEXTS,
        seeds_and_texts_interval,
    )

    out = []
    for _, group in by_seed.groupby(keys, sort=False, dropna=False):
        texts = [texts_of(r) for _, r in group.iterrows()] if texts_of else [None]
        if all(t is not None for t in texts):
            weights = [weights_of(r) for _, r in group.iterrows()] if weights_of else None
            (low, high) = seeds_and_texts_interval(texts, same_texts=same_texts, transform=transform,
                                                   weights=weights)
            method = SEEDS_CROSSED_TEXTS if same_texts else SEEDS_AND_TEXTS
        else:
            (low, high), method = seed_interval(group["value"]), SEED_METHOD
        row = group.iloc[0].to_dict()
        for col in ("perplexity", "nll_mean"):  # per-seed statistics: their mean, never seed 0's
            if col in group:
                row[col] = float(group[col].mean()) if col == "nll_mean" else float(group["value"].mean())
        for col in DIFF_COLUMNS:  # seed 0's paired difference is not the mean's (a caller pairs over seeds)
            if col in row:
                row[col] = float("nan")
        row.update(value=float(group["value"].mean()), ci_low=low, ci_high=high,
                   interval=method if low == low else "", seeds=int(group["seed"].nunique()),
                   seed=int(group["seed"].min()), seed_list=",".join(map(str, group["seed"])),
                   model_revision=",".join(map(str, group["model_revision"])),
                   aggregation=OVER_SEEDS)
        out.append(row)
    return pd.DataFrame(out)


# --- the loop -------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.01
    clip: float = 1.0


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, frac))))


def train(model, batches: Iterator[dict], cfg: TrainConfig,
          on_step: Callable[[int, float], None] | None = None) -> dict:
    """AdamW on the trainable parameters for `cfg.steps` batches of model inputs with labels.

    Returns {"losses": [per step], "seconds": wall time, "tokens": input tokens seen}.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr,
                            betas=(0.9, 0.95))
    model.train()
    losses: list[float] = []
    tokens = 0
    start = time.perf_counter()
    for step in range(cfg.steps):
        batch = next(batches)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        opt.step()
        losses.append(loss.item())
        tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch \
            else batch["input_ids"].numel()
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return {"losses": losses, "seconds": time.perf_counter() - start, "tokens": tokens}


def _one_thread() -> None:
    """A worker's start: one torch thread, and SIGTERM/SIGHUP back to their defaults (the
    pool ends its workers with SIGTERM; the parent's handler would print a traceback)."""
    import signal

    torch.set_num_threads(1)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def run_jobs(fn: Callable, jobs: list[tuple], workers: int = 1) -> list:
    """[fn(*job) for job in jobs], in `workers` forked processes of one torch thread each
    when workers > 1 (the order of `jobs` kept). Each job seeds its own model and data, so
    the results do not depend on which process ran it."""
    if workers <= 1 or len(jobs) <= 1:
        return [fn(*job) for job in jobs]
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(min(workers, len(jobs)), _one_thread) as pool:
        return pool.starmap(fn, jobs, chunksize=1)


@contextmanager
def torch_threads(n: int | None):
    """Use `n` torch threads inside the block (None: leave as is); restore afterwards."""
    before = torch.get_num_threads()
    if n is not None:
        if n < 1:
            raise ConfigError(f"--threads must be at least 1 (got {n})")
        torch.set_num_threads(n)
    try:
        yield before if n is None else n
    finally:
        torch.set_num_threads(before)


# --- the toy tasks' character-level tokenizer (toy, toy length) ------------------------------

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = "0123456789+-="


def char_tokenizer():
    """A character-level HF tokenizer (saved with each checkpoint): specials, digits, + - =."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate([*SPECIALS, *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>")
