"""Experiment "toy": learn "i+j=k" / "i-j=k" with each position scheme; attention on repeats.

Character-level strings for 0 <= i, j < max, split once by a seeded permutation. A tiny
causal Transformer sees "<bos>i+j=" and is trained (loss on the answer and <eos> only)
to produce k; exact match is measured by greedy decoding on the held-out split. Then
layer-1 attention on a probe such as "21+21=" shows whether repeated digits can attend
differently: without positions, identical tokens have identical queries and keys in
layer 1 (see `attention_rows`). Tables number layers as everywhere in pecli: 0 is the
embedding output, so the first attention layer is `layer` 1.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pecli.experiments import Headline, lazy, register
from pecli.experiments.options.toy import ToyOptions
from pecli.measures.intervals import accuracy_interval, accuracy_method
from pecli.measures.training import CHARS, OVER_SEEDS, SPECIALS, char_tokenizer  # noqa: E402,F401
from pecli.runs.provenance import row_provenance
from pecli.runs.tables import validate

VERSION = 4  # 2: layers from 1; train_tokens; 3: exact_match intervals; 4: seeds (by_seed, accuracy over them)



# --- data -----------------------------------------------------------------------------


def arithmetic_examples(max_n: int) -> list[str]:
    """Every "i+j=k" and "i-j=k" for 0 <= i, j < max_n, in a fixed order."""
    out = []
    for op in "+-":
        for i in range(max_n):
            for j in range(max_n):
                out.append(f"{i}{op}{j}={i + j if op == '+' else i - j}")
    return out


def split_examples(examples: list[str], test_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(train, test): a seeded permutation cut once, so the two never share a string."""
    order = np.random.default_rng(seed).permutation(len(examples))
    n_test = max(1, int(round(len(examples) * test_fraction)))
    test = [examples[i] for i in sorted(order[:n_test])]
    train = [examples[i] for i in order[n_test:]]
    return train, test


def encode_example(tokenizer, example: str) -> tuple[list[int], int]:
    """(ids of "<bos>i+j=k<eos>", index of the first answer token)."""
    prompt, answer = example.split("=")
    ids = [tokenizer.bos_token_id] + tokenizer(prompt + "=")["input_ids"]
    return ids + tokenizer(answer)["input_ids"] + [tokenizer.eos_token_id], len(ids)


def batch_iterator(tokenizer, train: list[str], batch: int, seed: int):
    """Endless seeded batches; labels are -100 except on the answer and <eos>."""
    encoded = [encode_example(tokenizer, e) for e in train]
    longest = max(len(ids) for ids, _ in encoded)
    # Pad everything once (sequences are at most a dozen tokens): batches are then a gather.
    input_ids = torch.full((len(encoded), longest), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(encoded), longest), -100, dtype=torch.long)  # [n, t]
    mask = torch.zeros((len(encoded), longest), dtype=torch.long)  # [n, t]
    for r, (ids, start) in enumerate(encoded):
        input_ids[r, : len(ids)] = torch.tensor(ids)
        labels[r, start: len(ids)] = torch.tensor(ids[start:])
        mask[r, : len(ids)] = 1
    rng = np.random.default_rng(seed)
    while True:
        rows = torch.from_numpy(rng.integers(0, len(encoded), batch))  # [b]
        yield {"input_ids": input_ids[rows], "attention_mask": mask[rows], "labels": labels[rows]}


def greedy_answers(model, tokenizer, prompts: list[str], longest: int) -> list[str]:
    """Greedy continuation of each "i+j=" until <eos>, with the KV cache; prompts of one length
    share a batch (no padding: positions are exactly those of training).

    `longest`: tokens of the longest example, <bos> to <eos>. A prompt decodes until it is that
    long, room for any right answer and its <eos>, so a model that never ends (one barely
    trained) reads "<no eos>" and never runs past its position table."""
    from pecli.measures.training import greedy_tokens

    by_len: dict[int, list[int]] = {}
    encoded = [[tokenizer.bos_token_id] + tokenizer(p)["input_ids"] for p in prompts]
    for i, ids in enumerate(encoded):
        by_len.setdefault(len(ids), []).append(i)
    answers = [""] * len(prompts)
    itos = {i: t for t, i in tokenizer.get_vocab().items()}
    eos = tokenizer.eos_token_id
    for idx in by_len.values():
        ids = torch.tensor([encoded[i] for i in idx])  # [b, t]
        written = greedy_tokens(model, ids, longest - ids.shape[1], eos=eos).tolist()
        for row, i in zip(written, idx, strict=True):
            answers[i] = "".join(itos[t] for t in row[:row.index(eos)]) if eos in row else "<no eos>"
    return answers


