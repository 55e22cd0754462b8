"""Passkey retrieval (Mohtashami & Jaggi 2023, as YaRN's evaluation uses it): a number hidden
at a chosen depth of filler text, asked for at the end, read from greedy decoding.

A prompt is the template's five lines joined by newlines; its filler is cut (in characters)
so that the tokenized prompt is as long as asked, the tokenizer's own special tokens
included. Trials whose prompts have the same token count share a batch, so no padding ever
enters a prompt, and decoding uses the KV cache (transformers' `generate`, greedy).
`accuracy` summarises the trials: Wilson intervals over independent trials, and each
condition's difference from intact with Newcombe's paired interval.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from pecli.runs import parallel
from pecli.runs.loop import run_batches

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
         "memorize them. I will quiz you about the important information there.")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY = "The pass key is {k}. Remember it. {k} is the pass key."
QUESTION = "What is the pass key? The pass key is"
KEYS = (1, 50000)  # k is drawn uniformly from this closed range
NEW_TOKENS = 10  # greedy decoding stops after at most this many tokens


SENTENCES = tuple(s if s.endswith(".") else s + "." for s in FILLER.split(". "))
JITTER = 0.05  # a trial's depth is drawn uniformly within this of its cell's, inside [0, 1]


def prompt(k: int, filler_chars: int, depth: float, filler: str = FILLER, offset: int = 0) -> str:
    """The template with `filler_chars` characters of filler, `depth` of them before the key
    (both parts read from the same start): `filler` repeated, from its `offset`-th character."""
    text = " ".join([filler] * ((offset + filler_chars) // (len(filler) + 1) + 1))[offset:]
    before = round(depth * filler_chars)
    return "\n".join([INTRO, text[:before], KEY.format(k=k), text[:filler_chars - before], QUESTION])


def answer(text: str) -> int | None:
    """The decoding rule: the first integer in the decoded output (None if there is none)."""
    found = re.search(r"\d+", text)
    return int(found.group()) if found else None


def keys(seed: int, length: int, depth: float, trials: int) -> list[int]:
    """The trials' pass keys at one (length, depth): seeded, the same under every condition."""
    return [d.k for d in draws(seed, length, depth, trials)]


@dataclass(frozen=True)
class Draw:
    """What one trial draws, so that trials of a cell share no material but the template: its
    key, its depth (jittered), its filler (the sentences in its own order) and where in the
    repeated filler it starts."""
    k: int
    depth: float
    filler: str
    offset: int


def draws(seed: int, length: int, depth: float, trials: int, independent: bool = True) -> list[Draw]:
    """The trials of one (length, depth) cell: seeded, the same under every condition; not
    `independent`: only the key drawn (the cell's depth, the one filler from its start)."""
    rng = np.random.default_rng([seed, length, round(depth * 10**6)])
    ks = rng.integers(KEYS[0], KEYS[1] + 1, size=trials)  # first: the keys of before
    if not independent:
        return [Draw(int(k), depth, FILLER, 0) for k in ks]
    depths = np.clip(depth + rng.uniform(-JITTER, JITTER, trials), 0.0, 1.0)
    fillers = [" ".join(SENTENCES[i] for i in rng.permutation(len(SENTENCES))) for _ in range(trials)]
    offsets = rng.integers(0, len(FILLER) + 1, size=trials)
    return [Draw(int(k), float(d), f, int(o)) for k, d, f, o in zip(ks, depths, fillers, offsets, strict=True)]


def template_tokens(tokenizer, k: int) -> int:
    """The tokens of the prompt without filler for key `k`: `fit` needs at least these."""
    return len(tokenizer(prompt(k, 0, 0.0))["input_ids"])


def cell_fits(tokenizer, seed: int, length: int, depth: float, trials: int, independent: bool) -> bool:
    """Whether `fit` gives every trial of the (length, depth) cell a prompt (its template fits)."""
    return all(template_tokens(tokenizer, x.k) <= length
               for x in draws(seed, length, depth, trials, independent))


