"""`pecli ablate` and `pecli interventions` end to end on tiny local checkpoints and a CSV."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import make_tiny
from typer.testing import CliRunner

from pecli.cli.app import app

runner = CliRunner()
REVIEWS = ["a fine film", "terrible acting and a worse plot", "I loved every minute of it",
           "boring", "the best thing I saw this year", "a waste of two hours",
           "charming and funny", "not worth it", "great cast, great music",
           "it fell apart at the end", "a small gem", "dull dull dull"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """Two tiny BERT checkpoints (widths 32 and 64) saved as local directories, and a CSV."""
    root = tmp_path_factory.mktemp("ablate_cli")
    for name, overrides in (("bert32", {}), ("bert64", {"hidden_size": 64})):
        loaded = make_tiny("bert", **overrides)
        loaded.model.save_pretrained(root / name)
        loaded.tokenizer.save_pretrained(root / name)
    pd.DataFrame({"text": REVIEWS, "label": [1, 0] * 6}).to_csv(root / "reviews.csv", index=False)
    return root


def _ablate(assets, tmp_path, *extra):
    # --limit 12 unless the caller gives its own (a flag given twice is refused)
    limit = [] if "--limit" in extra else ["--limit", "12"]
    return runner.invoke(app, ["ablate", str(assets / "bert32"), "--dataset",
                               str(assets / "reviews.csv"), *limit, "--out",
                               str(tmp_path / "out"), "--baseline-pairs", "300", "--device", "cpu",
                               *extra], env={"COLUMNS": "200"})


def test_ablate_writes_tables_figures_and_summary(assets, tmp_path):
    result = _ablate(assets, tmp_path, "--intervention", "zero,shift:2", "--probe")
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    for name in ("ablate", "ablate_positions", "ablate_random", "ablate_probe"):
        assert (out / f"{name}.csv").exists() and (out / f"{name}.json").exists()
    for png in ("ablate_layers", "ablate_positions", "ablate_random_baseline"):
        assert (out / "figures" / f"{png}.png").stat().st_size > 1000
    main = pd.read_csv(out / "ablate.csv")
    assert (pd.read_csv(out / "ablate_random.csv")["condition"] == "random vectors").all()
    assert set(main.intervention) == {"intact", "zero", "shift:2"}  # intact: the in-model baselines
    own = main[main.intervention == "intact"]
    assert set(own.metric) == {"token_pair_cosine_mean", "token_pair_cosine_std",
                               "self_similarity_mean", "self_similarity_std"}
    assert "in-model baselines" in result.output and "[" in result.output  # intervals shown
    assert "intervals" in (out / "ablate.json").read_text()  # the method, in the sidecar
    probe = pd.read_csv(out / "ablate_probe.csv")
    assert (probe.ci_low <= probe.value).all() and (probe.value <= probe.ci_high).all()
    cos = main[(main.metric == "cosine_mean") & main.final_layer & (main.special_tokens == "included")]
    assert cos["value"].between(-1, 1).all() and len(cos) == 2
    assert "mean cosine" in result.output and "z-score" in result.output and "ablate.csv" in result.output
    printed = f"{cos.set_index('intervention').loc['zero', 'value']:.4f}"
    assert printed in result.output  # the summary prints the table's number


@pytest.mark.parametrize("args,message", [
    (["--intervention", "zeros"], "unknown intervention 'zeros' (did you mean 'zero'"),
    (["--intervention", "intact"], "`intact` is the baseline"),
    (["--intervention", "shift"], "needs an argument"),
    (["--limit", "0"], "limit (--limit): 0 is out of range (at least 1)"),
    (["--intervention", "zero", "--pe", "shuffle"], "'pe' and 'intervention' are the same option"),
])
def test_ablate_errors_are_one_line(assets, tmp_path, args, message):
    result = _ablate(assets, tmp_path, *args)
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output


def test_swap_across_widths_is_a_clear_error(assets, tmp_path):
    result = _ablate(assets, tmp_path, "--intervention", f"swap:{assets / 'bert64'}")
    assert result.exit_code == 1
    assert "width 64 does not match" in result.output and "same hidden size" in result.output


def test_probe_needs_labels(assets, tmp_path):
    pd.DataFrame({"text": REVIEWS}).to_csv(tmp_path / "nolabel.csv", index=False)
    result = runner.invoke(app, ["ablate", str(assets / "bert32"), "--dataset",
                                 str(tmp_path / "nolabel.csv"), "--limit", "12", "--probe",
                                 "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "--probe needs labels" in result.output


def test_interventions_listing():
    result = runner.invoke(app, ["interventions"])
    assert result.exit_code == 0
    for name in ("intact", "zero", "shuffle", "reverse", "shift:K", "sinusoidal", "random",
                 "swap:MODEL", "perm[p]"):
        assert name in result.output


def test_default_size_takes_every_row_of_a_small_file(assets, tmp_path):
    # 12 rows, fewer than the default 48: all of them, not an error; an explicit 13 is one
    result = runner.invoke(app, ["ablate", str(assets / "bert32"), "--dataset",
                                 str(assets / "reviews.csv"), "--layers", "--baseline-pairs",
                                 "300", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert set(pd.read_csv(tmp_path / "o" / "ablate.csv")["rows"]) == {12}
    result = _ablate(assets, tmp_path, "--limit", "13")
    assert result.exit_code == 1 and "use --limit 12 or less" in result.output
