"""Scoring from the final hidden states in chunks of rows (a 262k vocabulary's logits never
whole) equals the loss from the model's own full logits, soft-capping included."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny

from pecli.measures.mask_fitting import lm_loss
from pecli.measures.metrics import HEAD_CHUNK, head_nll

CASES = [("gemma3", {}), ("gemma3", {"final_logit_softcapping": 3.0}), ("llama", {}), ("gpt2", {})]


def _ids(loaded, n=6, length=60, seed=3):  # 354 rows: more than one chunk holds
    assert n * (length - 1) > HEAD_CHUNK
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(5, 200, (n, length), generator=gen)


def _plain_nll(model, ids, mask):
    """The model's own forward, every logit at once, and cross-entropy on them."""
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1]
    target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).double(), target.flatten(),
                                             ignore_index=-100, reduction="none")


@pytest.mark.parametrize("family,overrides", CASES)
def test_chunked_nll_equals_the_full_logits_loss(family, overrides):
    loaded = make_tiny(family, **overrides)
    model, ids = loaded.model, _ids(loaded)
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        chunked = head_nll(model, hidden[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        plain = _plain_nll(model, ids, mask)
    if "final_logit_softcapping" in overrides:  # the cap acts: leaving it out would differ
        raw = torch.nn.functional.cross_entropy(model.get_output_embeddings()(hidden[:, :-1])
                                                .flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
        assert (raw - plain).abs().max() > 1e-3
    torch.testing.assert_close(chunked.double(), plain, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family,overrides", CASES)
def test_training_loss_and_its_gradient_equal_the_full_logits_ones(family, overrides):
    """lm_loss (mask fitting, fine-tuning): the head's chunks recomputed in the backward pass."""
    loaded = make_tiny(family, **overrides)
    model, ids = loaded.model, _ids(loaded)
    lengths = [60] * 5 + [40]  # 334 targets, over two chunks; right padding on the last
    seqs = [row[:n].tolist() for row, n in zip(ids, lengths, strict=True)]
    loss = lm_loss(model, seqs, loaded.tokenizer.pad_token_id, torch.device("cpu"))
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    mask = (torch.arange(60)[None] < torch.tensor(lengths)[:, None]).long()
    padded = ids.masked_fill(mask == 0, loaded.tokenizer.pad_token_id)
    logits = model(input_ids=padded, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                   use_cache=False).logits[:, :-1]
    target = padded[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    plain = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)
    plain_grads = torch.autograd.grad(plain, list(model.parameters()), allow_unused=True)
    torch.testing.assert_close(loss, plain, rtol=1e-6, atol=0)
    for a, b in zip(grads, plain_grads, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
