"""pecli passkey: the template, the keys, prompt fitting, the decoding rule, batched KV-cache
decoding against the literal greedy loop, the tables and the figure."""

from __future__ import annotations

import io

import pandas as pd
import pytest
import torch

from pecli.experiments.options.passkey import PasskeyOptions
from pecli.experiments.passkey import conditions, run
from pecli.measures import passkey as pk
from pecli.measures.intervals import wilson
from pecli.runs.errors import ConfigError, ModelError

SEEDED = (  # seed 0, 96 tokens of GPT-2's BPE, depth 0.5: the first trial's prompt
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there.\n"
    "The grass is green. The sky is blue. The sun is yellow. Here we \n"
    "The pass key is 21879. Remember it. 21879 is the pass key.\n"
    "The grass is green. The sky is blue. The sun is yellow. Here we\n"
    "What is the pass key? The pass key is")


def test_a_seeded_trial_is_the_template_literally(tiny):
    loaded = tiny("llama")
    k = pk.keys(0, 96, 0.5, 2)[0]
    trial = pk.fit(loaded.tokenizer, k, 96, 0.5)
    assert k == 21879 and trial.text == SEEDED
    assert len(trial.ids) == 96 and list(trial.ids) == loaded.tokenizer(SEEDED)["input_ids"]


def test_template_lines():
    text = pk.prompt(7, 200, 0.25)
    intro, before, key, after, question = text.split("\n")
    assert intro == pk.INTRO and question == pk.QUESTION
    assert key == "The pass key is 7. Remember it. 7 is the pass key."
    assert len(before) == 50 and len(after) == 150  # depth: the share of the filler before the key
    filler = " ".join([pk.FILLER] * 3)
    assert before == filler[:50] and after == filler[:150]  # both from the filler's start
    assert pk.prompt(7, 200, 0.0).split("\n")[1] == "" and pk.prompt(7, 200, 1.0).split("\n")[3] == ""


def test_keys_are_seeded_uniform_draws_in_range():
    ks = pk.keys(0, 512, 0.5, 2000)
    assert ks == pk.keys(0, 512, 0.5, 2000)  # the same under every condition
    assert ks != pk.keys(1, 512, 0.5, 2000) and ks[:5] != pk.keys(0, 512, 0.25, 5)
    assert min(ks) >= 1 and max(ks) <= 50000 and 20000 < sum(ks) / len(ks) < 30000


@pytest.mark.parametrize("length", [64, 97, 200, 333])
@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_fit_gives_the_most_filler_that_fits(tiny, length, depth):
    tok = tiny("llama").tokenizer
    k = pk.keys(3, length, depth, 1)[0]
    trial = pk.fit(tok, k, length, depth)
    filler = len(trial.text) - len(pk.prompt(k, 0, depth))
    assert len(trial.ids) <= length
    assert len(tok(pk.prompt(k, filler + 1, depth))["input_ids"]) > length
    assert len(trial.ids) >= length - 1  # one filler character more would pass the length


def test_a_template_longer_than_the_length_does_not_fit(tiny):
    assert pk.fit(tiny("llama").tokenizer, 123, 40, 0.5) is None


@pytest.mark.parametrize("independent", [True, False])
def test_shortest_is_the_first_length_where_fit_gives_every_trial_a_prompt(tiny, independent):
    """What `pecli passkey` names as the smallest length that works, against `fit` itself on
    every draw of every depth, lengths counted up from 1."""
    tok, depths = tiny("llama").tokenizer, (0.0, 0.5, 1.0)

    def every_trial_fits(n):
        return all(pk.fit(tok, x.k, n, x.depth, x.filler, x.offset) is not None
                   for d in depths for x in pk.draws(5, n, d, 4, independent))

    first = next(n for n in range(1, 200) if every_trial_fits(n))
    assert pk.shortest(tok, 5, depths, 4, independent) == first and first > 40


@pytest.mark.parametrize("text, expected", [
    (" 46123.\nThe grass", 46123), ("46123", 46123), (" is 123. 456 is", 123),
    (" 1,234", 1), (" -5 apples", 5), (" a magical number", None), ("", None), (" 0042", 42)])
def test_decoding_rule_is_the_first_integer(text, expected):
    assert pk.answer(text) == expected


