"""pecli length: windows, the band pass, learned tables past their rows, the table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pecli.experiments.length import conditions, run, stream_of
from pecli.experiments.options.length import LengthOptions
from pecli.measures.length_scoring import buckets, cut, score_band, summarise
from pecli.measures.lm_scoring import score_windows
from pecli.measures.metrics import target_nll
from pecli.measures.training import ModelSize, build_model
from pecli.positions.extension import extended, not_applicable
from pecli.runs.errors import ConfigError, ModelError

STREAM = list(range(3, 103))  # 100 distinct ids


def test_nonoverlapping_full_windows_and_dropped_remainder():
    c = cut(STREAM, 32)
    assert len(c) == 3 and c.dropped_tokens == 100 - 96
    assert all(len(w.ids) == 32 and w.first == 1 for w in c.windows(STREAM))
    assert c.windows(STREAM)[1].ids == STREAM[32:64]  # a slice of the stream, nothing added
    assert c.tokens == 3 * 31
    lead = cut(STREAM, 32, start_token=0)
    assert lead.windows(STREAM)[0].ids == [0, *STREAM[:31]] and lead.windows(STREAM)[0].first == 1


@pytest.mark.parametrize("stride", [1, 5, 31])
def test_sliding_scores_every_token_once_with_up_to_length_minus_one_context(stride):
    c = cut(STREAM, 32, "sliding", stride)
    scored = []
    for w, begin in zip(c.windows(STREAM), c.offsets, strict=True):
        for t in range(w.first, len(w.ids)):
            scored.append(begin + t)
            assert t <= 31  # context: the t tokens before it in the window
            if begin > 0:
                assert t >= 32 - stride
    assert scored == list(range(1, 100))


def test_bad_windows_fail_clearly():
    with pytest.raises(ConfigError, match="stride"):
        cut(STREAM, 32, "sliding", 40)
    with pytest.raises(ConfigError, match="band"):
        cut(STREAM, 32, "band", 4)
    with pytest.raises(ConfigError, match="sliding"):
        LengthOptions.build({"stride": 3}, "t")
    with pytest.raises(ConfigError, match="lengths"):
        LengthOptions.build({"lengths": "128,x"}, "t")


def _brute(loaded, stream, c):
    """Each target from its own context, one unbatched forward each: the definition."""
    out = []
    with torch.inference_mode():
        for begin, first, size in zip(c.offsets, c.firsts, c.sizes, strict=True):
            nll = []
            for t in range(first, size):
                ids = torch.tensor([stream[begin:begin + t]])
                logits = loaded.model(ids).logits[0, -1:]
                nll.append(target_nll(logits, torch.tensor([stream[begin + t]])))
            out.append(torch.cat(nll) if nll else torch.empty(0))
    return out


def test_sliding_per_window_equals_the_definition(tiny):
    loaded = tiny("llama")
    stream = torch.randint(5, 500, (60,), generator=torch.Generator().manual_seed(0)).tolist()
    c = cut(stream, 16, "sliding", 5)
    with torch.inference_mode():
        fast = score_windows(loaded, c.windows(stream), batch_size=4)
    assert torch.allclose(torch.cat(fast), torch.cat(_brute(loaded, stream, c)), atol=1e-4)


def _trained(scheme, layers, positions=64, seed=0):
    from tests.conftest import make_tiny

    base = make_tiny("gpt2" if scheme != "rope" else "llama")
    tok = base.tokenizer
    model = build_model(scheme, len(tok), ModelSize(layers, 32, 4, positions), pad_token_id=tok.pad_token_id,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, seed=seed).eval()
    from pecli.models.architectures import ARCHITECTURES

    return type(base)(model, tok, ARCHITECTURES.get("llama" if scheme == "rope" else "gpt2"),
                      f"tiny-{scheme}", f"tiny-{scheme}", "local", "seed", torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("scheme", ["rope", "none", "alibi"])
def test_band_pass_equals_per_window_loop_for_one_layer(scheme):
    """Attention depending only on offsets, one layer: one band-masked pass is the sliding
    loop at stride 1 (chunked or not)."""
    loaded = _trained(scheme, layers=1)
    stream = torch.randint(5, 500, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    c = cut(stream, 24, "band")
    with torch.inference_mode():
        loop = torch.cat(score_windows(loaded, c.windows(stream), batch_size=32))
    for chunk in (40, 4096):
        band = torch.cat(score_band(loaded, stream, c, chunk=chunk))
        assert band.shape == loop.shape == (149,)
        assert torch.allclose(band, loop, atol=1e-5), (chunk, (band - loop).abs().max())


def test_band_pass_is_sliding_window_attention_not_the_loop_with_two_layers():
    """With 2 layers a key carries what it saw below, L-2 tokens back from itself: past the
    window's start. The first window (no earlier tokens) still agrees; later ones do not."""
    loaded = _trained("rope", layers=2)
    stream = torch.randint(5, 500, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    c = cut(stream, 24, "band")
    with torch.inference_mode():
        loop = torch.cat(score_windows(loaded, c.windows(stream), batch_size=32))
    band = torch.cat(score_band(loaded, stream, c))
    assert torch.allclose(band[:23], loop[:23], atol=1e-5)
    assert (band[30:] - loop[30:]).abs().max() > 1e-3


def test_learned_positions_past_their_rows_are_not_applicable(tiny, docs):
    loaded = tiny("gpt2")  # 64 rows
    assert not_applicable(loaded, 64) is None
    assert not_applicable(loaded, 65) == "not applicable: 64 learned positions"
    with pytest.raises(ModelError, match="64 learned positions"), extended(loaded, 65):
        pass
    options = LengthOptions.build({"model": "gpt2", "lengths": "32,128", "limit": 3,
                                   "bootstrap": 100}, "t")
    df = _run_on(loaded, options, docs)
    na = df[df["length"] == 128]
    assert len(na) == 1 and na["note"].iloc[0] == "not applicable: 64 learned positions"
    assert na["value"].isna().all() and (na["tokens"] == 0).all()
    assert df[df["length"] == 32]["value"].notna().all()


def test_sinusoidal_checkpoint_extends_its_table():
    loaded = _trained("sinusoidal", layers=1, positions=32)
    wpe = loaded.model.transformer.wpe
    before = wpe.weight.clone()
    stream = torch.randint(5, 500, (200,), generator=torch.Generator().manual_seed(2)).tolist()
    with extended(loaded, 96) as rows:
        assert rows == 32 and wpe.weight.shape[0] == 96
        assert torch.equal(wpe.weight[:32], before)
        with torch.inference_mode():
            long = score_windows(loaded, cut(stream, 96).windows(stream))
        # the rows past 32 are the sinusoid the model was trained with, at its scale
        longer = _trained("sinusoidal", layers=1, positions=96).model.transformer.wpe.weight
        assert torch.allclose(wpe.weight, longer, atol=1e-7)
    assert torch.equal(wpe.weight, before) and wpe.num_embeddings == 32  # restored
    assert len(long) == 2 and all(torch.isfinite(x).all() for x in long)
    assert not_applicable(_trained("learned", 1, 32), 96) == "not applicable: 32 learned positions"


def test_summarise_buckets_partition_the_tokens():
    c = cut(STREAM, 32)
    rng = np.random.default_rng(0)
    nlls = [torch.from_numpy(rng.random(31)) for _ in range(len(c))]
    rows = summarise(nlls, c, 4, 200, 0)
    assert [(r["window_start"], r["window_end"]) for r in rows] == [*buckets(32, 4), (0, 32)]
    assert sum(r["tokens"] for r in rows[:-1]) == rows[-1]["tokens"] == 93
    whole = float(torch.cat(nlls).mean())
    assert rows[-1]["nll_mean"] == pytest.approx(whole) and rows[-1]["all_positions"]
    assert rows[0]["tokens"] == 3 * 7  # positions 1..7 (position 0 is never a target)
    for r in rows:  # three windows: the units, and no interval (fewer than MIN_WINDOWS)
        assert r["windows"] == 3 and np.isnan(r["ci_low"]) and np.isnan(r["ci_high"])
    many = cut(np.tile(STREAM, 5), 32)  # ten windows or more: an interval over them
    assert len(many) >= 10
    long = [torch.from_numpy(rng.random(31)) for _ in range(len(many))]
    whole = summarise(long, many, 4, 200, 0)[-1]
    assert whole["windows"] == len(many) and whole["ci_low"] < whole["perplexity"] < whole["ci_high"]
    sums = np.array([x.sum().item() for x in long])
    idx = np.random.default_rng(0).integers(0, len(many), size=(200, len(many)))
    by_hand = np.percentile(np.exp(sums[idx].sum(1) / (31 * len(many))), [2.5, 97.5])
    np.testing.assert_allclose([whole["ci_low"], whole["ci_high"]], by_hand, rtol=1e-9)
    # against intact on the same windows: the difference's bootstrap draws the same windows for both
    base = [x - 0.2 * torch.from_numpy(rng.random(31)) for x in long]
    paired = summarise(long, many, 4, 200, 0, intact=base)[-1]
    sums0 = np.array([x.sum().item() for x in base])
    n = 31 * len(many)
    diffs = np.exp(sums[idx].sum(1) / n) - np.exp(sums0[idx].sum(1) / n)
    assert paired["diff_vs_intact"] == pytest.approx(np.exp(sums.sum() / n) - np.exp(sums0.sum() / n), rel=1e-12)
    np.testing.assert_allclose([paired["diff_ci_low"], paired["diff_ci_high"]],
                               np.percentile(diffs, [2.5, 97.5]), rtol=1e-9)
    assert np.isnan(whole["diff_vs_intact"]) and np.isnan(rows[-1]["diff_ci_low"])  # no intact given
    one = cut(STREAM[:40], 32)  # a single window: no interval, rather than a zero-width one
    alone = summarise(nlls[:1], one, 4, 200, 0)[-1]
    assert alone["windows"] == 1 and np.isnan(alone["ci_low"]) and np.isnan(alone["ci_high"])


def test_stream_joins_documents_by_eos_in_order(tiny):
    tok = tiny("gpt2").tokenizer
    stream = stream_of(tok, ["a b", "c"])
    eos = tok.eos_token_id
    assert stream == [*tok("a b", add_special_tokens=False)["input_ids"], eos,
                      *tok("c", add_special_tokens=False)["input_ids"]]


def test_conditions_intact_first_then_crossed():
    o = LengthOptions.build({"intervention": "intact,zero", "rope_scaling": "yarn:2"}, "t")
    got = [(str(c.intervention), str(c.rope or "none")) for c in conditions(o)]
    assert got == [("intact", "none"), ("intact", "yarn:2"), ("zero", "none"), ("zero", "yarn:2")]


def _run_on(loaded, options, docs):
    return run(options.replace(dataset=str(docs)), loaded=loaded)["length"]


@pytest.fixture
def docs(tmp_path):
    """A three-document dataset (no shared data needed)."""
    import pandas as pd

    path = tmp_path / "docs.csv"
    pd.DataFrame({"text": ["The grass is green. " * 30, "The sky is blue. " * 30,
                           "Here we go, there and back again. " * 20]}).to_csv(path, index=False)
    return path


def test_run_rows_and_rope_provenance(tiny, docs):
    import json

    loaded = tiny("llama")
    o = LengthOptions.build({"model": "llama", "lengths": "16,32", "rope_scaling": "yarn:2",
                             "bootstrap": 100, "buckets": 4}, "t")
    df = _run_on(loaded, o, docs)
    assert list(dict.fromkeys(df["rope_scaling"])) == ["none", "yarn:2"]
    whole = df[df["all_positions"]]
    assert len(whole) == 4 and (whole["dropped_tokens"] >= 0).all()
    yarn = json.loads(df[df["rope_scaling"] == "yarn:2"]["rope_parameters"].iloc[0])
    assert yarn["original_max_position_embeddings"] == 64 and yarn["factor"] == 2.0
    assert json.loads(df["rope_parameters"].iloc[0])["rope_type"] == "default"
    assert (df["tokens"] > 0).all() and np.isfinite(df["nll_mean"]).all()
    with pytest.raises(ModelError, match="rotary"):
        _run_on(tiny("gpt2"), o, docs)


def test_run_equals_transformers_own_scaled_model(tiny, docs):
    """length.csv's yarn numbers = transformers' LlamaForCausalLM built with those rope_parameters."""
    import json

    import transformers

    loaded = tiny("llama")
    o = LengthOptions.build({"model": "llama", "lengths": "48", "rope_scaling": "yarn:2",
                             "bootstrap": 0, "buckets": 1}, "t")
    df = _run_on(loaded, o, docs)
    row = df[(df["rope_scaling"] == "yarn:2") & df["all_positions"]].iloc[0]
    params = json.loads(row["rope_parameters"])
    config = transformers.LlamaConfig(**{**loaded.model.config.to_dict(), "rope_parameters": params})
    own = transformers.LlamaForCausalLM(config).eval()
    own.load_state_dict(loaded.model.state_dict())
    data_texts = __import__("pandas").read_csv(docs)["text"].tolist()
    stream = stream_of(loaded.tokenizer, data_texts)
    c = cut(stream, 48)
    total, count = 0.0, 0
    with torch.inference_mode():
        for w in c.windows(stream):
            logits = own(torch.tensor([w.ids])).logits[0, :-1]
            total += float(target_nll(logits, torch.tensor(w.ids[1:])).double().sum())
            count += len(w.ids) - 1
    assert row["tokens"] == count
    assert row["nll_mean"] == pytest.approx(total / count, rel=1e-5)


def test_interrupted_run_resumes_after_the_last_finished_condition(tiny, docs, interrupt):
    from pecli.measures import lm_scoring

    loaded = tiny("llama")
    o = LengthOptions.build({"model": "llama", "lengths": "16,32", "rope_scaling": "linear:2",
                             "bootstrap": 100}, "t").replace(dataset=str(docs))
    full = run(o, loaded=loaded)["length"]
    calls = interrupt(lm_scoring, "score_windows", 3)  # the third (condition, length)
    with pytest.raises(KeyboardInterrupt):
        run(o, loaded=loaded)
    calls.clear()
    resumed = run(o, loaded=loaded)["length"]
    assert len(calls) == 2  # only the two unfinished (condition, length) pairs
    cols = ["rope_scaling", "length", "window_start", "nll_mean", "ci_low", "tokens"]
    assert resumed[cols].equals(full[cols])


def test_a_run_that_fails_writing_its_tables_keeps_its_progress(tiny, docs, interrupt, tmp_path,
                                                               monkeypatch):
    """The checkpoint a finished run clears goes only once its tables are in place: a full
    disk while writing them leaves it, and the rerun writes without computing again."""
    from pecli.measures import lm_scoring
    from pecli.runs import io
    from pecli.runs.errors import OutputError

    loaded = tiny("llama")
    o = LengthOptions.build({"model": "llama", "lengths": "16,32", "rope_scaling": "linear:2",
                             "bootstrap": 100}, "t").replace(dataset=str(docs))
    calls = interrupt(lm_scoring, "score_windows", 0)  # counts, never interrupts
    real = io.write_csv

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    partial = io.cache_dir() / "partial"
    before = set(partial.glob("length-*.npz"))  # the cache may hold other tests' progress
    with pytest.raises(OutputError, match="No space left"), io.RunOutput(tmp_path / "out") as output:
        frames = run(o, loaded=loaded)
        monkeypatch.setattr(io, "write_csv", full_disk)
        output.write(frames, {})
    saved = sorted(set(partial.glob("length-*.npz")) - before)
    assert len(calls) == 4 and len(saved) == 1 and not (tmp_path / "out").exists()
    monkeypatch.setattr(io, "write_csv", real)
    calls.clear()
    with io.RunOutput(tmp_path / "out") as output:
        again = run(o, loaded=loaded)
        output.write(again, {})
    assert not calls and again["length"].equals(frames["length"])  # resumed: nothing computed
    assert (tmp_path / "out" / "length.csv").exists() and not saved[0].exists()


def test_rotary_interventions_act_on_the_scaled_model(tiny, docs):
    """zero replaces the rotary output by cos = 1, sin = 0, so yarn (which scales cos and sin)
    changes nothing under it; were the intervention hooked to the replaced module, it would."""
    loaded = tiny("llama")
    o = LengthOptions.build({"model": "llama", "lengths": "48,128", "intervention": "intact,zero,shuffle",
                             "rope_scaling": "yarn:2", "bootstrap": 0, "buckets": 1}, "t")
    df = _run_on(loaded, o, docs)
    whole = df[df["all_positions"] & (df["length"] == 48)].set_index(["intervention", "rope_scaling"])
    # the same model once the rotation is removed (to float rounding of the chunked head)
    assert whole.loc[("zero", "yarn:2"), "nll_mean"] == pytest.approx(whole.loc[("zero", "none"), "nll_mean"], rel=1e-6)
    assert whole.loc[("intact", "yarn:2"), "nll_mean"] != whole.loc[("intact", "none"), "nll_mean"]
    past = df[(df["length"] == 128) & (df["intervention"] == "shuffle")]
    assert past["note"].str.startswith("not applicable: shuffle permutes the model's 64").all()


def test_band_rows_that_do_not_apply_say_why(tiny, docs):
    o = LengthOptions.build({"model": "llama", "lengths": "32", "intervention": "intact,zero",
                             "mask_semantics": "legacy,log-bias", "rope_scaling": "dynamic:2",
                             "windows": "band", "bootstrap": 0, "buckets": 1}, "t")
    df = _run_on(tiny("llama"), o, docs)
    whole = df[df["all_positions"]]
    assert len(whole) == 4  # the default mask once per intervention, not once per semantics
    done = whole[whole["note"].fillna("") == ""]
    assert list(zip(done["intervention"], done["rope_scaling"], strict=True)) == [("intact", "none")]
    assert (done["passes"] == "band pass").all()
    notes = whole[whole["note"].fillna("") != ""]["note"]
    assert notes.str.startswith("not applicable: ").all() and notes.str.contains("dynamic").any()
    learned = _run_on(tiny("gpt2"), o.replace(rope_scaling=None), docs)
    assert learned["note"].str.contains("learned absolute positions, which restart").all()


def test_a_sections_table_from_few_windows_summarised_again_is_what_a_run_writes(tiny, docs, tmp_path):
    """resummarize_length: a length.csv written before its paired differences, with intervals
    from fewer than 10 windows, becomes what a run today writes (no interval; each condition's
    difference from intact), every other cell unchanged; a second pass changes nothing; a table
    with buckets of 10 windows or more is refused (its paired interval needs the windows)."""
    import io
    import json

    import pandas as pd

    from pecli.experiments.migrate import resummarize_length
    from pecli.measures.intervals import DIFF_COLUMNS
    from pecli.runs.io import write_csv, write_json
    from pecli.runs.provenance import read_sha256

    o = LengthOptions.build({"model": "llama", "lengths": "64", "intervention": "zero",
                             "rope_scaling": "yarn:2", "bootstrap": 100, "buckets": 2}, "t")
    fresh = _run_on(tiny("llama"), o, docs)
    assert (fresh["windows"] < 10).all() and fresh["ci_low"].isna().all()
    assert fresh.loc[fresh["condition"] != "intact", "diff_vs_intact"].notna().all()
    section = tmp_path / "s"
    section.mkdir()
    before = fresh.drop(columns=list(DIFF_COLUMNS)).assign(ci_low=1.0, ci_high=2.0)  # as once written
    csv = write_csv(before, section / "length.csv")
    write_json({"table_sha256": read_sha256(csv)}, section / "length.json")
    write_json({"config": {"options": {}}}, section / "done.json")
    assert resummarize_length(csv) and not resummarize_length(csv)
    after = pd.read_csv(csv, dtype=str, keep_default_na=False)
    want = pd.read_csv(io.StringIO(fresh.to_csv(index=False)), dtype=str, keep_default_na=False)
    assert set(after.columns) == set(want.columns)
    same = [c for c in after.columns if c != "diff_vs_intact"]
    assert after[same].equals(want[same])
    assert np.allclose(pd.to_numeric(after["diff_vs_intact"]), pd.to_numeric(want["diff_vs_intact"]),
                       rtol=1e-12, atol=0, equal_nan=True)
    assert "resummarized" in json.loads((section / "length.json").read_text())
    write_csv(before.assign(windows=10), csv)
    with pytest.raises(RuntimeError, match="rerun the section"):
        resummarize_length(csv)
