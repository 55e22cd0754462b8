"""`pecli attn` end to end on tiny models (CliRunner): tables, figures, one-line errors."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest


@pytest.fixture
def docs(tmp_path):
    path = tmp_path / "docs.csv"
    pd.DataFrame({"text": ["The grass is green. The sky is blue. " * 6,
                           "There and back again, and again. " * 6,
                           "short one",
                           "A story that goes on and on about nothing at all. " * 4]}).to_csv(path, index=False)
    return path


def test_attn_writes_every_table_and_figure(use_tiny, docs, tmp_path, invoke):
    out = tmp_path / "run"
    result = invoke("attn", "llama", "--length", "24", "--intervention", "zero", "--dataset", str(docs),
                    "--bootstrap", "100", "--buckets", "4", "--probe-positions", "6", "--block", "7",
                    "--out", str(out))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "attn.csv")
    sink = df[(df["metric"] == "sink_rate") & (df["scope"] == "model")]
    assert list(sink["intervention"]) == ["intact", "zero"]  # the intact model first
    # a sink rate 0 on every text has no interval (issue 46), not [0, 0]
    assert sink["value"].between(0, 1).all() and (sink["ci_low"].notna() | sink["value"].isin([0.0, 1.0])).all()
    assert not (sink["ci_low"] == sink["ci_high"]).any()
    assert (df["rows"] == 3).all() and (df["skipped_short"] == 1).all()  # "short one" skipped
    heads = df[(df["scope"] == "head") & (df["metric"] == "entropy")]
    assert len(heads) == 2 * 2 * 4  # conditions x layers x heads
    for name in ("attn_positions", "attn_distance", "attn_frequency", "attn_positional", "attn_probe"):
        table = pd.read_csv(out / f"{name}.csv")
        assert len(table) and table["git_commit"].notna().all(), name
    probe = pd.read_csv(out / "attn_probe.csv")
    assert set(probe["metric"]) == {"probe_mae", "norm_share"}
    mae = probe[probe["metric"] == "probe_mae"]  # paired with intact over the same texts
    assert mae.loc[mae["intervention"] == "intact", "diff_vs_intact"].isna().all()
    assert mae.loc[mae["intervention"] == "zero", "diff_vs_intact"].notna().all()
    for fig in ("attn_heads", "attn_entropy", "attn_distance", "attn_frequency", "attn_positional",
                "attn_norms"):
        assert (out / "figures" / f"{fig}.png").stat().st_size > 10_000, fig
    config = json.loads((out / "attn.json").read_text())["config"]
    assert config["length"] == 24 and config["epsilon"] == 0.3
    compared = invoke("compare", str(out), "--out", str(tmp_path / "cmp"))
    assert compared.exit_code == 0 and "sink_rate" in compared.output, compared.output


def test_every_condition_carries_its_paired_difference_from_intact(use_tiny, docs, tmp_path, invoke):
    out = tmp_path / "run"
    result = invoke("attn", "llama", "--length", "24", "--intervention", "zero,shuffle", "--dataset",
                    str(docs), "--bootstrap", "200", "--no-hidden", "--out", str(out))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "attn.csv")
    diffs = ["diff_vs_intact", "diff_ci_low", "diff_ci_high"]
    per_text = df["metric"] != "high_frequency_share"  # one value per model: nothing to pair
    assert df.loc[(df["intervention"] == "intact") | ~per_text, diffs].isna().all().all()
    key = ["scope", "layer", "head", "layer_type", "metric"]
    intact = df[(df["intervention"] == "intact") & per_text].set_index(key)
    for name in ("zero", "shuffle"):
        cond = df[(df["intervention"] == name) & per_text].set_index(key)
        assert len(cond) == len(intact)
        point = cond["value"] - intact.loc[cond.index, "value"]
        assert (cond["diff_vs_intact"] - point).abs().max() < 1e-9, name  # the means' difference
        has = cond["diff_ci_low"].notna()
        assert has.any() and cond[has].eval("diff_ci_low <= diff_vs_intact <= diff_ci_high").all()


def test_masks_on_positions_removed(use_tiny, docs, tmp_path, invoke):
    out = tmp_path / "run"
    result = invoke("attn", "gpt2", "--length", "16", "--intervention", "zero", "--mask",
                    "default,linear,alibi", "--mask-semantics", "log-bias", "--dataset", str(docs),
                    "--bootstrap", "0", "--no-hidden", "--out", str(out))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "attn.csv")
    whole = df[(df["scope"] == "model") & (df["metric"] == "mean_distance")]
    assert list(zip(whole["intervention"], whole["mask"], strict=True)) == [
        ("intact", "default"), ("zero", "default"), ("zero", "linear"), ("zero", "alibi")]
    assert whole.iloc[3]["value"] < whole.iloc[1]["value"]  # alibi pulls attention near
    assert not (out / "attn_probe.csv").exists()


@pytest.mark.parametrize("model, args, words", [
    ("random:bloom", ["--mask", "linear"], "masks do not apply"),
    ("random:gpt2", ["--rope-scaling", "yarn:2"], "--rope-scaling applies to rotary"),
    ("random:gpt2", ["--length", "8", "--probe-positions", "9"], "probe_positions"),
    ("random:gpt2", ["--intervention", "nope"], "nope"),
    ("random:gpt2", ["--epsilon", "2"], "epsilon"),
    ("random:llama", ["--intervention", "sinks:2:8"], "remedies"),
])
def test_bad_input_one_line_before_loading(docs, invoke, monkeypatch, model, args, words):
    def refuse(*a, **k):
        raise AssertionError("weights loaded")

    monkeypatch.setattr("pecli.models.loading.load_model", refuse)
    result = invoke("attn", model, "--dataset", str(docs), *args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code != 0 and len(lines) == 1, result.output
    assert words in lines[0] and "Traceback" not in result.output


def test_too_few_long_texts(use_tiny, docs, invoke):
    result = invoke("attn", "gpt2", "--length", "500", "--dataset", str(docs))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code != 0 and len(lines) == 1 and "--join" in lines[0], result.output


def test_join_cuts_windows_from_the_stream(use_tiny, docs, tmp_path, invoke):
    out = tmp_path / "run"
    result = invoke("attn", "bert", "--length", "20", "--join", "--dataset", str(docs), "--bootstrap", "0",
                    "--probe-positions", "0", "--out", str(out))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "attn.csv")
    assert (df["texts_from"] == "joined").all() and (df["rows"] >= 2).all()


def test_layer_type_rows_equal_the_models_own_attention_by_type(use_tiny, tiny, docs, tmp_path, invoke):
    """Gemma 3 (a sliding layer, then a full one; window 6 < 24 tokens): the rows of scope
    layer_type are each type's mean over its layers and heads of the model's own eager
    attention weights (transformers' output_attentions), grouped by config.layer_types."""
    import torch

    from pecli.data.datasets import load_data
    from pecli.experiments.attn import select_texts

    out = tmp_path / "run"
    result = invoke("attn", "gemma3", "--length", "24", "--dataset", str(docs), "--epsilon", "0.15",
                    "--bootstrap", "100", "--no-hidden", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert re.search(r"sliding \d\.\d{3}, full \d\.\d{3}", result.output)  # the summary's column
    df = pd.read_csv(out / "attn.csv")
    kinds = df[df["scope"] == "layer_type"]
    assert list(dict.fromkeys(kinds["layer_type"])) == ["sliding_attention", "full_attention"]
    assert set(df[df["scope"] == "layer"].groupby("layer")["layer_type"].first()) == {
        "sliding_attention", "full_attention"}
    loaded = tiny("gemma3")  # the same seed: the same weights
    ids, _ = select_texts(loaded.tokenizer, load_data(str(docs), None).texts(), 24, 100, 0, False)
    model = loaded.model
    model.set_attn_implementation("eager")
    with torch.inference_mode():
        a = torch.stack(model(input_ids=ids, output_attentions=True).attentions, 1).double()  # [n, L, H, T, T]
    first = a[..., :, 0].mean(-1)  # [n, L, H]: mean attention on the first token over queries
    probs = a.clamp_min(1e-300)
    entropy = -(a * probs.log()).sum(-1).mean(-1)
    for kind in ("sliding_attention", "full_attention"):
        of = [i for i, t in enumerate(model.config.layer_types) if t == kind]
        got = kinds[kinds["layer_type"] == kind].set_index("metric")["value"]
        assert got["first_token_mass"] == pytest.approx(first[:, of].mean().item(), rel=1e-5)
        assert got["sink_rate"] == pytest.approx((first[:, of] > 0.15).double().mean().item())
        assert got["entropy"] == pytest.approx(entropy[:, of].mean().item(), rel=1e-5)
    by_kind = kinds.set_index(["layer_type", "metric"])["value"].unstack()
    assert by_kind["entropy"].nunique() == 2 and by_kind["sink_rate"].nunique() == 2
    assert (out / "figures" / "attn_layer_types.png").stat().st_size > 10_000
