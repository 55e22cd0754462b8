"""Experiment "toy-length": train short, test long on algorithmic tasks, per scheme and seed.

Kazemnejad et al. 2023's protocol at toy size: a small decoder-only Transformer is trained
on instances of length 1..N (`train_length`) of one task and tested on fresh instances of
lengths up to 3N (`test_lengths`), exact match of the whole answer under greedy decoding.
Tasks (character level, digits 0-9, "<bos>prompt=answer<eos>", loss on answer and <eos>):
- `copy`: "3141=3141"; `reverse`: "3141=1413"; `sort`: "3141=1134";
- `addition`: two operands of L digits each, written least significant digit first, and
  their sum, L + 1 digits, also least significant first ("21+21=" -> "420": 12 + 12 = 024);
  the length of an instance is L, the digits per operand.
Every training batch is drawn fresh (lengths uniform in 1..N, digits uniform), from a
generator seeded by the training seed; the test items of a length come from a separate
generator seeded by (seed of the run, length), the same for every scheme and training
seed. One model per (task, scheme, training seed); seeds are seed, seed + 1, ...

Tables: `by_seed` (exact match per training seed and test length, with the training
loss and time), `accuracy` (mean over training seeds with a 95 % t interval over seeds,
`seeds` the count) and `ranking` (Kazemnejad et al.'s mean reciprocal rank over tasks, from
each task's mean exact match past the training length, with a bootstrap over seeds).
With `addition` among the tasks, `attention_map` holds the seed's question at the longest
test length, never trained on: each scheme's first-seed model reads the probe "11..1+11..1="
(every operand digit a 1, so only position tells the units' 1 from the tens' 1) with its
answer teacher-forced, and the table keeps every layer's attention (head mean) of every
query from "=" on over every key.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch

from pecli.experiments import Headline, lazy, register
from pecli.experiments.options.toy_length import ToyLengthOptions
from pecli.measures.intervals import SEEDS_CROSSED_TEXTS, percentile_interval
from pecli.measures.training import char_tokenizer, items_right, over_seeds
from pecli.runs.provenance import row_provenance
from pecli.runs.tables import validate

VERSION = 1
ATTENTION_ITEMS = 16  # test items at the longest length whose attention is profiled
DIGITS = "0123456789"


# --- tasks ----------------------------------------------------------------------------


def instance(task: str, length: int, rng: np.random.Generator) -> tuple[str, str]:
    """(prompt ending in "=", answer) of one instance of `task` at `length`."""
    digits = "".join(DIGITS[d] for d in rng.integers(0, 10, length))
    if task == "copy":
        return digits + "=", digits
    if task == "reverse":
        return digits + "=", digits[::-1]
    if task == "sort":
        return digits + "=", "".join(sorted(digits))
    if task == "addition":
        other = "".join(DIGITS[d] for d in rng.integers(0, 10, length))
        total = int(digits[::-1]) + int(other[::-1])  # operands are written reversed
        return f"{digits}+{other}=", str(total).zfill(length + 1)[::-1]
    raise ValueError(f"unknown task {task!r}")


def sequence_length(task: str, length: int) -> int:
    """Tokens of "<bos>prompt=answer<eos>" at `length` (every instance of it has this many)."""
    prompt, answer = instance(task, length, np.random.default_rng(0))
    return len(prompt) + len(answer) + 2


def split_rule(o: ToyLengthOptions) -> str:
    return (f"train: fresh instances of lengths 1-{o.train_length} (uniform); test: "
            f"{o.eval_items} fresh instances per length "
            f"{', '.join(map(str, o.test_lengths))}")


class Encoder:
    """Characters to ids with the toy's tokenizer vocabulary, without its per-call overhead."""

    def __init__(self, tokenizer):
        self.vocab = tokenizer.get_vocab()
        self.bos, self.eos, self.pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id

    def ids(self, text: str) -> list[int]:
        return [self.vocab[c] for c in text]


