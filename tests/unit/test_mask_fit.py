"""Fitted masks (`pecli mask fit`): the forms, the file they are saved as, the fit, the gap closed."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pecli.measures.mask_fitting import batch_order, fit, gap_closed, gap_interval
from pecli.positions.masks import (
    FittedMask,
    alibi_slopes,
    bucket_edges,
    form_bias,
    load_fitted,
    masked_attention,
)
from pecli.runs import names
from pecli.runs.batching import pad
from pecli.runs.errors import ConfigError

SEQS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [14, 15, 16, 17]]


def _logits(loaded, side="right"):
    ids, mask = pad(SEQS, loaded.tokenizer.pad_token_id, torch.device("cpu"), side)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = loaded.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    return torch.cat([out[i][mask[i].bool()] for i in range(len(SEQS))])


def _literal_alibi(slopes):
    """ALiBi written out (Press et al. 2022): softmax(q.k / sqrt(d) - slope_h * (i - j)) over
    the causal, unpadded keys, then times v. No pecli code."""
    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        b, h, t, d = query.shape
        key = key.repeat_interleave(h // key.shape[1], dim=1)
        value = value.repeat_interleave(h // value.shape[1], dim=1)
        logits = query @ key.transpose(-1, -2) * (scaling or d ** -0.5)  # [b, h, t, t]
        visible = attention_mask[:, :1] if attention_mask.dtype == torch.bool else attention_mask[:, :1] == 0
        real = visible.any(-2)  # [b, 1, t]: keys some query sees
        index = real.long().cumsum(-1) - 1  # real-token index of each key
        distance = (index[..., :, None] - index[..., None, :]).float()  # [b, 1, t, t]
        logits = logits - slopes.view(1, h, 1, 1) * distance
        logits = logits.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(logits, -1).nan_to_num(0.0)
        return (probs @ value).transpose(1, 2).contiguous(), probs
    return attention


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_fitted_slope_mask_at_alibis_slopes_is_literal_alibi(tiny, tmp_path, family):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    loaded = tiny(family)
    heads = loaded.model.config.num_attention_heads
    slopes = alibi_slopes(heads)
    mask = FittedMask("slope", tuple((float(s),) for s in slopes), heads)
    name = mask.save(tmp_path / "mask.json")  # through the file, as a user gives it back
    AttentionInterface.register("literal_alibi_test", _literal_alibi(slopes))
    AttentionMaskInterface.register("literal_alibi_test", sdpa_mask)
    old = loaded.model.config._attn_implementation
    loaded.model.set_attn_implementation("literal_alibi_test")
    literal = _logits(loaded)
    loaded.model.set_attn_implementation(old)
    for side in ("right", "left"):
        with masked_attention(loaded.model, name, "log-bias"):
            ours = _logits(loaded, side)
        assert torch.allclose(ours, literal, atol=1e-5), side
    with masked_attention(loaded.model, "alibi", "log-bias"):  # pecli's named alibi shape, too
        assert torch.allclose(_logits(loaded), literal, atol=1e-5)
    assert (literal - _logits(loaded)).abs().max() > 1e-3  # ALiBi changes the model


def test_every_form_is_a_bias_of_the_distance():
    dist = torch.arange(10.0).view(1, 1, 1, -1)
    span = torch.full((1, 1, 1, 1), 9.0)
    edges = bucket_edges(9)
    assert edges == (0, 1, 2, 3, 4, 6, 8)
    b = form_bias("bucket", torch.tensor([[0.0, -1, -2, -3, -4, -5, -6]]), dist, span, edges)[0, 0, 0]
    assert b.tolist() == [0, -1, -2, -3, -4, -4, -5, -5, -6, -6]  # 4-5, 6-7, 8+ share a bucket
    shifted = form_bias("bucket", torch.tensor([[3.0, 2, 1, 0, -1, -2, -3]]), dist, span, edges)
    assert torch.equal(shifted[0, 0, 0], b)  # the largest weight is 1 (a shift: log-bias ignores it)
    s = form_bias("slope", torch.tensor([[0.5], [0.25]]), dist, span)[0, :, 0]
    assert torch.equal(s, torch.stack([-0.5 * torch.arange(10.0), -0.25 * torch.arange(10.0)]))
    lin = form_bias("linear", torch.tensor([[0.1]]), dist, span)[0, 0, 0].exp()
    # the study's mask (STUDY.md E3): 1 at the newest key to 0.1 at the oldest, linearly
    assert torch.allclose(lin, 1 - 0.9 * torch.arange(10.0) / 9)
    assert form_bias("slope", torch.tensor([[5.0]]), dist * 100, span).min() == -80.0  # floor


def test_the_mask_file_round_trips_and_its_hash_is_checked(tmp_path):
    mask = FittedMask("bucket-head", ((0.0, -1.0), (-0.5, 0.0)), 2, (0, 1), {"model": "x"})
    name = mask.save(tmp_path / "m.json")
    path = str(tmp_path / "m.json")
    digest = name.rpartition(names.HASH_MARK)[2]
    assert name == f"file:{path}{names.HASH_MARK}{digest}" and len(digest) == 16
    for given in (path, f"file:{path}", name):  # a path, file:PATH and the full name agree
        assert str(names.parse(names.MASKS, given)) == name
    back = load_fitted(name)
    assert back.values == mask.values and back.edges == mask.edges and back.parameters == 4
    assert json.loads((tmp_path / "m.json").read_text())["semantics"] == "log-bias"
    (tmp_path / "m.json").write_text((tmp_path / "m.json").read_text().replace("-1.0", "-2.0"))
    with pytest.raises(ConfigError, match="has changed"):
        names.parse(names.MASKS, name)
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(ConfigError, match="not a pecli mask file"):
        names.parse(names.MASKS, str(tmp_path / "other.json"))
    with pytest.raises(ConfigError, match="No such file"):
        names.parse(names.MASKS, str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="unknown mask"):  # a plain typo is still a typo
        names.parse(names.MASKS, "linaer")


def test_gap_closed_is_the_formula_and_its_interval_pairs_texts():
    z, f, i = math.log(712014.3125), math.log(11897.4824), math.log(111.2409)  # the study's gpt2
    assert gap_closed(z, f, i) == (z - f) / (z - i)
    assert gap_closed(z, f, i) == pytest.approx(0.4669, abs=1e-4)
    assert gap_closed(z, i, i) == 1.0 and gap_closed(z, z, i) == 0.0
    import numpy as np

    counts = np.array([10.0, 20.0, 30.0])
    sums = {"zero": 5 * counts, "intact": 2 * counts, "x": 3 * counts}  # every text: gap 2/3
    # the same gap on every text: the resamples cannot vary, so no interval (not [2/3, 2/3])
    assert np.isnan(gap_interval(sums, counts, "x", 200, 0)).all()


def test_fitting_is_deterministic_and_leaves_the_model_as_it_was(tiny):
    loaded = tiny("gpt2")
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    seqs = [list(range(3, 3 + n)) for n in (12, 9, 15, 7, 11, 8)]
    runs = [fit(loaded, "bucket-head", seqs, steps=4, lr=0.1, batch=3, seed=1) for _ in range(2)]
    assert runs[0][0].values == runs[1][0].values and runs[0][1] == runs[1][1]
    assert runs[0][0].values != fit(loaded, "bucket-head", seqs, steps=4, lr=0.1, batch=3, seed=2)[0].values
    assert any(v != 0 for r in runs[0][0].values for v in r)  # it moved from the default mask
    after = loaded.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.requires_grad for p in loaded.model.parameters())
    assert loaded.model.config._attn_implementation != "" and "pecli" not in str(
        loaded.model.config._attn_implementation)
    assert batch_order(5, 3, 2, 0) == batch_order(5, 3, 2, 0)


def test_gap_closed_is_undefined_without_a_gap():
    """Issue 46 §1: positions removed not worse than intact: no share of a gap to close (NaN,
    printed "undefined"), not +46262.2 % on its interval's edge."""
    from pecli.cli.mask import _gap

    assert math.isnan(gap_closed(2.0, 1.5, 2.0)) and math.isnan(gap_closed(1.9, 1.5, 2.0))
    assert _gap({"gap_closed": math.nan, "gap_ci_low": math.nan, "gap_ci_high": math.nan}) == \
        "undefined (no gap)"
