"""`pecli.measures.recovery` and the input side of `pe-recover`, against direct computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pecli.experiments.recover import input_level, real_vocabulary
from pecli.measures import recovery as rc
from pecli.measures.pe_analysis import RidgeLOO
from pecli.models.architectures import ARCHITECTURES, position_embedding


def _cos_argmax(q, rows):
    """The direct computation: a Python loop over every candidate."""
    best, arg = -np.inf, -1
    for j, r in enumerate(rows):
        s = float(q @ r) / (np.linalg.norm(q) * np.linalg.norm(r))
        if s > best:
            best, arg = s, j
    return arg


def test_decoders_agree_with_a_direct_computation():
    rng = np.random.default_rng(0)
    vocab, positions = rng.normal(size=(12, 6)), rng.normal(size=(5, 6)) * 0.8
    sample = np.array([1, 4, 7, 11])
    x = vocab[sample][:, None] + positions[None]  # [T, P, d]
    decoded = rc.decode_tokens(x, vocab)
    assert decoded.shape == (4, 5)
    for t in range(4):
        for p in range(5):
            assert decoded[t, p] == _cos_argmax(x[t, p], vocab)
            residual = x[t, p] - vocab[decoded[t, p]]
            assert rc.token_then_position(x, decoded, vocab, positions)[t, p] == \
                _cos_argmax(residual, positions)
    known = rc.extract_known_token(x, vocab[sample], positions)
    assert known.max_abs_error < 1e-12 and known.row_accuracy == 1.0


def test_zero_position_rows_give_the_ceiling_exactly(tiny):
    loaded = tiny("gpt2")
    with torch.no_grad():
        position_embedding(loaded.model, loaded.spec).weight.zero_()
    by_position, summary = input_level(loaded, tokens=8, folds=2, seed=0, n_boot=20, say=print)
    learned = {r["metric"]: r["value"] for r in summary if r["condition"] == "learned"}
    assert learned["token_accuracy"] == learned["token_accuracy_ceiling"]
    curve = [r["value"] for r in by_position if r["condition"] == "learned"]
    ceiling = [r["value"] for r in by_position if r["condition"] == "none"]
    assert curve == ceiling and len(curve) == 64


def test_huge_position_rows_drive_token_accuracy_to_chance(tiny):
    loaded = tiny("bert")  # LayerNorm after the sum: x is nearly LN(E_pos[p]) alone
    with torch.no_grad():
        position_embedding(loaded.model, loaded.spec).weight.mul_(1e4)
    tokens = 16
    _, summary = input_level(loaded, tokens=tokens, folds=2, seed=0, n_boot=0, say=print)
    learned = {r["metric"]: r["value"] for r in summary if r["condition"] == "learned"}
    # A decoder that no longer sees the token names one token per position: right for at
    # most one of the 16 distinct sampled tokens there.
    assert learned["token_accuracy"] <= 1 / tokens
    assert learned["token_accuracy_ceiling"] == 1.0


def test_chance_exactly_when_positions_dominate_a_full_vocabulary():
    rng = np.random.default_rng(1)
    vocab, positions = rng.normal(size=(20, 8)), 1e6 * rng.normal(size=(7, 8))
    x = vocab[:, None] + positions[None]  # every token at every position
    correct = rc.decode_tokens(x, vocab) == np.arange(20)[:, None]
    assert correct.mean() == pytest.approx(1 / 20)  # one token per position, 1 / V
    assert (correct.sum(0) == 1).all()


def test_embedding_stage_is_the_models_own_sum_and_norm(tiny):
    from pecli.experiments.recover import embedding_stage

    ids, pos = np.array([5, 9, 300]), np.array([0, 3, 63])
    gpt2 = tiny("gpt2")
    base = gpt2.model.transformer
    direct = (base.wte.weight[ids] + base.wpe.weight[pos]).detach().numpy()
    np.testing.assert_allclose(embedding_stage(gpt2, ids, pos), direct, rtol=0, atol=1e-6)
    bert = tiny("bert")
    emb = bert.model.embeddings
    s = emb.word_embeddings.weight[ids] + emb.position_embeddings.weight[pos] + emb.token_type_embeddings.weight[0]
    direct = torch.nn.functional.layer_norm(s, (s.shape[-1],), emb.LayerNorm.weight, emb.LayerNorm.bias,
                                            emb.LayerNorm.eps).detach().numpy()
    np.testing.assert_allclose(embedding_stage(bert, ids, pos), direct, rtol=0, atol=1e-5)



LEARNED_FAMILIES = [f for f in ARCHITECTURES.names() if ARCHITECTURES.get(f).position == "learned"]


@pytest.mark.parametrize("family", LEARNED_FAMILIES)
def test_embedding_stage_equals_what_the_first_block_receives_in_a_whole_sequence(family, tiny):
    """Against the model placing positions itself (no position_ids passed): a token's embedding
    stage does not depend on its neighbours, so token i alone at position i must equal row i of
    a whole sequence's first-block input. Catches an offset added twice (OPT adds its own)."""
    from pecli.experiments.recover import embedding_stage
    from pecli.models.architectures import resolve

    loaded = tiny(family)
    ids = torch.randint(5, 200, (1, 40), generator=torch.Generator().manual_seed(0))
    seen = []
    first = resolve(loaded.model, loaded.spec, loaded.spec.layers)[0]
    handle = first.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(args[0] if args else kwargs["hidden_states"]),
        with_kwargs=True)
    with torch.inference_mode():
        getattr(loaded.model, "base_model", loaded.model)(input_ids=ids, attention_mask=torch.ones_like(ids))
    handle.remove()
    whole = seen[0][0].numpy()
    alone = embedding_stage(loaded, ids[0].numpy(), np.arange(40))
    np.testing.assert_allclose(alone, whole, rtol=0, atol=1e-5)

def test_real_vocabulary_drops_special_and_unused_rows(tiny):
    tok = tiny("bert").tokenizer
    real = set(real_vocabulary(tok, 30522).tolist())
    names = tok.convert_ids_to_tokens
    assert not any(names(i).startswith("[unused") for i in real)
    assert not set(tok.all_special_ids) & real
    assert tok.convert_tokens_to_ids("film") in real and len(real) > 29000


def test_multi_output_ridge_equals_one_fit_per_column():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(40, 6)), rng.normal(size=(40, 3))
    joint = RidgeLOO(alphas=(0.7,)).fit(x, y)
    for j in range(3):
        single = RidgeLOO(alphas=(0.7,)).fit(x, y[:, j])
        np.testing.assert_allclose(joint.coef[:, j], single.coef, atol=1e-12)
        np.testing.assert_allclose(joint.predict(x)[:, j], single.predict(x), atol=1e-12)


def test_ridge_classify_separable_and_random_labels():
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(4, 10)) * 5
    labels = rng.integers(0, 4, 200)
    groups = np.arange(200) // 10
    x = centres[labels] + rng.normal(size=(200, 10)) * 0.1
    assert rc.ridge_classify(x, labels, groups=groups, folds=4).correct.all()
    noise = rc.ridge_classify(rng.normal(size=(200, 10)), labels, groups=groups, folds=4)
    assert noise.correct.mean() < 0.45  # 4 classes: chance about 0.25
