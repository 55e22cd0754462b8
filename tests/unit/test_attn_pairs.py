"""attn's paired differences from intact, against the paired bootstrap written out literally:
resample texts, take the same texts' mean under both conditions, difference, percentiles."""

from __future__ import annotations

import numpy as np

from pecli.experiments.attn import HEAD_METRICS, head_rows
from pecli.experiments.options.attn import AttnOptions


class _Stats:  # head_rows reads only the rotary frequency usage from the capture
    def frequency_usage(self):
        return None


def _values(rng, texts=9, layers=2, heads=3, shift=0.0):
    per = {m: rng.random((texts, layers, heads)) + shift for m in HEAD_METRICS}
    per["sink"] = (per["first_token_mass"] > 0.3).astype(np.float64)
    return per


def _literal(x, r, n_boot, seed):
    idx = np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))
    d = x[idx].mean(1) - r[idx].mean(1)
    return np.percentile(d, [2.5, 97.5])


def test_attn_differences_are_the_paired_bootstrap_over_texts():
    rng = np.random.default_rng(3)
    reference = _values(rng)
    # the condition shares each text's variation with intact (plus its own noise): pairing matters
    per = {m: v + 0.05 + 0.02 * rng.standard_normal(v.shape) for m, v in reference.items()}
    o = AttnOptions.build({"model": "random:llama", "bootstrap": 500, "seed": 7}, where="test")
    rows = head_rows(_Stats(), {"condition": "zero"}, o, ["sliding_attention", "full_attention"],
                     per, reference)
    checked = 0
    for row in rows:
        layer, head = row["layer"], row["head"]
        select = {"model": lambda v: v.mean((1, 2)), "layer": lambda v, i=layer: v[:, i].mean(1),
                  "head": lambda v, i=layer, j=head: v[:, i, j]}.get(row["scope"])
        if select is None:
            continue
        name = "sink" if row["metric"] == "sink_rate" else row["metric"]
        x, r = select(per[name]), select(reference[name])
        assert abs(row["diff_vs_intact"] - (x.mean() - r.mean())) < 1e-12
        low, high = _literal(x, r, 500, 7)
        if np.isclose(low, high):  # every text the same difference: no interval (issue 46)
            assert np.isnan(row["diff_ci_low"])
            continue
        assert np.allclose([row["diff_ci_low"], row["diff_ci_high"]], [low, high]), row
        checked += 1
    assert checked > 20
    by_type = [r for r in rows if r["scope"] == "layer_type" and r["metric"] == "entropy"]
    assert [r["layer_type"] for r in by_type] == ["sliding_attention", "full_attention"]
    assert abs(by_type[0]["diff_vs_intact"] - (per["entropy"][:, 0] - reference["entropy"][:, 0]).mean()) < 1e-12


def test_intact_rows_have_blank_differences():
    rng = np.random.default_rng(0)
    o = AttnOptions.build({"model": "random:llama", "bootstrap": 200}, where="test")
    rows = head_rows(_Stats(), {"condition": "intact"}, o, ["full_attention"] * 2, _values(rng), None)
    assert rows and all(np.isnan(r["diff_vs_intact"]) and np.isnan(r["diff_ci_low"]) for r in rows)


def _probe(rng, texts=12, chance=16.5, vector=8.0, norm=13.0):
    """probe_values' output for two layers: each text's MAE from the vector, the norm and chance."""
    return [{"vector": vector + rng.random(texts), "norm": norm + rng.random(texts),
             "chance": chance + 0.1 * rng.random(texts), "positions": 32, "folds": 5} for _ in range(2)]


def test_position_probe_differences_are_paired_over_texts():
    """attn_probe: each MAE's difference from intact is the paired bootstrap of the per-text
    MAEs; the norm's share, (chance - norm) / (chance - vector) summed over texts, differs
    from intact's by the share of the same resampled texts under each (literal here)."""
    from pecli.experiments.attn import probe_rows

    rng = np.random.default_rng(5)
    o = AttnOptions.build({"bootstrap": 400, "seed": 2}, "t")
    intact, zero = _probe(rng), _probe(rng, vector=6.0, norm=10.0)
    assert np.isnan([r[c] for r in probe_rows(intact, {}, o) for c in ("diff_vs_intact", "diff_ci_low")]).all()
    rows = probe_rows(zero, {}, o, intact)
    mae = next(r for r in rows if r["layer"] == 1 and r["features"] == "vector")
    x, r = zero[1]["vector"], intact[1]["vector"]
    assert mae["diff_vs_intact"] == x.mean() - r.mean()
    assert np.allclose([mae["diff_ci_low"], mae["diff_ci_high"]], _literal(x, r, 400, 2), atol=1e-12)
    got = next(r for r in rows if r["layer"] == 1 and r["metric"] == "norm_share")
    idx = np.random.default_rng(2).integers(0, 12, size=(400, 12))

    def share(v, i=slice(None)):
        return (v["chance"][i] - v["norm"][i]).sum(-1) / (v["chance"][i] - v["vector"][i]).sum(-1)

    assert got["diff_vs_intact"] == np.float64(share(zero[1]) - share(intact[1])).item()
    want = np.percentile(share(zero[1], idx) - share(intact[1], idx), [2.5, 97.5])
    assert np.allclose([got["diff_ci_low"], got["diff_ci_high"]], want, atol=1e-12)
    assert got["diff_ci_low"] < got["diff_vs_intact"] < got["diff_ci_high"]


def test_no_share_difference_where_either_probe_does_not_beat_chance():
    from pecli.experiments.attn import probe_rows

    rng = np.random.default_rng(6)
    o = AttnOptions.build({"bootstrap": 200}, "t")
    blind = _probe(rng, vector=17.0)  # the whole vector's probe worse than chance
    for cond, ref in ((blind, _probe(rng)), (_probe(rng), blind)):
        share = [r for r in probe_rows(cond, {}, o, ref) if r["metric"] == "norm_share"]
        assert all(np.isnan(r["diff_vs_intact"]) for r in share)
