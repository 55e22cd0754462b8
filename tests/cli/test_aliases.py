"""The card's short names: `pecli ablate bert` loads bert-base-uncased from the HF cache."""

from __future__ import annotations

import pandas as pd
from conftest import make_tiny
from typer.testing import CliRunner

from pecli.cli.app import app

runner = CliRunner()
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(root, repo_id: str, family: str = "bert"):
    """A tiny model + tokenizer in the hub layout: models--<id>/{refs/main, snapshots/<commit>/}."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    loaded = make_tiny(family)
    loaded.model.save_pretrained(snapshot)
    loaded.tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)


def test_ablate_bert_alias_reads_bert_base_uncased_from_the_hf_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf"
    _hub_cache(cache / "hub", "bert-base-uncased")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache / "hub"))
    monkeypatch.setattr("transformers.utils.hub.TRANSFORMERS_CACHE", str(cache / "hub"), raising=False)
    env = {"HF_HOME": str(cache), "HF_HUB_CACHE": str(cache / "hub"), "HF_HUB_OFFLINE": "1",
           "COLUMNS": "200"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    data = tmp_path / "reviews.csv"
    pd.DataFrame({"text": ["a fine film", "a waste of two hours", "great cast", "dull"] * 2,
                  "label": [1, 0] * 4}).to_csv(data, index=False)
    result = runner.invoke(app, ["ablate", "bert", "--dataset", str(data), "--limit", "8",
                                 "--out", str(tmp_path / "out"), "--baseline-pairs", "100",
                                 "--device", "cpu"], env=env)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "out" / "ablate.csv")
    assert set(rows["model"]) == {"bert-base-uncased"}
    assert set(rows["model_id"]) == {"bert-base-uncased"}
    assert set(rows["model_revision"]) == {COMMIT}
    assert set(rows["model_source"]) == {"hub-cache"}


def test_missing_alias_names_the_repository_and_an_offline_stand_in(tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    data = tmp_path / "q.csv"
    pd.DataFrame({"text": ["what is it?", "why?"], "label": [0, 1]}).to_csv(data, index=False)
    result = runner.invoke(app, ["perplexity", "gpt2", "--dataset", str(data)],
                           env={"HF_HUB_CACHE": str(tmp_path), "HF_HOME": str(tmp_path)})
    assert result.exit_code == 1
    assert "hf download gpt2" in result.output and "models/tiny-gpt2-imdb" in result.output
    result = runner.invoke(app, ["ablate", "bert", "--dataset", str(data)],
                           env={"HF_HUB_CACHE": str(tmp_path), "HF_HOME": str(tmp_path)})
    assert result.exit_code == 1
    assert "hf download bert-base-uncased" in result.output and "minilm" in result.output
    assert "hf download bert`" not in result.output


def test_models_lists_the_aliases():
    result = runner.invoke(app, ["models"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    flat = " ".join(result.output.split())  # table cells may wrap
    assert "bert (alias of" in flat and "roberta (alias of roberta-base)" in flat
    assert "hf download bert-base-uncased" in flat


def test_perplexity_gpt2_shows_the_studys_numbers_beside_its_own(tmp_path, monkeypatch, shared_data):
    """A tiny GPT-2 cached as `gpt2`: the E3 rows carry the study's 111.24 / 712,014 / 11,897."""
    _hub_cache(tmp_path / "hub", "gpt2", family="gpt2")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HOME": str(tmp_path), "COLUMNS": "250"}
    result = runner.invoke(app, ["perplexity", "gpt2", "--mask", "linear", "--limit", "4",
                                 "--data-dir", str(shared_data), "--bootstrap", "100",
                                 "--out", str(tmp_path / "out")], env=env)
    assert result.exit_code == 0, result.output
    corpus = pd.read_csv(tmp_path / "out" / "perplexity.csv").query("aggregation == 'corpus'")
    assert corpus["study_value"].tolist() == [111.2409, 712014.3125, 11897.4824]
    assert set(corpus["model_id"]) == {"gpt2"}
    assert "study (gpt2)" in result.output and "712,014" in result.output