@pytest.mark.parametrize("family, intervention", [("llama", "intact"), ("llama", "zero"),
                                                  ("llama", "shuffle"), ("gpt2", "zero")])
def test_batched_cached_decoding_equals_the_literal_greedy_loop(tiny, family, intervention):
    """Batches of equal-length prompts with the KV cache = one prompt at a time, every step a
    full forward (float64: no argmax tie can flip)."""
    from pecli.positions.interventions import intervene

    loaded = tiny(family, **({"n_positions": 128} if family == "gpt2" else {"max_position_embeddings": 128}))
    loaded.model.double()
    trials = [pk.fit(loaded.tokenizer, k, 80, d) for d in (0.0, 0.5) for k in pk.keys(0, 80, d, 3)]
    assert len(pk.batches(trials)) < len(trials)  # some batches hold several prompts
    with intervene(loaded, intervention, 0):
        got = pk.decode(loaded, trials)
        want = [pk.greedy_without_cache(loaded, t.ids) for t in trials]
    assert got == want and all(got)


def test_batches_never_mix_token_counts():
    trials = [pk.Trial(1, 10, 0.0, "", tuple(range(n))) for n in (10, 9, 10, 10, 9)]
    plan = pk.batches(trials, batch_size=2)
    assert sorted(i for b in plan for i in b) == list(range(5))
    assert all(len({len(trials[i].ids) for i in b}) == 1 and len(b) <= 2 for b in plan)


def test_options_refuse_bad_values():
    for values, fragment in [({"depths": "0,1.5"}, "depths"), ({"depths": "a"}, "depths"),
                             ({"lengths": "1"}, "lengths"), ({"trials": 0}, "trials"),
                             ({"rope_scaling": "yarn"}, "yarn")]:
        with pytest.raises(ConfigError, match=fragment):
            PasskeyOptions.build(values, "t")


def test_conditions_intact_first_crossed_with_rope_scaling():
    o = PasskeyOptions.build({"intervention": "zero", "rope_scaling": "yarn:2"}, "t")
    got = [(str(c.intervention), str(c.rope or "none")) for c in conditions(o)]
    assert got == [("intact", "none"), ("intact", "yarn:2"), ("zero", "none"), ("zero", "yarn:2")]


def test_tables_and_not_applicable_rows(tiny, tmp_path):
    """gpt2 with 96 learned positions: 128-token prompts are n/a (with the 10 new tokens);
    20 tokens cannot hold the template; the accuracy rows count the trials and carry Wilson
    intervals (independent draws)."""
    loaded = tiny("gpt2", n_positions=96)
    o = PasskeyOptions.build({"model": "gpt2", "lengths": "20,80,128", "depths": "0,1",
                              "trials": 2, "intervention": "zero", "draws": "independent"}, "t")
    tables = run(o, loaded=loaded)
    trials, acc = tables["passkey_trials"], tables["passkey"]
    assert list(dict.fromkeys(trials["intervention"])) == ["intact", "zero"]
    assert len(trials) == 2 * 3 * 2 * 2
    at = trials.set_index(["intervention", "length"])["note"]
    assert at.loc[("intact", 128)].str.startswith("not applicable: 96 learned positions").all()
    assert at.loc[("intact", 20)].str.contains("template alone is longer").all()
    assert (at.loc[("intact", 80)] == "").all()
    scored = trials[trials["note"] == ""]
    assert (scored["tokens"] == 80).all() and scored["value"].isin([0.0, 1.0]).all()
    assert set(scored["k"]) == set(pk.keys(0, 80, 0.0, 2) + pk.keys(0, 80, 1.0, 2))
    assert scored["filler_offset"].nunique() > 1  # each trial its own draw
    whole = acc[(acc["depth"].astype(str) == "all") & (acc["length"] == 80)]
    assert list(whole["trials"]) == [4, 4]
    for _, row in whole.iterrows():
        assert (row["ci_low"], row["ci_high"]) == wilson(row["correct"], 4)
    na = acc[acc["length"] == 128]
    assert na["value"].isna().all() and (na["trials"] == 0).all() and na["note"].str.startswith("not applicable").all()
    for column in ("model_revision", "rope_parameters", "template", "decoding", "torch_version"):
        assert column in acc and column in trials