def shortest(tokenizer, seed: int, depths, trials: int, independent: bool) -> int:
    """The smallest length whose cells all fit at every depth (keys, so template tokens, are
    drawn per length): from the template with a one-digit key up."""
    n = template_tokens(tokenizer, KEYS[0])
    while not all(cell_fits(tokenizer, seed, n, d, trials, independent) for d in depths):
        n += 1
    return n


@dataclass(frozen=True)
class Trial:
    k: int
    length: int  # asked for
    depth: float
    text: str
    ids: tuple[int, ...]  # the tokenized prompt: at most `length` tokens (usually exactly)
    offset: int = 0  # where in its filler the text starts


def fit(tokenizer, k: int, length: int, depth: float, filler: str = FILLER, offset: int = 0) -> Trial | None:
    """The prompt with the most filler whose tokens are at most `length`; None if even the
    template without filler is longer."""
    def ids(n: int) -> list[int]:
        return tokenizer(prompt(k, n, depth, filler, offset))["input_ids"]

    if len(ids(0)) > length:
        return None
    low, high = 0, 8 * length  # a token spans fewer than 8 characters of this filler
    while low < high:  # the largest filler that fits (token counts grow with the filler)
        mid = (low + high + 1) // 2
        low, high = (mid, high) if len(ids(mid)) <= length else (low, mid - 1)
    return Trial(k, length, depth, prompt(k, low, depth, filler, offset), tuple(ids(low)), offset)


def batches(trials: list[Trial], batch_size: int | None = None) -> list[list[int]]:
    """Indices of trials with the same token count, in batches of at most `batch_size` (by
    default as many as fit 32k prompt tokens): no batch ever needs padding."""
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(trials):
        groups.setdefault(len(t.ids), []).append(i)
    out = []
    for n, members in groups.items():
        step = batch_size or max(1, 32768 // n)
        out += [members[s:s + step] for s in range(0, len(members), step)]
    return parallel.spread(out)


def decode(loaded, trials: list[Trial], batch_size: int | None = None,
           progress: Callable[[int], None] | None = None, new_tokens: int = NEW_TOKENS) -> list[str]:
    """Each trial's greedy continuation (at most `new_tokens` tokens, the KV cache on), decoded,
    each process generating its share of the batches (anything with `.ids`: ruler's samples too)."""
    from transformers import GenerationConfig

    tok = loaded.tokenizer
    stop = tok.eos_token_id
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, num_beams=1,
                              use_cache=True, eos_token_id=stop,
                              pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else stop)
    plan = batches(trials, batch_size)

    def one(rows: list[int], width: int) -> list[str]:  # its trials' decoded outputs
        ids = torch.tensor([trials[i].ids for i in rows], device=loaded.device)  # no padding
        with torch.inference_mode():
            new = loaded.model.generate(ids, attention_mask=torch.ones_like(ids),
                                        generation_config=config)[:, ids.shape[1]:].tolist()
        if progress:
            progress(len(rows))
        return [tok.decode(row[:row.index(stop)] if stop in row else row, skip_special_tokens=True)
                for row in new]

    # Prompts past the model's context are the point here: the table says so in each row, and
    # transformers' reminder that generation passed max_position_embeddings stays quiet.
    quiet = [logging.getLogger(f"transformers.generation.{m}") for m in ("utils", "stopping_criteria")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        plan, done = run_batches(plan, [len(t.ids) for t in trials], one)
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)
    out: list[str] = [""] * len(trials)
    for b, texts in done.items():
        for i, text in zip(plan[b], texts, strict=True):
            out[i] = text
    return out