# --- attention on a probe ---------------------------------------------------------------


@torch.inference_mode()
def attention_rows(model, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """Attention probabilities per layer, [heads, t, t] each, for one sequence [1, t].

    Switches sdpa to eager for the pass (sdpa returns no probabilities); registered
    functions such as ALiBi's return their own.
    """
    current = model.config._attn_implementation
    swap = current in ("sdpa", None)
    if swap:
        model.set_attn_implementation("eager")
    try:
        out = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                    output_attentions=True)
    finally:
        if swap:
            model.set_attn_implementation(current)
    return [a[0] for a in out.attentions]


def repeat_gaps(probs: torch.Tensor, ids: list[int]) -> dict[str, float]:
    """How differently repeated tokens attend, for causal attention probs [heads, t, t].

    For every pair p < q with ids[p] == ids[q]:
    - `repeat_key_gap`: |a[q, p] - a[q, q]|, how differently query q weighs the two copies;
    - `shared_key_row_gap`: max_j<=p |a[q, j] / sum_{j'<=p} a[q, j'] - a[p, j]|, row q
      renormalised over the keys both rows see, against row p.
    Both are exactly 0 (up to float rounding) when the copies have the same query and key.
    """
    gaps = {"repeat_key_gap": 0.0, "shared_key_row_gap": 0.0, "repeat_pairs": 0}
    for q in range(len(ids)):
        for p in range(q):
            if ids[p] != ids[q]:
                continue
            gaps["repeat_pairs"] += 1
            key_gap = (probs[:, q, p] - probs[:, q, q]).abs().max().item()
            shared = probs[:, q, : p + 1]  # [heads, p+1]
            renorm = shared / shared.sum(-1, keepdim=True)
            row_gap = (renorm - probs[:, p, : p + 1]).abs().max().item()
            gaps["repeat_key_gap"] = max(gaps["repeat_key_gap"], key_gap)
            gaps["shared_key_row_gap"] = max(gaps["shared_key_row_gap"], row_gap)
    return gaps


def default_probe(max_n: int) -> str:
    """The study's "21+211=" when it is in range, else "21+21=" (both repeat 2 and 1), else "1+1="."""
    return "21+211=" if max_n > 211 else "21+21=" if max_n > 21 else "1+1="


# --- the experiment -------------------------------------------------------------------


def run(options: ToyOptions, progress=None) -> dict[str, pd.DataFrame]:
    """Train one model per scheme and training seed; tables `by_seed` (exact match and
    training numbers per model), `accuracy` (their means over seeds) and `attention`.

    `options.max_n` is the CLI's --max (operands 0 <= i, j < max_n). Every seed trains on the
    same split (--seed's) and answers the same test sums, so the accuracy interval resamples
    seeds and sums together (crossed); one seed gives Wilson's interval over the sums.
    `threads`: torch threads while training (default 1: at this size a second thread costs
    more in synchronisation than it gains, measured on the shared 2-core machine); `workers`:
    models trained at once, each in its own one-thread process (the same numbers).
    `progress(label, step, steps, loss)` is called after each step when given and training in
    this process (the CLI's progress bar). `save_dir`: each checkpoint goes to <save_dir>/<scheme>
    (<scheme>-seed<k> with several seeds).
    """
    from pecli.measures.training import torch_threads

    with torch_threads(options.threads):
        return _run(options, progress)