def test_an_interrupted_run_decodes_only_the_cells_it_had_not(tiny, interrupt):
    """Each finished (condition, length, depth) is saved as it finishes; a rerun after Ctrl-C
    decodes the rest and gives the uninterrupted run's tables; a finished run leaves none."""
    loaded = tiny("llama", max_position_embeddings=256)
    o = PasskeyOptions.build({"model": "llama", "lengths": "64,96", "depths": "0.5", "trials": 2,
                              "intervention": "zero", "draws": "independent"}, "t")
    full = run(o, loaded=loaded)
    calls = interrupt(pk, "decode", 3)  # intact's two cells done, zero's first interrupted
    with pytest.raises(KeyboardInterrupt):
        run(o, loaded=loaded)
    calls.clear()
    resumed = run(o, loaded=loaded)
    assert len(calls) == 2  # zero's two cells only
    cols = ["condition", "length", "trial", "k", "tokens", "output", "value"]
    assert resumed["passkey_trials"][cols].equals(full["passkey_trials"][cols])
    assert resumed["passkey"].drop(columns=["git_commit"], errors="ignore").equals(
        full["passkey"].drop(columns=["git_commit"], errors="ignore"))
    calls.clear()
    run(o, loaded=loaded)
    assert len(calls) == 4  # nothing left over from the finished run


def test_trials_that_share_their_filler_get_no_interval(tiny):
    """--draws fixed: a cell's trials differ only in the key, so they are not independent units;
    the table gives counts and accuracies, no Wilson interval and no bounds on the difference
    from intact, and the run says why in one warning."""
    loaded = tiny("gpt2", n_positions=96)
    o = PasskeyOptions.build({"model": "gpt2", "lengths": "80", "depths": "0,1", "trials": 3,
                              "draws": "fixed", "intervention": "zero"}, "t")
    with pytest.warns(UserWarning, match="share their filler"):
        tables = run(o, loaded=loaded)
    trials, acc = tables["passkey_trials"], tables["passkey"]
    assert (trials["filler_offset"] == 0).all()
    assert (acc["trials"] > 0).all() and acc["ci_low"].isna().all() and acc["ci_high"].isna().all()
    zero = acc[acc["intervention"] == "zero"]
    assert zero["diff_vs_intact"].notna().all() and zero[["diff_ci_low", "diff_ci_high"]].isna().all().all()


def test_accuracy_counts_and_intervals_from_trials():
    from pecli.measures.passkey import accuracy as _accuracy

    base = {"model": "m", "intervention": "intact", "rope_scaling": "none", "length": 64, "note": "",
            "trial": 0, "k": 1, "tokens": 64, "output": "", "answer": None, "metric": "correct"}
    rows = [{**base, "depth": d, "value": v} for d, v in [(0.0, 1.0), (0.0, 1.0), (0.0, 0.0),
                                                           (1.0, 0.0), (1.0, 0.0), (1.0, 1.0)]]
    acc = pd.DataFrame(_accuracy(rows)).set_index(pd.Index(["0", "1", "all"]))
    assert list(acc["correct"]) == [2, 1, 3] and list(acc["trials"]) == [3, 3, 6]
    assert acc.loc["all", "value"] == 0.5 and acc.loc["all", "tokens"] == 6 * 64
    assert (acc.loc["all", "ci_low"], acc.loc["all", "ci_high"]) == wilson(3, 6)


def test_wilson_interval_known_values():
    low, high = wilson(3, 10)
    assert abs(low - 0.1078) < 1e-4 and abs(high - 0.6032) < 1e-4
    assert wilson(5, 5)[1] == 1.0 and wilson(0, 5)[0] == 0.0
    assert all(x != x for x in wilson(0, 0))


def test_rope_scaling_on_learned_positions_is_refused(tiny):
    o = PasskeyOptions.build({"model": "gpt2", "lengths": "80", "rope_scaling": "linear:2"}, "t")
    with pytest.raises(ModelError, match="rope-scaling applies to rotary"):
        run(o, loaded=tiny("gpt2"))


