"""`pecli toy arithmetic` and `pecli train lm` end to end with a handful of steps."""

from __future__ import annotations

import pandas as pd
from typer.testing import CliRunner

from pecli.cli.app import app

runner = CliRunner()


def test_toy_arithmetic_writes_tables_figures_checkpoints(tmp_path):
    out = tmp_path / "toy"
    res = runner.invoke(app, ["toy", "arithmetic", "--pe", "none", "--pe", "learned", "--steps", "3",
                              "--max", "6", "--out", str(out)])
    assert res.exit_code == 0, res.output
    acc = pd.read_csv(out / "accuracy.csv")
    assert set(acc.pe) == {"none", "learned"}
    exact = acc[(acc.metric == "exact_match") & (acc.operation == "all")]
    assert len(exact) == 2 and exact.value.between(0, 1).all()
    assert (exact.rows == round(0.2 * 2 * 6 * 6)).all()
    att = pd.read_csv(out / "attention.csv", keep_default_na=False)
    gap = att[(att.metric == "repeat_key_gap") & (att.layer == 1)].set_index("pe")["value"]
    assert gap["none"] == 0.0 and gap["learned"] > 0
    for name in ("figures/toy_accuracy.png", "figures/toy_attention.png", "accuracy.json",
                 "models/none/config.json", "models/learned/model.safetensors"):
        assert (out / name).exists(), name
    assert "exact match" in res.output


def test_toy_rejects_unknown_scheme_and_bad_probe(tmp_path):
    res = runner.invoke(app, ["toy", "arithmetic", "--pe", "nope", "--out", str(tmp_path)])
    assert res.exit_code == 1
    assert "unknown position encoding 'nope'" in res.output
    res = runner.invoke(app, ["toy", "arithmetic", "--pe", "none", "--max", "50", "--probe", "99+1=",
                              "--out", str(tmp_path)])
    assert res.exit_code == 1 and "--probe" in res.output


def test_train_lm_tiny(tmp_path, shared_data, imdb_revision):
    from pecli.models.loading import load_model

    out = tmp_path / "lm"
    res = runner.invoke(app, [
        "train", "lm", "--pe", "learned,alibi", "--steps", "2", "--limit", "20", "--eval-limit", "4",
        "--vocab", "300", "--context", "32", "--batch", "2", "--layers", "1", "--width", "16",
        "--heads", "2", "--eval-every", "1", "--seeds", "2", "--data-dir", str(shared_data),
        "--out", str(out)])
    assert res.exit_code == 0, res.output
    ppl = pd.read_csv(out / "perplexity.csv")
    test_ppl = ppl[ppl.metric == "test_perplexity"].set_index("model")["value"]
    assert set(test_ppl.index) == {"unigram", "bigram", "lm-learned", "lm-alibi"}
    by_seed = pd.read_csv(out / "perplexity_by_seed.csv")
    seeds = by_seed[by_seed.metric == "test_perplexity"].groupby("model")["value"]
    assert (seeds.count() == 2).all()
    assert (seeds.mean() - test_ppl[seeds.mean().index]).abs().max() < 1e-9
    summary = ppl[ppl.model.str.startswith("lm-") & (ppl.metric == "test_perplexity")]
    assert (summary.seeds == 2).all() and summary.ci_low.notna().all()
    # pecli perplexity on the learned checkpoints, intact and with positions zeroed (alibi:
    # zero would act on a table it does not have, so it is not asked)
    positions = pd.read_csv(out / "positions.csv")
    assert set(positions.pe) == {"learned"} and set(positions.intervention) == {"intact", "zero"}
    assert (positions.seeds == 2).all()
    assert (out / "figures" / "train_lm_positions.png").exists()
    tokens = ppl[ppl.metric == "test_perplexity"]["tokens"]
    assert tokens.nunique() == 1  # the unigram is scored on the same tokens
    curve = pd.read_csv(out / "curve.csv")
    assert sorted(curve[curve.pe == "learned"].step.unique()) == [1, 2]
    # each curve row names the data it was computed on: training loss on the train split,
    # evaluation loss on the test split, each with its own file's digest
    assert (curve.data_revision == curve.split.map(imdb_revision)).all()
    assert set(curve[curve.metric == "train_loss"].split) == {"train"}
    assert set(curve[curve.metric == "eval_loss"].split) == {"test"}
    assert (out / "figures" / "train_lm_curve.png").exists()
    assert (out / "figures" / "train_lm_perplexity.png").exists()
    assert (out / "models" / "learned-seed1" / "config.json").exists()
    loaded = load_model(str(out / "models" / "learned"), device="cpu")
    assert loaded.spec.family == "gpt2" and loaded.max_positions == 32
    assert len(loaded.tokenizer) == 300


