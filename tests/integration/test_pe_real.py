"""pe-probe on the real MiniLM, a random GPT-2 of the real config, and the real SmolLM2 (rotary)."""

from __future__ import annotations

import pytest

from pecli.experiments import pe as pe_exp
from pecli.experiments.options.pe import ProbeOptions

pytestmark = pytest.mark.slow


def _by(df, **where):
    for col, value in where.items():
        df = df[df[col] == value]
    return df


def test_minilm_and_random_gpt2(minilm, shared_data, monkeypatch):
    from pecli.models.loading import load_model

    monkeypatch.setattr("pecli.models.loading.load_model",
                        lambda name, **kw: minilm if name == "minilm" else load_model(name, **kw))
    out = pe_exp.run_probe(ProbeOptions(models=["minilm", "random:gpt2"], dataset="imdb", limit=6,
                                        max_length=48, pairs=300, device="cpu",
                                        data_dir=str(shared_data)))
    m = out["matrix"].set_index(["model", "matrix", "metric"])["value"]
    shapes = out["matrix"].groupby("model")[["positions", "dim"]].first()
    assert shapes.loc["minilm"].tolist() == [512, 384] and shapes.loc["random:gpt2"].tolist() == [1024, 768]
    # A trained table encodes its index; the same-shape sinusoid almost exactly.
    assert m["minilm", "learned", "regression_mae"] < 0.5 * m["minilm", "learned", "regression_chance_mae"]
    assert m["minilm", "learned", "order_accuracy"] > 0.8
    for model in ("minilm", "random:gpt2"):
        assert m[model, "sinusoidal", "regression_mae"] < 1.0
        assert m[model, "sinusoidal", "order_accuracy"] > 0.9
    # Random rows of the real GPT-2 config: no better than chance.
    assert m["random:gpt2", "learned", "regression_mae"] >= 0.9 * m["random:gpt2", "learned", "regression_chance_mae"]
    assert abs(m["random:gpt2", "learned", "order_accuracy"] - 0.5) < 0.1

    hidden = out["hidden"]
    assert set(hidden["layer"][hidden.model == "minilm"]) == set(range(7))
    assert set(hidden["layer"][hidden.model == "random:gpt2"]) == set(range(13))
    mae = _by(hidden, model="minilm", metric="probe_mae").set_index(["intervention", "layer"])["value"]
    chance = _by(hidden, model="minilm", metric="probe_chance_mae").set_index(["intervention", "layer"])["value"]
    # With positions the embedding output carries them; without, a bidirectional encoder
    # is permutation-equivariant and stays near chance at every layer.
    assert mae["intact", 0] < 0.5 * chance["intact", 0]
    assert (mae["zero"] > 0.8 * chance["zero"]).all()


def test_smollm2_hidden_state_probe_only(smollm2, shared_data, monkeypatch):
    monkeypatch.setattr("pecli.models.loading.load_model", lambda name, **kw: smollm2)
    out = pe_exp.run_probe(ProbeOptions(models=["smollm2"], dataset="imdb", limit=5, max_length=32,
                                        device="cpu", data_dir=str(shared_data)))
    assert set(out) == {"hidden"}  # rotary: no embedding table to analyse
    hidden = out["hidden"]
    assert hidden["note"].str.contains("rotary").all() and (hidden["position_kind"] == "rotary").all()
    assert len(hidden) == 31 * 2 * 2  # layers (embeddings + 30) x interventions x (mae, chance)
    mae = _by(hidden, metric="probe_mae").set_index(["intervention", "layer"])["value"]
    chance = _by(hidden, metric="probe_chance_mae")["value"].iloc[0]
    assert mae["intact"].min() < 0.7 * chance  # some layer carries position
    assert (mae["intact"] != mae["zero"]).any()  # the identity rotation changed the states
    # the token embeddings carry no position, with or without rotary
    assert mae["intact", 0] == mae["zero", 0]