def test_rope_scaled_decoding_is_transformers_own_scaled_model(tiny):
    """yarn:2 trials decode as LlamaForCausalLM built with the recorded rope_parameters does."""
    import json

    import transformers

    loaded = tiny("llama")
    loaded.model.double()
    o = PasskeyOptions.build({"model": "llama", "lengths": "96", "depths": "0.5", "trials": 2,
                              "rope_scaling": "yarn:2"}, "t")
    trials = run(o, loaded=loaded)["passkey_trials"]
    yarn = trials[trials["rope_scaling"] == "yarn:2"]
    params = json.loads(yarn["rope_parameters"].iloc[0])
    config = transformers.LlamaConfig(**{**loaded.model.config.to_dict(), "rope_parameters": params})
    twin = transformers.LlamaForCausalLM(config).double().eval()
    twin.load_state_dict(loaded.model.state_dict())
    own = type(loaded)(twin, loaded.tokenizer, loaded.spec, "twin", "twin", "random", "x",
                       torch.device("cpu"), torch.float64)
    want = [pk.greedy_without_cache(own, pk.fit(loaded.tokenizer, int(k), 96, 0.5).ids) for k in yarn["k"]]
    assert list(yarn["output"].fillna("")) == want


def test_figure(tiny, tmp_path):
    from pecli.plots.passkey import figures

    o = PasskeyOptions.build({"model": "llama", "lengths": "64,80", "depths": "0,0.5,1",
                              "trials": 1, "intervention": "zero"}, "t")
    run(o, loaded=tiny("llama"))["passkey"].to_csv(tmp_path / "passkey.csv", index=False)
    (png,) = figures({"passkey": tmp_path / "passkey.csv"}, tmp_path / "fig")
    assert png.exists() and png.stat().st_size > 10_000