def _run(o: ToyOptions, progress) -> dict[str, pd.DataFrame]:
    from pecli.measures.training import run_jobs

    examples = arithmetic_examples(o.max_n)
    train_set, test_set = split_examples(examples, o.test_fraction, o.seed)
    if o.eval_limit is not None:
        test_set = test_set[:o.eval_limit]
    tokenizer = char_tokenizer()
    longest = max(len(encode_example(tokenizer, e)[0]) for e in examples)  # once, for every model
    jobs = [(scheme, o.seed + k, o, train_set, test_set, longest) for scheme in [c.name for c in o.pe]
            for k in range(o.seeds)]
    if o.workers > 1:
        parts = run_jobs(_one_model, jobs, o.workers)
    else:
        parts = [_one_model(*job, progress=progress) for job in jobs]
    by_seed = pd.DataFrame([r for rows, _ in parts for r in rows])
    return {"by_seed": validate(by_seed), "accuracy": validate(over_training_seeds(by_seed)),
            "attention": validate(pd.DataFrame([r for _, rows in parts for r in rows]))}


def _one_model(scheme: str, seed: int, o: ToyOptions, train_set: list[str], test_set: list[str],
               longest: int, progress=None) -> tuple[list[dict], list[dict]]:
    """Train one model of `scheme` from training seed `seed` (its initialisation and batches)
    and measure it: (its by_seed rows, its probe's attention rows)."""
    from pecli.measures.training import ModelSize, TrainConfig, model_for, train

    tokenizer = char_tokenizer()
    size = ModelSize(o.layers, o.width, o.heads, positions=max(16, longest))
    model = model_for(scheme, tokenizer, size, seed)
    batches = batch_iterator(tokenizer, train_set, o.batch, seed)
    label = scheme if o.seeds == 1 else f"{scheme} seed {seed}"
    hook = None if progress is None else (lambda s, loss: progress(label, s, o.steps, loss))
    result = train(model, batches, TrainConfig(steps=o.steps, lr=o.lr), on_step=hook)
    start = time.perf_counter()
    prompts = [e.split("=")[0] + "=" for e in test_set]
    answers = greedy_answers(model, tokenizer, prompts, longest)
    result["eval_seconds"] = time.perf_counter() - start
    base = _base_row(model, tokenizer, scheme, seed, o, size, len(train_set))
    probe = o.probe or default_probe(o.max_n)  # ToyOptions checked a given one against max_n
    return (_accuracy_rows(base, tokenizer, test_set, prompts, answers, result, o.seed),
            _probe_rows(base, model, tokenizer, probe))


def over_training_seeds(by_seed: pd.DataFrame) -> pd.DataFrame:
    """The accuracy table: with one training seed its rows (exact match with Wilson's interval
    over the test sums); with several, each number's mean over seeds, exact match with the
    two-level bootstrap over seeds and the sums they share, the training numbers with a t
    interval over seeds."""
    from pecli.measures.training import items_right, over_seeds

    if by_seed["seed"].nunique() == 1:
        return by_seed.drop(columns="items_right").assign(seeds=1, aggregation=OVER_SEEDS)
    means = over_seeds(by_seed, ["pe", "metric", "operation"], items_right, same_texts=True)
    return means.drop(columns="items_right")


def _base_row(model, tokenizer, scheme: str, seed: int, o: ToyOptions, size, train_examples: int) -> dict:
    """The columns of every row of one trained model, `seed` its training seed (saved first
    under --save-models: its portable id and weights' sha256 then name it)."""
    from pecli.measures.training import FAMILY, count_parameters, saved_as

    model_id, revision = f"toy:{scheme}", f"seed:{seed}"
    if o.save_dir is not None:
        folder = scheme if o.seeds == 1 else f"{scheme}-seed{seed}"
        model_id, revision = saved_as(model, tokenizer, Path(o.save_dir) / folder,
                                      card={"experiment": "toy", "pe": scheme, "max": o.max_n,
                                            "steps": o.steps, "seed": seed, "size": size.__dict__})
    return {
        "experiment": "toy", "seed": seed, "split_seed": o.seed, **row_provenance(), "model": f"toy-{scheme}",
        "model_id": model_id, "model_revision": revision, "random_init": False,
        "device": "cpu", "dtype": "float32", "family": FAMILY[scheme],
        "pe": scheme, "dataset": f"arithmetic(max={o.max_n})", "max": o.max_n, "split": "test",
        "intervention": "none", "steps": o.steps, "batch": o.batch, "lr": o.lr,
        "layers": o.layers, "width": o.width, "heads": o.heads,
        "parameters": count_parameters(model), "train_examples": train_examples,
    }