def training_batches(task: str, enc: Encoder, max_length: int, batch: int, seed: int):
    """Endless batches of fresh instances of lengths 1..max_length, right-padded; labels are
    -100 except on the answer and <eos>."""
    rng = np.random.default_rng(seed)
    while True:
        rows = []
        for length in rng.integers(1, max_length + 1, batch):
            prompt, answer = instance(task, int(length), rng)
            head = [enc.bos, *enc.ids(prompt)]
            rows.append((head + enc.ids(answer) + [enc.eos], len(head)))
        longest = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((batch, longest), enc.pad, dtype=torch.long)  # [b, t]
        labels = torch.full((batch, longest), -100, dtype=torch.long)  # [b, t]
        mask = torch.zeros((batch, longest), dtype=torch.long)  # [b, t]
        for r, (ids, start) in enumerate(rows):
            input_ids[r, : len(ids)] = torch.tensor(ids)
            labels[r, start: len(ids)] = input_ids[r, start: len(ids)]
            mask[r, : len(ids)] = 1
        yield {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def held_out_items(task: str, length: int, n: int, seed: int) -> list[tuple[str, str]]:
    """`n` instances at `length`, the same for every scheme and training seed."""
    rng = np.random.default_rng([seed, length, 1])
    return [instance(task, length, rng) for _ in range(n)]


@torch.inference_mode()
def exact_match(model, enc: Encoder, items: list[tuple[str, str]],
                position_ids: torch.Tensor | None = None) -> np.ndarray:
    """Greedy decoding of every item (all of one length, so one batch without padding) with
    the KV cache: len(answer) + 1 tokens; right iff they are the answer then <eos>.
    `position_ids` [n, prompt + answer + 1] (the `randomized` scheme): each token's position."""
    from pecli.measures.training import greedy_tokens

    ids = torch.tensor([[enc.bos, *enc.ids(p)] for p, _ in items])  # [n, t]
    target = torch.tensor([[*enc.ids(a), enc.eos] for _, a in items])  # [n, a]
    written = greedy_tokens(model, ids, target.shape[1], position_ids=position_ids)
    return (written == target).all(dim=1).numpy()


# --- how far the models attend (issue 35's statistics) ------------------------------------


@torch.inference_mode()
def attention_profile(model, enc: Encoder, items: list[tuple[str, str]],
                      position_ids: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """pecli.measures.attention's statistics (`Stats`, the maps transformers' output_attentions
    gives, as `pecli attn` reads families with their own attention code) over the whole
    sequences "<bos>prompt=answer<eos>" of `items` (teacher-forced, all of one length):
    per layer, the mean attention distance (head mean, in tokens) and the mass on keys at
    distance 8 or more."""
    from pecli.measures.attention import Stats

    ids = torch.tensor([[enc.bos, *enc.ids(p), *enc.ids(a), enc.eos] for p, a in items])  # [n, t]
    maps = attentions(model, ids, position_ids)
    stats = Stats(texts=len(items), layers=len(maps), heads=maps[0].shape[1], length=ids.shape[1],
                  causal=True)
    for layer, p in enumerate(maps):
        stats.add(layer, 0, p)
    far = [j for j, edge in enumerate(stats.edges) if edge >= 8]
    return {"attention_mean_distance": stats.per_text()["mean_distance"].mean((0, 2)),  # [layers]
            "attention_far_mass": stats.distance_histogram()[:, :, far].sum(-1).mean(-1)}


def attentions(model, ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> tuple:
    """transformers' attention probabilities of `ids` [n, t], one [n, heads, t, t] per layer
    (the model is switched to eager attention for the call when it runs sdpa)."""
    current = model.config._attn_implementation
    swap = current in ("sdpa", None)  # sdpa returns no probabilities; registered functions do
    if swap:
        model.set_attn_implementation("eager")
    try:
        kwargs = {} if position_ids is None else {"position_ids": position_ids[:, : ids.shape[1]]}
        return model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True,
                     **kwargs).attentions
    finally:
        if swap:
            model.set_attn_implementation(current)


def probe(length: int) -> tuple[str, str]:
    """The seed's question at `length` digits: (prompt, answer) of the addition whose operand
    digits are all 1 ("11+11=" -> "220", 11 + 11 = 22 written least significant first)."""
    ones = "1" * length
    return f"{ones}+{ones}=", str(2 * int(ones)).zfill(length + 1)[::-1]


@torch.inference_mode()
def probe_map(model, enc: Encoder, length: int,
              position_ids: torch.Tensor | None = None) -> list[dict]:
    """Every layer's head-mean attention on `probe(length)` (answer teacher-forced), from each
    query at or after "=" (the positions that predict the answer) to every key it sees: rows
    (layer, query, key, their tokens, weight)."""
    prompt, answer = probe(length)
    text = ["<bos>", *prompt, *answer, "<eos>"]
    ids = torch.tensor([[enc.bos, *enc.ids(prompt), *enc.ids(answer), enc.eos]])  # [1, t]
    first = len(prompt)  # the "=" (index 0 is <bos>)
    rows = []
    for layer, p in enumerate(attentions(model, ids, position_ids), 1):
        mean = p[0].float().mean(0)  # [t, t], over heads
        for q in range(first, len(text)):
            for k in range(q + 1):
                rows.append({"layer": layer, "query": q, "key": k, "query_token": text[q],
                             "key_token": text[k], "value": float(mean[q, k])})
    return rows


# --- intervals over seeds and the ranking ---------------------------------------------------


def reciprocal_ranks(scores: dict[str, float]) -> dict[str, float]:
    """1 / rank of each scheme by score, highest first; tied schemes share the best rank."""
    return {k: 1.0 / (1 + sum(other > v for other in scores.values())) for k, v in scores.items()}


def ranking(by_seed: pd.DataFrame, train_length: int, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per scheme: mean reciprocal rank over tasks (each task ranks the schemes by their mean
    exact match over test lengths past `train_length`, averaged over seeds), and a percentile
    bootstrap over training seeds (each (task, scheme)'s seeds resampled with replacement)."""
    past = by_seed[(by_seed.metric == "exact_match") & (by_seed.test_length > train_length)]
    per_seed = past.groupby(["task", "pe", "seed"], sort=False)["value"].mean()  # over lengths
    tasks = list(dict.fromkeys(per_seed.index.get_level_values("task")))
    schemes = list(dict.fromkeys(per_seed.index.get_level_values("pe")))
    cells = {(t, s): per_seed.loc[(t, s)].to_numpy() for t in tasks for s in schemes}

    def mrr(means: dict) -> dict[str, float]:
        ranks = [reciprocal_ranks({s: means[(t, s)] for s in schemes}) for t in tasks]
        return {s: float(np.mean([r[s] for r in ranks])) for s in schemes}

    point = mrr({k: v.mean() for k, v in cells.items()})
    rng = np.random.default_rng(seed)
    boot = [mrr({k: rng.choice(v, len(v)).mean() for k, v in cells.items()}) for _ in range(n_boot)]
    rows = []
    for s in schemes:
        draws = np.array([b[s] for b in boot])
        accuracy = np.array([cells[(t, s)] for t in tasks]).mean(0)  # per seed, over tasks
        low, high = _past_interval(past[past.pe == s], seed)
        mrr_low, mrr_high = percentile_interval(draws)
        rows.append({"pe": s, "metric": "mrr", "value": point[s],
                     "ci_low": mrr_low, "ci_high": mrr_high,
                     "interval": "95 % percentile bootstrap over training seeds (each task and "
                                 f"scheme's seeds resampled, {n_boot} resamples)",
                     "tasks": ",".join(tasks)})
        rows.append({"pe": s, "metric": "exact_match_past_train_length",
                     "value": float(accuracy.mean()), "ci_low": low, "ci_high": high,
                     "interval": SEEDS_CROSSED_TEXTS if low == low else "", "tasks": ",".join(tasks)})
    return pd.DataFrame(rows)


def _past_interval(rows: pd.DataFrame, seed: int) -> tuple[float, float]:
    """A scheme's exact match past the training length, seeds and test items resampled
    together: each seed's items of every task and length in one order (every seed answers
    the same items, as many per task and length: the mean over them is the mean over tasks)."""
    from pecli.measures.intervals import seeds_and_texts_interval

    per_seed = [[items_right(r) for _, r in group.sort_values(["task", "test_length"]).iterrows()]
                for _, group in rows.groupby("seed", sort=True)]
    if any(i is None for items in per_seed for i in items):
        return float("nan"), float("nan")
    return seeds_and_texts_interval([np.concatenate(items) for items in per_seed], seed=seed,
                                    same_texts=True)


# --- the experiment -------------------------------------------------------------------


def run(options: ToyLengthOptions, progress=None) -> dict[str, pd.DataFrame]:
    """Train one model per (task, scheme, seed); tables `by_seed`, `accuracy`, `ranking`.

    `progress(label, step, steps, loss)` after each step; `save_dir`: checkpoints go to
    <save_dir>/<task>-<scheme>-seed<k>.
    """
    from pecli.measures.training import torch_threads

    with torch_threads(options.threads):
        return _run(options, progress)


def train_one(task: str, scheme: str, seed: int, o: ToyLengthOptions, positions: int, progress=None):
    """A model of `scheme` trained on `task` at lengths 1..train_length: (model, result)."""
    from pecli.measures.training import (
        ModelSize,
        TrainConfig,
        build_model,
        train,
        with_random_positions,
    )

    tok = char_tokenizer()
    enc = Encoder(tok)
    size = ModelSize(o.layers, o.width, o.heads, positions=positions)
    model = build_model(scheme, len(tok), size, pad_token_id=enc.pad, bos_token_id=enc.bos,
                        eos_token_id=enc.eos, seed=seed)
    batches = training_batches(task, enc, o.train_length, o.batch, seed)
    if scheme == "randomized":
        batches = with_random_positions(batches, positions, seed)
    hook = None if progress is None else (
        lambda s, loss: progress(f"{task} {scheme} seed {seed}", s, o.steps, loss))
    result = train(model, batches, TrainConfig(steps=o.steps, lr=o.lr), on_step=hook)
    return model, result


def _one_model(task: str, scheme: str, seed: int, o: ToyLengthOptions, positions: int,
               items: dict, rule: str, progress=None) -> list[dict]:
    """Train one model and measure it: its rows (exact match per test length, attention
    profile, training numbers)."""
    from pathlib import Path

    from pecli.measures.training import FAMILY, count_parameters, random_position_ids, saved_as

    enc = Encoder(char_tokenizer())
    rows = []
    model, result = train_one(task, scheme, seed, o, positions, progress)
    revision, model_id = f"seed:{seed}", f"toy-length:{task}:{scheme}"
    if o.save_dir is not None:
        model_id, revision = saved_as(model, char_tokenizer(), Path(o.save_dir) / f"{task}-{scheme}-seed{seed}",
                                      card={"experiment": "toy-length", "task": task, "pe": scheme,
                                            "seed": seed, "train_length": o.train_length, "steps": o.steps})
    base = {"experiment": "toy-length", **row_provenance(), "seed": seed,
            "model": f"toy-{scheme}", "model_id": model_id, "model_revision": revision,
            "random_init": False, "device": "cpu", "dtype": "float32",
            "family": FAMILY[scheme], "pe": scheme, "task": task,
            "dataset": "toy:" + ",".join(o.task), "intervention": "none", "split": "length",
            "split_rule": rule, "train_length": o.train_length,
            "steps": o.steps, "batch": o.batch, "lr": o.lr, "layers": o.layers,
            "width": o.width, "heads": o.heads, "positions": positions,
            "parameters": count_parameters(model)}
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for n, its in items.items():
        pos = None
        if scheme == "randomized":  # Ruoss et al.: sampled positions at test too
            pos = random_position_ids(len(its), sequence_length(task, n) - 1, positions, generator)
        correct = exact_match(model, enc, its, pos)
        rows.append({**base, "metric": "exact_match", "test_length": n,
                     "in_training": n <= o.train_length, "value": float(correct.mean()),
                     "rows": len(its), "tokens": len(its) * sequence_length(task, n),
                     "items_right": "".join("1" if c else "0" for c in correct)})  # item by item
    eval_seconds = time.perf_counter() - start
    rows += _profile_rows(model, enc, task, scheme, items, positions, generator, base, o)
    longest = max(o.test_lengths)
    if task == "addition" and seed == o.seed:  # the seed's question, at the longest length
        pos = None if scheme != "randomized" else random_position_ids(
            1, sequence_length(task, longest), positions, generator)
        probe_text = "".join(probe(longest))
        rows += [{**base, **cell, "metric": "attention_weight", "test_length": longest,
                  "in_training": longest <= o.train_length, "probe": probe_text, "rows": 1,
                  "tokens": sequence_length(task, longest)}
                 for cell in probe_map(model, enc, longest, pos)]
    for metric, value in (("final_train_loss", float(np.mean(result["losses"][-50:]))),
                          ("train_seconds", result["seconds"]),
                          ("eval_seconds", eval_seconds),
                          ("train_tokens_per_second", result["tokens"] / result["seconds"])):
        rows.append({**base, "metric": metric, "test_length": -1, "in_training": True,
                     "value": value, "rows": 0, "tokens": 0, "train_tokens": result["tokens"]})
    return rows


def _profile_rows(model, enc, task: str, scheme: str, items: dict, positions: int, generator,
                  base: dict, o: ToyLengthOptions) -> list[dict]:
    """The attention profile per layer on the longest test length's first items."""
    from pecli.measures.training import random_position_ids

    longest = max(o.test_lengths)
    its = items[longest][:ATTENTION_ITEMS]
    pos = None if scheme != "randomized" else random_position_ids(
        len(its), sequence_length(task, longest), positions, generator)
    return [{**base, "metric": metric, "test_length": longest, "in_training": longest <= o.train_length,
             "layer": layer, "value": float(value), "rows": len(its),
             "tokens": len(its) * sequence_length(task, longest)}
            for metric, per_layer in attention_profile(model, enc, its, pos).items()
            for layer, value in enumerate(per_layer, 1)]  # 0 = the embedding output


def _run(o: ToyLengthOptions, progress) -> dict[str, pd.DataFrame]:
    from pecli.measures.training import run_jobs

    schemes = [c.name for c in o.pe]
    seeds = [o.seed + k for k in range(o.seeds)]
    # every model gets positions for the longest test sequence of any task (learned rows
    # past the training length exist but are never trained, as in Kazemnejad et al.)
    positions = max(sequence_length(t, max(o.test_lengths)) for t in o.task)
    rule = split_rule(o)
    jobs = []
    for task in o.task:
        items = {n: held_out_items(task, n, o.eval_items, o.seed) for n in o.test_lengths}
        jobs += [(task, scheme, seed, o, positions, items, rule) for scheme in schemes
                 for seed in seeds]
    if o.workers > 1:
        rows = [r for part in run_jobs(_one_model, jobs, o.workers) for r in part]
    else:
        rows = [r for job in jobs for r in _one_model(*job, progress=progress)]
    maps = [r for r in rows if r["metric"] == "attention_weight"]
    by_seed = pd.DataFrame([r for r in rows if r["metric"] != "attention_weight"])
    by_seed["layer"] = by_seed["layer"].fillna(-1).astype(int)  # -1: not a per-layer number
    tables = {"by_seed": validate(by_seed), "accuracy": validate(summary(by_seed)),
              "ranking": validate(_with(ranking(by_seed, o.train_length, seed=o.seed), by_seed))}
    if maps:
        tables["attention_map"] = validate(pd.DataFrame(maps))
    return tables


def summary(by_seed: pd.DataFrame) -> pd.DataFrame:
    """Every per-seed number as its mean over training seeds: exact match with a bootstrap
    over seeds and test items together (every seed answers the same items: one draw of items
    serves all seeds of a resample), the others with a t interval over seeds."""
    return over_seeds(by_seed, ["task", "pe", "metric", "test_length", "layer"], items_right,
                      same_texts=True)


def _with(ranking_rows: pd.DataFrame, by_seed: pd.DataFrame) -> pd.DataFrame:
    """The ranking's rows with the provenance and sizes they were computed from."""
    first = by_seed.iloc[0]
    shared = {k: first[k] for k in ("experiment", "split", "split_rule", "train_length", "steps",
                                    "layers", "width", "heads", "dtype", "device", "random_init",
                                    "intervention")}
    shared["dataset"] = "toy:" + ",".join(dict.fromkeys(by_seed["task"]))
    prov = {k: first[k] for k in row_provenance()}
    seeds = by_seed.groupby("pe")["seed"].nunique()
    return ranking_rows.assign(**shared, **prov, seed=int(by_seed["seed"].min()),
                               seeds=ranking_rows["pe"].map(seeds),
                               model=ranking_rows["pe"].map(lambda s: f"toy-{s}"),
                               model_id="toy-length", rows=0, tokens=0,
                               model_revision="seeds:" + ",".join(map(str, sorted(by_seed["seed"].unique()))))


figures = lazy("pecli.plots.training:toy_length_figures")


register("toy-length", VERSION, run, ToyLengthOptions, figures,
         "Train short, test long: copy / reverse / addition / sort per position scheme and training "
         "seed; exact match by test length with intervals over seeds, MRR ranking",
         headlines=(
             Headline("exact_match", "exact match by test length (toy length)",
                      {"aggregation": "mean over training seeds"}, ("pe",), name="toy_length_exact_match",
                      slot=lambda r: f"{r['task']}, length {int(r['test_length'])}",
                      interval=SEEDS_CROSSED_TEXTS),
             Headline("mrr", "mean reciprocal rank over tasks (toy length)", {}, ("pe",),
                      name="toy_length_mrr", interval="95 % percentile bootstrap over training seeds")))
