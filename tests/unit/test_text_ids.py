"""`text_id`: a text's row in its source split, kept through --limit so per-text rows join."""

from __future__ import annotations

import pandas as pd

from pecli.data.datasets import subset


def test_text_id_is_the_source_row_and_stable_under_limit():
    frame = pd.DataFrame({"text": [f"t{i}" for i in range(20)], "label": [i % 2 for i in range(20)]})
    small, large = (subset(frame, n, 0, "label", "x") for n in (6, 12))
    for part in (small, large):
        assert (part["text"] == "t" + part["text_id"].astype(str)).all()  # points at its source row
    assert small["text_id"].tolist() == large["text_id"].tolist()[:6]  # same texts, same ids
    assert subset(frame, None, 0, None, "x")["text_id"].tolist() == list(range(20))


def test_perplexity_per_text_rows_carry_text_id(tiny, tmp_path):
    from pecli.experiments.perplexity import PerplexityOptions, run

    texts = [f"Question {i}: why is the sky blue {'today ' * i}?" for i in range(8)]
    path = tmp_path / "q.csv"
    pd.DataFrame({"question": texts}).to_csv(path, index=False)
    options = PerplexityOptions.build(dict(dataset=str(path), text_field="question", limit=3,
                                           bootstrap=0, device="cpu"), "test")
    tables = run(options, loaded=tiny("gpt2"))
    rows = tables["texts"]
    chosen = subset(pd.DataFrame({"question": texts}), 3, 0, None, "x")["text_id"]
    assert "text_index" not in rows and sorted(set(rows["text_id"])) == sorted(chosen)
    # a longer text has more scored tokens: the id names the text that was scored
    tokens = rows.drop_duplicates("text_id").set_index("text_id")["text_tokens"]
    assert tokens.sort_index().is_monotonic_increasing
