"""train-lm's test_lengths: "train short, test long" is `pecli length` on the trained checkpoints."""

from __future__ import annotations

import pandas as pd
import pytest

from pecli.experiments.length import run as length_run
from pecli.experiments.options.length import LengthOptions
from pecli.experiments.options.train_lm import TrainLmOptions
from pecli.experiments.train_lm import run as train_run
from pecli.measures.intervals import SEEDS_CROSSED_TEXTS
from pecli.measures.length_scoring import PER_WINDOW
from pecli.runs.errors import ConfigError

TINY = {"steps": 3, "layers": 1, "width": 32, "heads": 2, "context": 16, "batch": 2, "vocab": 300,
        "limit": 40, "eval_limit": 8, "eval_every": 3, "seeds": 1, "positions_removed": False}


def test_test_lengths_equal_pecli_length_on_the_saved_checkpoints(shared_data, tmp_path):
    o = TrainLmOptions.build({**TINY, "pe": "learned,sinusoidal", "test_lengths": "16,32",
                              "save_dir": str(tmp_path / "models"), "data_dir": str(shared_data)}, "t")
    tables = train_run(o)
    table = tables["length_by_seed"]
    assert (tables["length"]["seeds"] == 1).all()
    whole = table[table["all_positions"]].set_index(["model", "length"])
    assert whole.loc[("lm-learned", 32), "note"] == "not applicable: 16 learned positions"
    assert whole.loc[("lm-sinusoidal", 32), "tokens"] > 0  # the sinusoid extends past training
    assert set(table["context"]) == {16} and set(table["context_kind"]) == {"training"}
    # the same numbers as a user's `pecli length models/sinusoidal --lengths 16,32`
    own = LengthOptions.build({"model": str(tmp_path / "models" / "sinusoidal"), "dataset": "imdb",
                               "split": "test", "limit": 8, "lengths": "16,32",
                               "data_dir": str(shared_data)}, "t")
    direct = length_run(own)["length"]
    mine = table[table["model"] == "lm-sinusoidal"].reset_index(drop=True)
    cols = ["length", "window_start", "nll_mean", "ci_low", "ci_high", "tokens", "windows"]
    pd.testing.assert_frame_equal(mine[cols], direct[cols])
    assert not set(PER_WINDOW) & {c for t in (*tables.values(), direct) for c in t.columns}


def test_test_lengths_over_seeds_resample_seeds_and_windows(shared_data, tmp_path):
    """Two seeds scored on the same windows: every scored length row's interval is the crossed
    bootstrap; the row past the learned table has none (no windows scored)."""
    o = TrainLmOptions.build({**TINY, "seeds": 2, "pe": "learned", "test_lengths": "16,32",
                              "data_dir": str(shared_data)}, "t")
    table = train_run(o)["length"].set_index(["length", "window_start", "all_positions"])
    scored = table.loc[16]
    assert (scored["interval"] == SEEDS_CROSSED_TEXTS).all() and (scored["seeds"] == 2).all()
    assert (scored["ci_low"] < scored["value"]).all() and (scored["value"] < scored["ci_high"]).all()
    assert table.loc[32]["ci_low"].isna().all()


def test_test_lengths_that_no_model_can_take_give_note_rows(shared_data):
    """Every length past the learned table: the length table holds only note rows (no windows
    scored, no per-window sums), over seeds as by seed."""
    o = TrainLmOptions.build({**TINY, "seeds": 2, "pe": "learned", "test_lengths": "32",
                              "data_dir": str(shared_data)}, "t")
    tables = train_run(o)
    for name in ("length", "length_by_seed"):
        assert tables[name]["note"].eq("not applicable: 16 learned positions").all()
        assert tables[name]["value"].isna().all() and not set(PER_WINDOW) & set(tables[name].columns)


def test_test_lengths_are_checked():
    with pytest.raises(ConfigError, match="lengths"):
        TrainLmOptions.build({"test_lengths": "16,x"}, "t")
    assert TrainLmOptions.build({}, "t").test_lengths == ()