def _accuracy_rows(base: dict, tokenizer, test_set: list[str], prompts: list[str],
                   answers: list[str], result: dict, seed: int) -> list[dict]:
    """Exact match (all, add, sub) with intervals over test examples; training's timings."""
    truth = [e.split("=")[1] for e in test_set]
    correct = np.array([a == t for a, t in zip(answers, truth, strict=True)])
    ops = np.array(["+" if "+" in p else "-" for p in prompts])
    n_tokens = sum(len(encode_example(tokenizer, e)[0]) for e in test_set)
    rows = []
    for op_name, sel in (("all", slice(None)), ("add", ops == "+"), ("sub", ops == "-")):
        low, high = accuracy_interval(correct[sel], n_boot=1000, seed=seed)
        rows.append({**base, "metric": "exact_match", "operation": op_name,
                     "value": float(correct[sel].mean()), "ci_low": low, "ci_high": high,
                     "interval": "95 % " + accuracy_method(correct[sel], "test examples"),
                     "rows": int(correct[sel].size), "tokens": n_tokens,
                     "items_right": "".join("1" if c else "0" for c in correct[sel])})  # item by item
    for metric, value in (("train_seconds", result["seconds"]),
                          ("eval_seconds", result["eval_seconds"]),
                          ("final_train_loss", float(np.mean(result["losses"][-50:]))),
                          ("train_tokens_per_second", result["tokens"] / result["seconds"])):
        rows.append({**base, "metric": metric, "operation": "all", "value": value,
                     "rows": len(test_set), "tokens": n_tokens, "train_tokens": result["tokens"]})
    return rows


def _probe_rows(base: dict, model, tokenizer, probe: str) -> list[dict]:
    """The probe's attention per layer: repeat gaps (max over heads) and every weight."""
    probe_ids = [tokenizer.bos_token_id] + tokenizer(probe)["input_ids"]
    probe_tokens = ["<bos>"] + list(probe)
    rows = []
    for layer, probs in enumerate(attention_rows(model, torch.tensor([probe_ids])), 1):
        # layer 0 = embedding output, as elsewhere
        pbase = {**base, "split": "probe", "probe": probe, "rows": 1,
                 "tokens": len(probe_ids), "layer": layer}
        for metric, value in repeat_gaps(probs, probe_ids).items():
            rows.append({**pbase, "metric": metric, "head": "max", "query_pos": -1,
                         "key_pos": -1, "query_token": "", "key_token": "", "value": float(value)})
        mean = probs.mean(0)  # [t, t] head mean
        for head_name, grid in [("mean", mean)] + [(str(h), probs[h]) for h in range(probs.shape[0])]:
            for q in range(grid.shape[0]):
                for k in range(q + 1):
                    rows.append({**pbase, "metric": "attention", "head": head_name,
                                 "query_pos": q, "key_pos": k, "query_token": probe_tokens[q],
                                 "key_token": probe_tokens[k], "value": float(grid[q, k])})
    return rows


figures = lazy("pecli.plots.training:toy_figures")


register("toy", VERSION, run, ToyOptions, figures,
         "Train tiny Transformers on i+j=k / i-j=k per position scheme: exact match, attention on repeats",
         headlines=(Headline("exact_match", "toy arithmetic exact match",  # accuracy.csv's, not by_seed's
                             {"operation": "all", "aggregation": OVER_SEEDS}, ("pe",),
                             interval="95 % Wilson score interval over test examples"),))