def greedy_without_cache(loaded, ids: list[int]) -> str:
    """The decoding rule's reference: NEW_TOKENS argmax steps, each a full forward over the
    prompt so far (no cache, no batching). Tests hold `decode` to it."""
    tok = loaded.tokenizer
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(NEW_TOKENS):
            logits = loaded.model(torch.tensor([seq], device=loaded.device),
                                  logits_to_keep=1).logits[0, -1]  # the last row's only
            nxt = int(logits.argmax())
            if nxt == tok.eos_token_id:
                break
            seq.append(nxt)
    return tok.decode(seq[len(ids):], skip_special_tokens=True)


def accuracy(trials: list[dict], independent: bool = True) -> list[dict]:
    """Accuracy per (model, condition, length, depth), then per (model, condition, length)
    over all depths (depth "all"), each with its Wilson 95 % interval over trials. Trials that
    are not `independent` (--draws fixed: a cell's trials share filler and depth, only the key
    differs) get no interval: they are not independent units, and a cell is all right or all
    wrong more often than independent draws would be."""
    from pecli.measures.intervals import MIN_TEXTS, wilson

    df = pd.DataFrame(trials)
    keys = ["model", "intervention", "rope_scaling", "length"]
    rows = []
    for _, all_depths in df.groupby(keys, sort=False, dropna=False):
        for depth, part in [*all_depths.groupby("depth", sort=False), ("all", all_depths)]:
            first = part.iloc[0].to_dict()
            scored = part[part["note"] == ""]
            right, n = int(scored["value"].sum()), len(scored)
            # no interval from fewer than 2 trials (README), as from fewer than 2 texts
            low, high = wilson(right, n) if n >= MIN_TEXTS and independent else (float("nan"),) * 2
            keep = {k: v for k, v in first.items()
                    if k not in ("trial", "k", "depth_drawn", "filler_offset", "tokens", "output", "answer",
                                 "metric", "value", "note")}
            rows.append({**keep, "depth": depth, "metric": "accuracy",
                         "value": right / n if n else float("nan"), "ci_low": low, "ci_high": high,
                         "correct": right, "trials": n, "rows": len(part),
                         "tokens": int(scored["tokens"].sum()),
                         "note": "" if n else first["note"]})
    return _paired_with_intact(df, rows, independent)


def _paired_with_intact(trials: pd.DataFrame, rows: list[dict], independent: bool = True) -> list[dict]:
    """Each accuracy row's DIFF_COLUMNS against the intact, unscaled model at the same model,
    length and depth: the trials are paired by (depth, trial), the same prompt for both, and
    Newcombe's paired score interval (`paired_proportion_difference`) bounds the difference,
    where a bootstrap of all-discordant pairs would give none (NaN on the intact rows, and
    where there is no intact row)."""
    from pecli.measures.intervals import DIFF_COLUMNS, paired_proportion_difference

    scored = trials[trials["note"] == ""]
    by_trial = scored.set_index(["model", "intervention", "rope_scaling", "length", "depth", "trial"])["value"]
    def trials_of(*cell):  # a cell's scored trials by (depth, trial); None where none were scored
        try:
            return by_trial.xs(cell, level=[0, 1, 2, 3])
        except KeyError:
            return None

    for row in rows:
        reference = row["intervention"] == "intact" and str(row["rope_scaling"]) == "none"
        here = trials_of(row["model"], row["intervention"], row["rope_scaling"], row["length"])
        intact = trials_of(row["model"], "intact", "none", row["length"])
        diff = (float("nan"),) * 3
        if not (reference or here is None or intact is None):
            if row["depth"] != "all":
                here, intact = (x[x.index.get_level_values("depth") == row["depth"]] for x in (here, intact))
            pairs = pd.concat([here.rename("x"), intact.rename("ref")], axis=1, join="inner")
            diff = paired_proportion_difference(pairs["x"], pairs["ref"])
            diff = diff if independent else (diff[0], float("nan"), float("nan"))
        row.update(zip(DIFF_COLUMNS, diff, strict=True))
    return rows
