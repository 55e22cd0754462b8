import pandas as pd
import pytest

from pecli.data.datasets import load_data, subset
from pecli.runs.errors import DataError


@pytest.fixture
def fake_data_dir(tmp_path):
    """A data directory in the shared/data layout, 40 IMDB rows sorted by label like the real one."""
    (tmp_path / "imdb").mkdir()
    frame = pd.DataFrame({"id": [f"test/x/{i}" for i in range(40)], "label": [0] * 20 + [1] * 20,
                          "rating": [1] * 20 + [10] * 20, "text": [f"review {i}" for i in range(40)]})
    frame.to_parquet(tmp_path / "imdb" / "test.parquet")
    (tmp_path / "truthfulqa").mkdir()
    pd.DataFrame({"Type": ["A", "A"], "Category": ["c", "c"], "Question": ["Q1?", "Q2?"],
                  "Best Answer": ["b1", "b2"], "Correct Answers": ["x; y", "z"],
                  "Incorrect Answers": ["w", ""], "Source": ["s", "s"]}
                 ).to_csv(tmp_path / "truthfulqa" / "TruthfulQA.csv", index=False)
    return tmp_path


def test_limit_is_seeded_and_stratified(fake_data_dir):
    a = load_data("imdb", "test", data_dir_=fake_data_dir, limit=10, seed=3)
    b = load_data("imdb", "test", data_dir_=fake_data_dir, limit=10, seed=3)
    c = load_data("imdb", "test", data_dir_=fake_data_dir, limit=10, seed=4)
    assert a.frame["id"].tolist() == b.frame["id"].tolist()
    assert a.frame["id"].tolist() != c.frame["id"].tolist()
    assert a.labels().count(0) == a.labels().count(1) == 5  # the files are sorted by label
    assert a.provenance()["rows"] == 10 and a.provenance()["split_rows"] == 40


def test_truthfulqa_schema_matches_hub_builder(fake_data_dir):
    data = load_data("truthfulqa", data_dir_=fake_data_dir)
    # the hub builder drops rows without incorrect answers and splits answers on ';'
    assert len(data.frame) == 1
    assert data.frame["correct_answers"][0] == ["x", "y"]
    assert data.texts("question+best_answer") == ["Q1? b1"]


@pytest.mark.parametrize("limit, message", [(0, "positive"), (41, "exceeds the 40 rows")])
def test_bad_limit(fake_data_dir, limit, message):
    with pytest.raises(DataError, match=message):
        load_data("imdb", "test", data_dir_=fake_data_dir, limit=limit)


def test_a_default_size_takes_every_row_of_smaller_data(fake_data_dir):
    data = load_data("imdb", "test", data_dir_=fake_data_dir, limit=48, at_most=True)
    assert len(data.frame) == 40 and data.labels().count(1) == 20
    with pytest.raises(DataError, match="use --limit 40 or less"):
        load_data("imdb", "test", data_dir_=fake_data_dir, limit=48)


def test_missing_text_is_named_not_a_traceback(tmp_path):
    path = tmp_path / "holes.csv"
    path.write_text("text,label\nhello world,1\n,0\nnice film,1\n")
    with pytest.raises(DataError, match=r"1 row\(s\) have no text in 'text' \(data rows 2\)"):
        load_data(str(path))


def test_empty_file_says_so(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("review,y\n")
    with pytest.raises(DataError, match="has no rows"):
        load_data(str(path), text_field="review", limit=5, at_most=True)


def test_missing_split_and_dir(fake_data_dir, tmp_path):
    with pytest.raises(DataError, match="train.parquet"):
        load_data("imdb", "train", data_dir_=fake_data_dir)
    with pytest.raises(DataError, match="split 'dev' not in imdb"):
        load_data("imdb", "dev", data_dir_=fake_data_dir)
    with pytest.raises(DataError, match="does not exist"):
        load_data("imdb", "test", data_dir_=tmp_path / "nope")


def test_custom_file_and_wrong_column(tmp_path):
    path = tmp_path / "mine.jsonl"
    pd.DataFrame({"body": ["a b", "c d", "e"]}).to_json(path, orient="records", lines=True)
    assert load_data(str(path), text_field="body").texts() == ["a b", "c d", "e"]
    with pytest.raises(DataError, match="no text column 'text'.*--text"):
        load_data(str(path))
    with pytest.raises(DataError, match="unknown dataset"):
        load_data("imbd")
    for not_a_file in (tmp_path / "mine", tmp_path):  # a path, not a dataset's name
        with pytest.raises(DataError, match="is not a data file; give a CSV.* or a dataset"):
            load_data(str(not_a_file))


def test_subset_without_label_is_permutation():
    frame = pd.DataFrame({"text": list("abcdef")})
    assert sorted(subset(frame, 6, 0, None, "x")["text"]) == list("abcdef")


def test_the_data_directory_is_found_the_same_way_with_or_without_make(monkeypatch, tmp_path):
    """--data-dir, else PECLI_DATA_DIR, else ../shared/data beside the project, else the hub:
    pecli decides it, so `make demo` and a plain `pecli` read the same files."""
    from pecli.data import datasets

    beside = tmp_path / "shared" / "data"
    beside.mkdir(parents=True)
    monkeypatch.setattr(datasets, "DEFAULT_DATA_DIR", beside)
    monkeypatch.delenv("PECLI_DATA_DIR", raising=False)
    assert datasets.data_dir() == beside
    assert datasets.DEFAULT_DATA_DIR.parent.parent == tmp_path  # (the real one: beside the project)
    monkeypatch.setenv("PECLI_DATA_DIR", str(tmp_path))
    assert datasets.data_dir() == tmp_path and datasets.data_dir(beside) == beside
    monkeypatch.setenv("PECLI_DATA_DIR", "")  # empty: the hub
    assert datasets.data_dir() is None
    monkeypatch.delenv("PECLI_DATA_DIR")
    monkeypatch.setattr(datasets, "DEFAULT_DATA_DIR", tmp_path / "nowhere")
    assert datasets.data_dir() is None
    from pathlib import Path

    root = Path(datasets.__file__).resolve().parents[2]
    assert (root / "Makefile").exists() and "PECLI_DATA_DIR ?=" not in (root / "Makefile").read_text()