def test_train_lm_model_out_needs_one_scheme(tmp_path):
    res = runner.invoke(app, ["train", "lm", "--pe", "learned,none", "--model-out",
                              str(tmp_path / "m"), "--out", str(tmp_path)])
    assert res.exit_code == 1
    assert "exactly one --pe" in res.output


def test_toy_length_writes_tables_with_intervals_over_seeds_and_figures(tmp_path):
    out = tmp_path / "tl"
    res = runner.invoke(app, ["toy", "length", "--task", "copy,sort,addition", "--pe", "none,t5",
                              "--pe", "randomized", "--train-length", "2", "--steps", "2",
                              "--seeds", "2", "--eval-items", "3", "--width", "16",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    by_seed = pd.read_csv(out / "by_seed.csv")
    acc = pd.read_csv(out / "accuracy.csv")
    rank = pd.read_csv(out / "ranking.csv")
    em = acc[acc.metric == "exact_match"]
    assert set(em.test_length) == {1, 2, 3, 4, 5, 6}  # N/2 .. 3N
    assert len(em) == 3 * 3 * 6 and (em.seeds == 2).all() and em.split_rule.str.contains("1-2").all()
    assert (em.split == "length").all()
    seeds = by_seed[by_seed.metric == "exact_match"]
    # seeds and items resampled together: bounds inside [0, 1]; none where every item of every
    # seed agrees (all wrong after 2 steps), never [0, 0]
    agree = seeds.groupby(["task", "pe", "test_length"])["value"].agg(lambda v: set(v) <= {0.0} or set(v) <= {1.0})
    blank = em.set_index(["task", "pe", "test_length"])["ci_low"].isna()
    assert (blank == agree.reindex(blank.index)).all()
    shown = em[em.ci_low.notna()]
    assert ((0 <= shown.ci_low) & (shown.ci_low < shown.ci_high) & (shown.ci_high <= 1)).all()
    assert sorted(seeds.seed.unique()) == [0, 1] and (seeds.rows == 3).all()
    mean = seeds.groupby(["task", "pe", "test_length"])["value"].mean()
    assert (em.set_index(["task", "pe", "test_length"])["value"] - mean).abs().max() < 1e-12
    assert set(rank[rank.metric == "mrr"].pe) == {"none", "t5", "randomized"}
    for name in ("figures/toy_length.png", "figures/toy_length_ranking.png", "accuracy.json"):
        assert (out / name).exists(), name
    assert "mean reciprocal rank" in res.output


def test_toy_length_refuses_bad_tasks_in_one_line(tmp_path):
    res = runner.invoke(app, ["toy", "length", "--task", "copy,sortt", "--out", str(tmp_path)])
    assert res.exit_code == 1 and "unknown task 'sortt'" in res.output
    assert "Traceback" not in res.output


def test_forked_workers_end_without_a_traceback(tmp_path):
    """The pool ends its workers with SIGTERM: they take the default action, not pecli's
    handler (which turned it into a traceback from a worker on stderr, in about half the runs
    of this command before the fix)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pecli", "toy", "length", "--task", "copy",
                           "--pe", "none,t5", "--train-length", "2", "--steps", "2", "--seeds", "2",
                           "--eval-items", "3", "--width", "16", "--workers", "4",
                           "--out", str(tmp_path / "tl")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Stopped" not in done.stderr, done.stderr