def test_one_cell_per_condition_is_drawn_as_points_with_the_paired_difference(tiny, tmp_path, monkeypatch):
    """One length and one depth: the figure is one axes of points with Wilson bars (no
    heatmap of one-cell panels), each condition's paired difference from intact beneath it."""
    import matplotlib

    from pecli.plots import passkey as plot

    o = PasskeyOptions.build({"model": "llama", "lengths": "64", "depths": "0.5", "trials": 3,
                              "intervention": "intact,zero"}, "t")
    df = run(o, loaded=tiny("llama"))["passkey"]
    seen, real = [], plot.save
    monkeypatch.setattr(plot, "save", lambda fig, path: seen.append(fig) or real(fig, path))
    png = plot.heatmap(df, tmp_path / "passkey.png")
    (ax,) = seen[0].axes  # one axes: no colour bar, no panels
    assert not ax.images and png.stat().st_size > 10_000
    zero = df[(df["condition"] == "zero") & (df["depth"].astype(str) != "all")].iloc[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == "intact" and labels[1].startswith(f"zero\n{zero['diff_vs_intact']:+.2f}")
    matplotlib.pyplot.close("all")


def test_trials_of_a_cell_are_independent_draws_that_share_only_the_template(tiny):
    got = pk.draws(0, 96, 0.5, 20)
    assert got == pk.draws(0, 96, 0.5, 20) and got != pk.draws(1, 96, 0.5, 20)  # seeded
    assert [d.k for d in got] == pk.keys(0, 96, 0.5, 20)
    assert all(abs(d.depth - 0.5) <= pk.JITTER for d in got) and len({d.depth for d in got}) == 20
    sentences = lambda text: sorted(x.strip() for x in text.split(".") if x.strip())  # noqa: E731
    assert all(sentences(d.filler) == sentences(pk.FILLER) for d in got)  # its own order
    assert len({d.filler for d in got}) > 5 and len({d.offset for d in got}) > 10
    assert all(0.0 <= d.depth <= 1.0 for d in pk.draws(0, 96, 0.0, 50) + pk.draws(0, 96, 1.0, 50))
    # the prompt, literally: the trial's filler repeated, read from its offset, cut at its depth
    d = got[0]
    text = pk.prompt(d.k, 120, d.depth, d.filler, d.offset)
    stream = " ".join([d.filler] * 3)[d.offset:]
    before = round(d.depth * 120)
    assert text.split("\n") == [pk.INTRO, stream[:before], pk.KEY.format(k=d.k), stream[:120 - before], pk.QUESTION]
    tok = tiny("llama").tokenizer
    trials = [pk.fit(tok, x.k, 96, x.depth, x.filler, x.offset) for x in got[:4]]
    bodies = {t.text.replace(str(t.k), "K") for t in trials}
    assert len(bodies) == 4 and all(len(t.ids) <= 96 for t in trials)  # not only the key differs


def test_passkey_accuracy_rows_carry_the_paired_difference_from_intact():
    """Each condition's accuracy minus the intact model's on the same trials (same depth and
    trial index: the same prompt), with Newcombe's interval for paired proportions."""
    import numpy as np

    from pecli.measures.intervals import paired_proportion_difference as paired_difference
    from pecli.measures.passkey import accuracy as _accuracy

    rng = np.random.default_rng(3)
    right = {"intact": rng.random(24) < 0.3, "rerope:2048": rng.random(24) < 0.9}
    trials = [{"model": "m", "intervention": c, "rope_scaling": "none", "length": 64, "depth": d,
               "trial": k, "value": float(right[c][i]), "note": "", "tokens": 64, "metric": "correct"}
              for c in right for i, (d, k) in enumerate((d, k) for d in (0.0, 0.5, 1.0) for k in range(8))]
    rows = pd.DataFrame(_accuracy(trials)).set_index(["intervention", "depth"])
    assert rows.loc[("intact", "all"), ["diff_vs_intact", "diff_ci_low"]].isna().all()
    got = rows.loc[("rerope:2048", "all")]
    want = paired_difference(right["rerope:2048"].astype(float), right["intact"].astype(float))
    assert got["diff_vs_intact"] == pytest.approx(right["rerope:2048"].mean() - right["intact"].mean())
    assert (got["diff_vs_intact"], got["diff_ci_low"], got["diff_ci_high"]) == pytest.approx(want)
    at = rows.loc[("rerope:2048", 0.5)]  # one depth: its 8 pairs only
    assert at["diff_vs_intact"] == pytest.approx(right["rerope:2048"][8:16].mean() - right["intact"][8:16].mean())


def test_migrate_summarises_committed_passkey_tables_again(tiny, tmp_path):
    """pecli.experiments.migrate rewrites a section's passkey.csv from its trials as the code now
    summarises them: here a table whose paired-difference bounds were the old bootstrap's gets
    Newcombe's, every other cell byte for byte as before, the sidecar's hash and a note updated;
    a second pass changes nothing; a table whose counts disagree with its trials is refused."""
    import json

    from pecli.experiments.migrate import resummarize_passkey
    from pecli.runs.io import write_csv, write_json
    from pecli.runs.provenance import read_sha256

    o = PasskeyOptions.build({"model": "llama", "lengths": "64", "depths": "0.5", "trials": 6,
                              "draws": "independent", "intervention": "zero"}, "t")
    tables = run(o, loaded=tiny("llama"))
    section = tmp_path / "s"
    section.mkdir()
    stale = tables["passkey"].assign(diff_ci_low=lambda d: d["diff_ci_low"].where(d["diff_ci_low"].isna(), -0.5),
                                     diff_ci_high=lambda d: d["diff_ci_high"].where(d["diff_ci_high"].isna(), 0.5))
    csv = write_csv(stale, section / "passkey.csv")
    write_csv(tables["passkey_trials"], section / "passkey_trials.csv")
    write_json({"table_sha256": read_sha256(csv)}, section / "passkey.json")
    write_json({"config": {"options": {}}}, section / "done.json")  # today's default: the rows say
    before = pd.read_csv(csv, dtype=str, keep_default_na=False)
    assert resummarize_passkey(csv) and not resummarize_passkey(csv)
    after = pd.read_csv(csv, dtype=str, keep_default_na=False)
    fresh = pd.read_csv(io.StringIO(tables["passkey"].to_csv(index=False)), dtype=str, keep_default_na=False)
    assert after.equals(fresh)  # what a run today writes
    kept = [c for c in before.columns if c not in ("diff_ci_low", "diff_ci_high")]
    assert after[kept].equals(before[kept])
    meta = json.loads((section / "passkey.json").read_text())
    assert meta["table_sha256"] == read_sha256(csv) != meta["resummarized"]["table_sha256_before"]
    write_csv(stale.assign(correct=stale["correct"] + 1), csv)
    with pytest.raises(RuntimeError, match="correct"):
        resummarize_passkey(csv)
