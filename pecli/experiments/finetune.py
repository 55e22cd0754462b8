"""`pecli finetune`: what training makes of a model without positions (the study's open
questions 1 and 3).

The model's config decides the task:

- an encoder (MiniLM by default, any BERT-family model) learns IMDB sentiment under each
  condition (intact, zero, shuffle): a linear head on the mean-pooled final hidden state,
  with full fine-tuning (or the last `train_layers` layers), the position table frozen.
  Several seeds; test accuracy per seed (Wilson interval over test texts) and its mean over seeds
  with an interval over seeds and test texts together, beside pecli's frozen-feature probe (logistic regression on
  the same features of the same texts, untrained encoder); every row of a condition carries
  its paired difference from intact's (same seed, same texts). Table `finetune`.
- a causal LM is fine-tuned on IMDB train texts after its positions are removed (zero), and
  from the intact model as the control (what the same training does with positions), and
  from zero + a fitted mask (`--mask FILE`, pecli mask fit). Held-out corpus perplexity on
  IMDB test texts at step 0 and every `eval_every` steps: the recovery curve, its mean over
  seeds with an interval over seeds and texts together, and the steps until it comes within 10 % of the intact
  model's (untrained) perplexity. Table `recovery`.

`model_out`: the first seed's model of each condition saved as <model_out>/<condition>, which
every pecli command loads (its revision is the weights' sha256); a learned table is saved as
trained (zero stays zero), a rotary model's removed rotation is not part of a checkpoint, so
evaluate those with `--intervention zero` (pecli_training.json says so).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pecli.experiments import Headline, check_before_loading, load, register
from pecli.experiments.options.finetune import FinetuneOptions
from pecli.measures.intervals import SEEDS_CROSSED_TEXTS
from pecli.runs import names
from pecli.runs.errors import ConfigError, OutputError
from pecli.runs.provenance import row_provenance
from pecli.runs.tables import validate

ENCODER_CONDITIONS = (names.INTACT, "zero", "shuffle")
LM_CONDITIONS = (names.INTACT, "zero")
WITHIN = 0.10  # "within 10 % of intact"
DEFAULT_LIMIT = {"encoder": 400, "lm": 48}
DEFAULT_BATCH = {"encoder": 16, "lm": 8}


def check_model_out(folder: Path) -> None:
    """--model-out names a folder that can hold a checkpoint per condition: refused before
    training (not after), in one line."""
    if not str(folder).strip() or str(folder) == ".":
        raise OutputError("--model-out: give a folder for the checkpoints, e.g. runs/ft-models")
    for part in (folder, *folder.parents):
        if part.exists() and not part.is_dir():
            raise OutputError(f"--model-out {folder}: {part} is a file, not a folder; give a "
                              "folder for the checkpoints")


# options of one task only; given a value other than the default on the other task's model,
# they would be recorded and ignored
ONLY = {"encoder": ("head_lr", "epochs", "train_layers"), "lm": ("mask", "steps", "eval_every")}


def check_applies(o: FinetuneOptions, causal: bool) -> None:
    """Refuse an option of the other task (--steps on an encoder, --train-layers on a causal
    LM), in one line, before loading where the config says which."""
    from dataclasses import fields

    task, other = ("lm", "encoder") if causal else ("encoder", "lm")
    defaults = {f.name: f.default for f in fields(o)}
    given = [k for k in ONLY[other] if getattr(o, k) != defaults[k]]
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ConfigError(f"{flags} {'applies' if len(given) == 1 else 'apply'} to {'an encoder' if other == 'encoder' else 'a causal LM'}; "
                          f"{o.model} is {'a causal LM' if causal else 'an encoder'}: drop it")


def run(options: FinetuneOptions, announce: Callable[[str], None] | None = None,
        loaded=None) -> dict[str, pd.DataFrame]:
    from pecli.measures.finetuning import check_train_layers
    from pecli.models.sources import peek

    o = options
    say = announce or (lambda msg: None)
    ref = peek(o.model)
    interventions = list(o.intervention or ())
    if o.model_out is not None:
        check_model_out(Path(o.model_out))
    if loaded is None:
        if ref is not None:
            check_train_layers(o.train_layers, ref.layer_count(), o.model)
        if ref is not None:
            check_applies(o, ref.spec.causal)
        from pecli.positions.conditions import plan

        masked = [plan(o.mask, "log-bias", "relative", "zero")] if o.mask is not None else []
        check_before_loading(o.model, [*interventions, *masked])
    loaded = loaded or load(o.model, o)
    task = "lm" if loaded.spec.causal else "encoder"
    check_applies(o, loaded.spec.causal)
    conds = [names.parse(names.INTERVENTIONS, c) for c in
             (interventions or (LM_CONDITIONS if task == "lm" else ENCODER_CONDITIONS))]
    initial = {k: v.detach().clone() for k, v in loaded.model.state_dict().items()}
    flags = {p: p.requires_grad for p in loaded.model.parameters()}
    try:
        if task == "encoder":
            return {"finetune": _encoder(o, loaded, conds, say)}
        return {"recovery": _lm(o, loaded, conds, say)}
    finally:
        loaded.model.load_state_dict(initial)
        for p, flag in flags.items():
            p.requires_grad_(flag)
        loaded.model.eval()


def _seeds(o: FinetuneOptions) -> list[int]:
    return [o.seed + k for k in range(o.seeds)]


def _common(o, loaded, data, train, task: str) -> dict:
    """Every row's provenance: the test data it is scored on, the training data's digest."""
    return {"experiment": "finetune", "task": task, **row_provenance(), **loaded.provenance(),
            **data.provenance(), "train_data_revision": train.revision,
            "max_length": o.max_length, "train_limit": o.train_limit,
            "lr": o.lr, "seeds": o.seeds, "seed": o.seed}


def _save(o, loaded, label: str, card: dict, head=None) -> str:
    from pecli.measures.training import save_checkpoint
    from pecli.models.loading import weights_sha256

    out = Path(o.model_out) / re.sub(r"[^\w.+=-]", "_", label)
    save_checkpoint(loaded.model, loaded.tokenizer, out, card)
    if head is not None:
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()},
                  str(out / "pecli_head.safetensors"))
    return weights_sha256(out)


# --- encoder: IMDB sentiment --------------------------------------------------------------


def _encoder(o: FinetuneOptions, loaded, conds, say) -> pd.DataFrame:
    from pecli.data.datasets import load_data
    from pecli.measures.finetuning import features, probe_accuracy
    from pecli.measures.intervals import wilson
    from pecli.positions.conditions import check_all, plan
    from pecli.runs.batching import encode

    check_all([plan(intervention=c) for c in conds], loaded)  # as before loading, on the model
    train = load_data("imdb", "train", data_dir_=o.data_dir, limit=o.train_limit, seed=o.seed)
    test = load_data("imdb", "test", data_dir_=o.data_dir, limit=o.limit or DEFAULT_LIMIT["encoder"],
                     seed=o.seed)
    length = min(o.max_length, loaded.max_positions)
    tr = encode(loaded.tokenizer, train.texts(), max_length=length)
    te = encode(loaded.tokenizer, test.texts(), max_length=length)
    ytr, yte = np.asarray(train.labels()), np.asarray(test.labels())
    batch = o.batch or DEFAULT_BATCH["encoder"]
    method = "full fine-tuning" if o.train_layers is None else f"last {o.train_layers} layers"
    common = {**_common(o, loaded, test, train, "sentiment"), "tokens": sum(map(len, te.ids)),
              "train_rows": len(tr.ids), "test_rows": len(te.ids),
              "train_truncated": tr.truncated, "test_truncated": te.truncated,
              "classifier": "linear head on the mean-pooled final hidden state",
              "fine_tuning": method, "position_table": "frozen", "epochs": o.epochs,
              "batch": batch, "head_lr": o.head_lr}
    initial = {k: v.detach().clone() for k, v in loaded.model.state_dict().items()}
    rows, intact = [], None  # intact: its probe's and each seed's per-text 0/1, once computed
    for cond in conds:
        loaded.model.load_state_dict(initial)  # the untrained encoder, not the last condition's fine-tuned one
        with plan(intervention=cond).applied(loaded, o.seed):
            say(f"{cond}: frozen-feature probe")
            right = probe_accuracy(features(loaded, tr.ids), ytr, features(loaded, te.ids), yte)
        tuned, accs = _finetuned_rows(o, loaded, cond, initial, tr.ids, ytr, te.ids, yte,
                                      {**common, "intervention": str(cond)}, say)
        if str(cond) == names.INTACT:
            intact = (right, accs)
        rows.append({**common, "intervention": str(cond), "metric": "probe_accuracy",
                     "value": right.mean(), **_wilson(right, wilson), "seed_run": np.nan,
                     "interval": "Wilson over test texts", "checkpoint_revision": "",
                     **_paired(right, intact and intact[0], cond, o.seed)})
        rows += _with_paired(tuned, accs, intact and intact[1], cond, o.seed)
    from pecli.positions.labels import labelled

    return validate(labelled(pd.DataFrame(rows)))  # each row's `condition`, as every table has


def _paired(right: np.ndarray, reference: np.ndarray | None, cond, seed: int) -> dict:
    """DIFF_COLUMNS of one set of per-text 0/1 against intact's on the same test texts
    (NaN on intact's own rows and where intact was not run)."""
    from pecli.measures.intervals import diff_columns

    if reference is None or str(cond) == names.INTACT:
        return diff_columns(reference_row=True)
    return diff_columns(right, reference, seed=seed)


def _with_paired(rows: list[dict], accs: list, intact: list | None, cond, seed: int) -> list[dict]:
    """A condition's fine-tuning rows with their differences from intact: each seed's against
    intact's same seed (Newcombe's paired interval over the test texts), the mean over seeds with seeds
    and texts resampled together, each seed's per-text difference on the same texts
    (seeds_and_texts_interval(same_texts=True))."""
    from pecli.measures.intervals import DIFF_COLUMNS, seeds_and_texts_interval

    *per_seed, mean = rows
    out = [{**r, **_paired(a, intact and intact[k], cond, seed)}
           for k, (r, a) in enumerate(zip(per_seed, accs, strict=True))]
    diff = _paired(accs[0], intact and intact[0], cond, seed)  # NaN where it has no reference
    if diff[DIFF_COLUMNS[0]] == diff[DIFF_COLUMNS[0]]:
        d = [a - b for a, b in zip(accs, intact, strict=True)]
        diff = dict(zip(DIFF_COLUMNS, (float(np.mean([x.mean() for x in d])),
                                       *seeds_and_texts_interval(d, seed=seed, same_texts=True)),
                        strict=True))
    return [*out, {**mean, **diff}]


def _finetuned_rows(o: FinetuneOptions, loaded, cond, initial: dict, train_ids, ytr, test_ids, yte,
                    common: dict, say) -> list[dict]:
    """One condition's encoder fine-tuned from `initial` under it with each seed: accuracy per
    seed (Wilson over test texts) and the mean over seeds (seeds and test texts resampled
    together: the texts' variance counts, which a t interval over 3 seeds leaves out)."""
    from pecli.measures.finetuning import predict, train_classifier
    from pecli.measures.intervals import seeds_and_texts_interval, wilson
    from pecli.positions.conditions import plan

    batch = o.batch or DEFAULT_BATCH["encoder"]
    method = "full fine-tuning" if o.train_layers is None else f"last {o.train_layers} layers"
    rows, accs = [], []  # accs: each seed's per-text 0/1
    for k, s in enumerate(_seeds(o)):
        loaded.model.load_state_dict(initial)
        with plan(intervention=cond).applied(loaded, o.seed):
            head = train_classifier(
                loaded, train_ids, ytr.tolist(), epochs=o.epochs, batch=batch, lr=o.lr,
                head_lr=o.head_lr, seed=s, train_layers=o.train_layers,
                progress=lambda step, n, loss, c=cond, s=s: say(
                    f"{c}, seed {s}: step {step}/{n}, loss {loss:.3f}") if step % 8 == 0 else None)
            right = (predict(loaded, head, test_ids) == yte).astype(float)
            revision = ""
            if o.model_out and k == 0:
                revision = _save(o, loaded, str(cond), {
                    "trained_by": "pecli finetune", "task": "IMDB sentiment",
                    "intervention": str(cond), "seed": s, "fine_tuning": method,
                    "note": "the encoder; the head is pecli_head.safetensors (linear, on the "
                            "mean-pooled final hidden state); a learned table is saved as "
                            "trained under the intervention"}, head)
        accs.append(right)
        rows.append({**common, "metric": "finetune_accuracy",
                     "value": right.mean(), **_wilson(right, wilson), "seed_run": s,
                     "interval": "Wilson over test texts", "checkpoint_revision": revision})
    low, high = seeds_and_texts_interval(accs, seed=o.seed, same_texts=True)  # every seed on the same test texts
    rows.append({**common, "metric": "finetune_accuracy_mean",
                 "value": float(np.mean([a.mean() for a in accs])), "ci_low": low, "ci_high": high,
                 "seed_run": np.nan,
                 "interval": f"{SEEDS_CROSSED_TEXTS} ({len(accs)} seeds)" if low == low else "",
                 "checkpoint_revision": ""})
    return rows, accs


def _wilson(right: np.ndarray, wilson) -> dict:
    low, high = wilson(int(right.sum()), len(right))
    return {"ci_low": low, "ci_high": high}


# --- causal LM: the recovery curve ------------------------------------------------------


def _lm(o: FinetuneOptions, loaded, conds, say) -> pd.DataFrame:
    from pecli.data.datasets import load_data
    from pecli.measures.intervals import perplexity_intervals as intervals
    from pecli.measures.lm_scoring import score_windows, windows_for
    from pecli.measures.mask_fitting import sequences
    from pecli.positions.conditions import check_all, plan
    from pecli.runs.batching import encode

    masked = [plan(o.mask, "log-bias", "relative", "zero")] if o.mask is not None else []
    check_all([*(plan(intervention=c) for c in conds), *masked], loaded, causal=True)
    starts = [(c, None) for c in conds]
    if o.mask is not None:
        starts.append((names.parse(names.INTERVENTIONS, "zero"), o.mask))
    bos = loaded.tokenizer.bos_token_id
    length = min(o.max_length, loaded.max_positions)
    train = load_data("imdb", "train", data_dir_=o.data_dir, limit=o.train_limit, seed=o.seed)
    test = load_data("imdb", "test", data_dir_=o.data_dir, limit=o.limit or DEFAULT_LIMIT["lm"],
                     seed=o.seed)
    seqs = sequences(loaded.tokenizer, train.texts(), length, bos)
    ids = encode(loaded.tokenizer, test.texts(), max_length=10**12, add_special_tokens=False).ids
    prepared = windows_for(ids, length, bos, "truncate")
    batch = o.batch or DEFAULT_BATCH["lm"]

    def held_out() -> list[torch.Tensor]:  # each held-out text's NLL per token
        with torch.inference_mode():
            return [n for n in score_windows(loaded, prepared.windows) if n.numel()]

    common = {**_common(o, loaded, test, train, "language modelling"), "tokens": prepared.tokens,
              "train_rows": len(seqs), "truncated": prepared.truncated, "steps": o.steps,
              "batch": batch, "fine_tuning": "full fine-tuning (position table frozen)",
              "start_token": prepared.start_token}
    intact = held_out()
    intact_ppl = _corpus(intact)
    low, high = intervals(intact, o.bootstrap, o.seed)["corpus"]
    target = (1 + WITHIN) * intact_ppl
    rows = [{**common, "intervention": names.INTACT, "mask": "default", "condition": "intact, untrained",
             "metric": "intact_perplexity", "step": 0, "value": intact_ppl, "ci_low": low,
             "ci_high": high, "seed_run": np.nan, "interval": "bootstrap over texts"}]
    initial = {k: v.detach().clone() for k, v in loaded.model.state_dict().items()}
    for cond, mask in starts:
        label = str(cond) + (f" + {mask}" if mask is not None else "")
        base = {**common, "intervention": str(cond), "mask": str(mask or "default"),
                "mask_semantics": "log-bias" if mask is not None else "", "condition": label}
        rows += _recovery_rows(o, loaded, cond, mask, initial, seqs, held_out, target, base, say)
    return validate(pd.DataFrame(rows))


def _corpus(nlls: list[torch.Tensor]) -> float:
    """Corpus perplexity: exp of the mean NLL over every token of every text."""
    return float(np.exp(torch.cat(nlls).double().mean().item()))


def _recovery_rows(o: FinetuneOptions, loaded, cond, mask, initial: dict, seqs, held_out,
                   target: float, base: dict, say) -> list[dict]:
    """One starting condition (an intervention, and a mask under log-bias) trained from
    `initial` with each seed: its held-out perplexity curve (`held_out`: each text's NLLs), the
    steps to within 10 % of the intact model's (`target`), and the means over seeds with an
    interval over seeds and held-out texts together."""
    from pecli.measures.finetuning import steps_to_within, train_lm
    from pecli.measures.intervals import seeds_and_texts_interval
    from pecli.positions.conditions import plan

    batch = o.batch or DEFAULT_BATCH["lm"]
    label = base["condition"]
    rows = []
    curves, texts, reached = {}, {}, []
    for k, s in enumerate(_seeds(o)):
        loaded.model.load_state_dict(initial)
        texts[s] = evaluated = []  # per evaluation: each held-out text's NLLs

        def evaluate(evaluated=evaluated) -> float:
            evaluated.append(held_out())
            return _corpus(evaluated[-1])

        with plan(mask or "default", "log-bias", "relative", cond).applied(loaded, o.seed):
            curve = train_lm(loaded, seqs, steps=o.steps, batch=batch, lr=o.lr, seed=s,
                             eval_every=o.eval_every, evaluate=evaluate,
                             progress=lambda step, loss, lb=label, s=s: say(
                                 f"{lb}, seed {s}: step {step}/{o.steps}, loss {loss:.3f}")
                             if step % 10 == 0 else None)
            revision = ""
            if o.model_out and k == 0:
                revision = _save(o, loaded, label, {
                    "trained_by": "pecli finetune", "task": "language modelling (IMDB train)",
                    "intervention": str(cond), "mask": str(mask or "default"), "seed": s,
                    "steps": o.steps, "note": "trained with this intervention (and mask, "
                    "log-bias): evaluate it under the same (a learned table is saved as "
                    "trained; a rotary model's rotation is not in the checkpoint: give "
                    "--intervention zero)"})
        curves[s] = curve
        hit = steps_to_within([(st, v) for st, _, v in curve], target)
        reached.append(hit)
        for st, loss, v in curve:
            rows.append({**base, "metric": "perplexity", "step": st, "value": v,
                         "train_loss": loss, "ci_low": np.nan, "ci_high": np.nan,
                         "seed_run": s, "interval": "", "checkpoint_revision": revision})
        rows.append({**base, "metric": "steps_to_within_10pct", "step": np.nan, "value": hit,
                     "ci_low": np.nan, "ci_high": np.nan, "seed_run": s, "interval": "",
                     "target_perplexity": target, "checkpoint_revision": revision})
    for i, (st, _, _) in enumerate(next(iter(curves.values()))):
        nlls = [texts[s][i] for s in curves]  # [seed][text]: this evaluation's NLLs
        low, high = seeds_and_texts_interval(
            [[float(n.double().mean()) for n in seed_nlls] for seed_nlls in nlls],
            weights=[[n.numel() for n in seed_nlls] for seed_nlls in nlls],
            transform=np.exp, n_boot=o.bootstrap, seed=o.seed,
            same_texts=True)  # each seed's corpus perplexity, every seed on the same held-out texts
        rows.append({**base, "metric": "perplexity_mean", "step": st,
                     "value": float(np.mean([c[i][2] for c in curves.values()])),
                     "ci_low": low, "ci_high": high, "seed_run": np.nan,
                     "interval": f"{SEEDS_CROSSED_TEXTS} ({len(curves)} seeds)" if low == low else ""})
    done = [r for r in reached if r == r]
    rows.append({**base, "metric": "seeds_within_10pct", "step": np.nan,
                 "value": float(len(done)), "ci_low": np.nan, "ci_high": np.nan,
                 "seed_run": np.nan, "target_perplexity": target,
                 "interval": f"of {len(reached)} seeds",
                 "steps_mean": float(np.mean(done)) if done else np.nan})
    return rows


register("finetune", 1, run, FinetuneOptions, "pecli.plots.finetune:figures",
         "Fine-tuning after positions are removed: an encoder on IMDB sentiment (with the "
         "frozen-feature probe beside), a causal LM's recovery curve of held-out perplexity",
         headlines=(
             Headline("finetune_accuracy_mean", "IMDB sentiment accuracy after fine-tuning", {},
                      ("intervention",), reference=((0.5, "chance"),),
                      interval=SEEDS_CROSSED_TEXTS),
             Headline("probe_accuracy", "IMDB sentiment accuracy of the frozen-feature probe", {},
                      ("intervention",), name="finetune_probe_accuracy",
                      interval="95 % Wilson score interval over test texts"),
             Headline("perplexity_mean", "held-out perplexity while fine-tuning without positions", {},
                      ("condition",), name="finetune_perplexity",
                      slot=lambda r: f"step {int(r['step'])}", axis="perplexity",
                      interval=SEEDS_CROSSED_TEXTS)))
