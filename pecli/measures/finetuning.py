"""Fine-tuning with positions removed (the study's open questions 1 and 3): the training
loops `pecli finetune` runs, deterministic for a seed on CPU.

- `train_classifier`: an encoder (any BERT-family model pecli loads) with a linear head on
  its mean-pooled final hidden state (the same features as pecli's frozen-feature probe),
  trained end to end on labelled texts (full fine-tuning, or only the last `train_layers`
  layers and the head). The position table is frozen in every condition, so `zero` stays
  zero and `shuffle` stays the same permutation while everything else learns.
- `train_lm`: a causal LM trained on the next-token loss (pecli.measures.mask_fitting.lm_loss)
  for `steps` steps, its held-out perplexity measured every `eval_every` steps (and at 0).

The caller enters the condition (an intervention, a mask) around the loop: the loops train
whatever the model computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from pecli.measures.mask_fitting import batch_order, lm_loss
from pecli.models.architectures import (
    DISENTANGLED,
    LEARNED,
    RELATIVE_BIAS,
    position_embedding,
    resolve,
)
from pecli.runs.batching import pad
from pecli.runs.errors import ConfigError


def freeze_positions(loaded) -> list[torch.nn.Parameter]:
    """Set requires_grad False on the model's position table (learned or relative bias; DeBERTa:
    its relative embeddings and the norm they pass through), if it has one; returns the
    parameters frozen."""
    spec = loaded.spec
    if spec.position == DISENTANGLED:
        encoder = resolve(loaded.model, spec, spec.bias)
        params = [encoder.rel_embeddings.weight, *getattr(encoder, "LayerNorm", torch.nn.Identity()).parameters()]
        for p in params:
            p.requires_grad_(False)
        return params
    if spec.position == LEARNED:
        table = position_embedding(loaded.model, spec)
    elif spec.position == RELATIVE_BIAS:
        table = resolve(loaded.model, spec, spec.bias)
    else:  # rotary, alibi: nothing learned to freeze
        return []
    table.weight.requires_grad_(False)
    return [table.weight]


def layer_modules(loaded) -> list[torch.nn.Module]:
    return list(resolve(loaded.model, loaded.spec, loaded.spec.layers))


def check_train_layers(train_layers: int | None, layers: int | None, model: str) -> None:
    """--train-layers N needs N <= the model's layers (None: not known yet, or every layer)."""
    if train_layers is not None and layers is not None and train_layers > layers:
        raise ConfigError(f"train_layers (--train-layers): {model} has {layers} layers; give at "
                          f"most {layers} (or leave it out to train every layer)")


def trainable(loaded, train_layers: int | None) -> None:
    """Full fine-tuning (None) or only the last `train_layers` layers (and any head)."""
    if train_layers is None:
        for p in loaded.model.parameters():
            p.requires_grad_(True)
    else:
        for p in loaded.model.parameters():
            p.requires_grad_(False)
        layers = layer_modules(loaded)
        check_train_layers(train_layers, len(layers), loaded.name)
        for layer in layers[len(layers) - train_layers:]:
            for p in layer.parameters():
                p.requires_grad_(True)
    freeze_positions(loaded)


def pooled(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the final hidden state over real tokens: [b, d]."""
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state  # [b, t, d]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


def train_classifier(loaded, train_ids: list[list[int]], train_labels: list[int], *, epochs: int,
                     batch: int, lr: float, head_lr: float, seed: int, train_layers: int | None,
                     progress: Callable[[int, int, float], None] | None = None) -> torch.nn.Linear:
    """Fine-tune `loaded.model` (in place) and a new linear head for len(set(labels)) classes;
    returns the head. Seeded: the head's init and the batch order."""
    torch.manual_seed(seed)
    classes = int(max(train_labels)) + 1
    width = loaded.model.config.hidden_size
    head = torch.nn.Linear(width, classes).to(loaded.device)
    trainable(loaded, train_layers)
    params = [p for p in loaded.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": params, "lr": lr}, {"params": head.parameters(), "lr": head_lr}],
                            weight_decay=0.01)
    steps = math.ceil(len(train_ids) / batch) * epochs
    order = batch_order(len(train_ids), steps, batch, seed)
    labels = torch.tensor(train_labels)
    loaded.model.train()
    pad_id = loaded.tokenizer.pad_token_id
    for step, idx in enumerate(order):
        ids, mask = pad([train_ids[i] for i in idx], pad_id, loaded.device, "right")
        loss = torch.nn.functional.cross_entropy(head(pooled(loaded.model, ids, mask)),
                                                 labels[idx].to(loaded.device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if progress:
            progress(step + 1, steps, loss.item())
    loaded.model.eval()
    return head


@torch.inference_mode()
def features(loaded, ids: list[list[int]], batch: int = 32) -> np.ndarray:
    """Mean-pooled final hidden states [n, d] (the frozen-feature probe's features)."""
    out = []
    for i in range(0, len(ids), batch):
        x, mask = pad(ids[i:i + batch], loaded.tokenizer.pad_token_id, loaded.device, "right")
        out.append(pooled(loaded.model, x, mask).float().cpu())
    return torch.cat(out).numpy()


def predict(loaded, head: torch.nn.Linear, ids: list[list[int]], batch: int = 32) -> np.ndarray:
    with torch.inference_mode():
        x = torch.from_numpy(features(loaded, ids, batch)).to(loaded.device)
        return head(x).argmax(-1).cpu().numpy()


def probe_accuracy(train_x: np.ndarray, train_y, test_x: np.ndarray, test_y) -> np.ndarray:
    """pecli's frozen-feature probe (ablate --probe: standardised logistic regression) fitted
    on the training texts' features, right (1) or wrong (0) on each test text."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    clf.fit(train_x, train_y)
    return (clf.predict(test_x) == np.asarray(test_y)).astype(float)


def train_lm(loaded, seqs: list[list[int]], *, steps: int, batch: int, lr: float, seed: int,
             eval_every: int, evaluate: Callable[[], float],
             progress: Callable[[int, float], None] | None = None) -> list[tuple[int, float, float]]:
    """Fine-tune a causal LM in place (AdamW, every parameter but a position table); returns
    (step, train loss, held-out value) at step 0 and every `eval_every` steps and the last
    (train loss NaN at step 0). `evaluate()` gives the held-out value under the current weights."""
    torch.manual_seed(seed)
    trainable(loaded, None)
    params = [p for p in loaded.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    pad_id = loaded.tokenizer.pad_token_id
    curve = [(0, float("nan"), evaluate())]
    loaded.model.train()
    for step, idx in enumerate(batch_order(len(seqs), steps, batch, seed), start=1):
        loss = lm_loss(loaded.model, [seqs[i] for i in idx], pad_id, loaded.device)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if progress:
            progress(step, loss.item())
        if step % eval_every == 0 or step == steps:
            loaded.model.eval()
            curve.append((step, loss.item(), evaluate()))
            loaded.model.train()
    loaded.model.eval()
    return curve


def steps_to_within(curve: list[tuple[int, float]], target: float) -> float:
    """The first step whose held-out value is at most `target` (NaN if none)."""
    return next((float(s) for s, v in curve if v <= target), float("nan"))
