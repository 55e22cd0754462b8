"""pe-sinusoidal and pe-probe on tiny models of every family: tables, probes, figures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import FAMILIES, make_tiny

from pecli.experiments import EXPERIMENTS, load_all
from pecli.experiments import pe as pe_exp
from pecli.experiments.options.pe import ProbeOptions, SinusoidOptions

TEXTS = ["the cat sat on the mat and looked around", "a fine film with a worse plot",
         "one two three four five six seven eight nine ten", "short", "dull dull dull dull",
         "charming and funny all the way to the end", "it fell apart at the end",
         "great cast great music great everything"]


def _fake_loader(monkeypatch, load):
    """run_probe loads `name` through pecli.models.loading; hand it tiny models instead."""
    monkeypatch.setattr("pecli.models.loading.load_model", load)
    monkeypatch.setattr("pecli.models.sources.model_availability", lambda name: ("installed (test)", ""))


@pytest.fixture
def reviews(tmp_path):
    path = tmp_path / "reviews.csv"
    pd.DataFrame({"text": TEXTS}).to_csv(path, index=False)
    return path


def test_registered():
    load_all()
    assert {"pe-sinusoidal", "pe-probe"} <= set(EXPERIMENTS.names())


def test_sinusoidal_tables():
    out = pe_exp.run_sinusoidal(SinusoidOptions(positions=12, dim=10, base=100.0))
    assert set(out) == {"encoding", "rotation", "dot", "summary"}
    enc = out["encoding"]
    assert len(enc) == 12 * 10 and enc["value"].between(-1, 1).all()
    row = enc[(enc.pos == 3) & (enc.dim_index == 2)].iloc[0]
    assert row["value"] == pytest.approx(np.sin(3 * 100.0 ** (-2 / 10))) and row["component"] == "sin"
    assert sorted(out["rotation"]["offset"]) == list(range(-11, 12))
    assert len(out["dot"]) == 144
    summary = out["summary"].set_index("metric")["value"]
    assert summary["rotation_max_abs_error"] < 1e-12
    assert summary["dot_offset_spread"] < 1e-12 and summary["dot_symmetry_error"] < 1e-12
    assert summary["dot_at_offset_0"] == pytest.approx(5.0)
    for df in out.values():
        assert (df["experiment"] == "pe-sinusoidal").all() and "git_commit" in df


@pytest.mark.parametrize("family", FAMILIES)
def test_collect_hidden_positions_and_texts(family):
    loaded = make_tiny(family)
    ids = [loaded.tokenizer(t)["input_ids"][:12] for t in TEXTS]
    states, positions, texts = pe_exp.collect_hidden(loaded, ids, batch_size=3)
    assert len(states) == loaded.model.config.num_hidden_layers + 1  # embeddings + layers
    assert all(s.shape == (sum(map(len, ids)), 32) for s in states)
    for t, seq in enumerate(ids):
        assert positions[texts == t].tolist() == list(range(len(seq)))
    # right padding must not change a text's states: compare with the text alone
    alone, _, _ = pe_exp.collect_hidden(loaded, [ids[1]])
    assert np.abs(alone[-1] - states[-1][texts == 1]).max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_run_probe_tables(family, reviews, monkeypatch):
    _fake_loader(monkeypatch, lambda name, **kw: make_tiny(family))
    out = pe_exp.run_probe(ProbeOptions(models=["tiny"], dataset=str(reviews), limit=None,
                                        max_length=16, folds=4, pairs=100, device="cpu"))
    hidden = out["hidden"]
    assert set(hidden["intervention"]) == {"intact", "zero"}
    layers = make_tiny(family).model.config.num_hidden_layers + 1  # embeddings + blocks
    assert len(hidden) == 2 * layers * 2  # interventions x layers x (mae, chance)
    assert hidden["value"].ge(0).all() and (hidden["tokens"] == hidden["tokens"].iloc[0]).all()
    spec = make_tiny(family).spec
    if spec.position != "learned":  # positions inside attention: no table to analyse
        assert "matrix" not in out and hidden["note"].str.contains("rotary").all()
        return
    matrix = out["matrix"]
    assert set(matrix["matrix"]) == {"learned", "sinusoidal"}
    assert (matrix["positions"] == 64).all() and (matrix["dim"] == 32).all()  # after pos_offset
    ref = matrix[(matrix["matrix"] == "sinusoidal")].set_index("metric")["value"]
    assert ref["regression_mae"] < 0.1 * ref["regression_chance_mae"]
    sim = out["similarity"]
    diag = sim[sim.pos_p == sim.pos_q]
    assert np.allclose(diag["value"], 1.0) and len(sim) == 2 * 64 * 64


def test_embedding_rows_skip_the_offset():
    loaded = make_tiny("roberta")
    rows = pe_exp._embedding_rows(loaded)
    weight = loaded.model.base_model.embeddings.position_embeddings.weight
    assert rows.shape == (64, 32) and torch.equal(torch.from_numpy(rows), weight[2:].detach())


def test_zero_positions_in_an_encoder_leave_the_probe_at_chance():
    """Without positions a bidirectional encoder is permutation-equivariant: a text of one
    repeated token gives every position the same state, so nothing beats the mean."""
    loaded = make_tiny("bert")
    tok = loaded.tokenizer.convert_tokens_to_ids("cat")
    ids = [[tok] * n for n in (10, 12, 14, 16, 18)]
    rows = pe_exp.hidden_probe(loaded, ids, "zero", folds=5, seed=0)
    for layer in range(3):
        mae = {r["metric"]: r["value"] for r in rows if r["layer"] == layer}
        assert mae["probe_mae"] == pytest.approx(mae["probe_chance_mae"], abs=0.5)
    with_pe = pe_exp.hidden_probe(loaded, ids, "intact", folds=5, seed=0)
    first = {r["metric"]: r["value"] for r in with_pe if r["layer"] == 0}
    assert first["probe_mae"] < 0.5 * first["probe_chance_mae"]


def test_figures_from_written_tables(tmp_path, reviews, monkeypatch):
    from pecli.runs.io import write_table

    fams = iter(["gpt2", "llama"])
    _fake_loader(monkeypatch, lambda name, **kw: make_tiny(next(fams)))
    for exp, frames in [
        ("pe-sinusoidal", pe_exp.run_sinusoidal(SinusoidOptions(positions=8, dim=8))),
        ("pe-probe", pe_exp.run_probe(ProbeOptions(
            models=["a", "b"], dataset=str(reviews), limit=None, max_length=16, folds=4,
            pairs=100, device="cpu"))),
    ]:
        csvs = {name: write_table(df, tmp_path / exp, name, {}) for name, df in frames.items()}
        pngs = EXPERIMENTS.get(exp).figures(csvs, tmp_path / exp / "figures")
        assert len(pngs) == 3 and all(p.stat().st_size > 5000 for p in pngs)


def test_preflight_takes_a_local_folder_and_names_a_missing_model(monkeypatch):
    """`models/tiny-gpt2-imdb` (a relative folder that also looks like a hub id) loads;
    a model that cannot load here fails before any data or model is read."""
    from pathlib import Path

    from pecli.runs.errors import ModelError

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    pe_exp.preflight(["models/tiny-gpt2-imdb", "random:gpt2"])
    with pytest.raises(ModelError, match="cannot load model 'models/nosuch'"):
        pe_exp.preflight(["random:gpt2", "models/nosuch"])


def test_deprecated_probe_and_recover_keys_build_the_same_options():
    """`interventions`, `text` (pe probe) and `n_boot`, `text` (pe recover): old spellings of
    intervention, text_field and bootstrap, accepted for one release with a warning."""
    from pecli.experiments.options.recover import RecoverOptions

    with pytest.warns(FutureWarning, match="'interventions' is deprecated; use 'intervention'"):
        old = ProbeOptions.build({"models": "a,b", "interventions": ["zero"], "text": "x"}, "t")
    assert old == ProbeOptions(models=("a", "b"), intervention="zero", text_field="x")
    with pytest.warns(FutureWarning, match="'n_boot' is deprecated; use 'bootstrap'"):
        assert RecoverOptions.build({"n_boot": 700}, "t") == RecoverOptions(bootstrap=700)
    assert ProbeOptions().as_dict()["intervention"] == ["intact", "zero"]
