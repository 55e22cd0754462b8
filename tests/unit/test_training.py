"""Position schemes for training: the NoPE identity, loss goes down, checkpoints round-trip."""

from __future__ import annotations

import math

import pytest
import torch

from pecli.experiments.toy import (
    arithmetic_examples,
    attention_rows,
    batch_iterator,
    char_tokenizer,
    repeat_gaps,
)
from pecli.measures.training import (
    FAMILY,
    SCHEMES,
    ModelSize,
    TrainConfig,
    build_model,
    save_checkpoint,
    scheme_of,
    sinusoid_table,
    torch_threads,
    train,
)
from pecli.runs.errors import ConfigError

SIZE = ModelSize(layers=2, width=32, heads=4, positions=16)


def tiny(scheme: str, seed: int = 0):
    tok = char_tokenizer()
    model = build_model(scheme, len(tok), SIZE, pad_token_id=tok.pad_token_id,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, seed=seed)
    return model.eval(), tok


def probe_ids(tok, text: str = "21+21=") -> list[int]:
    return [tok.bos_token_id] + tok(text)["input_ids"]


def _recorded_qk(model, ids: list[int]):
    """Layer-1 (query, key) [heads, t, d] captured by a registered attention function."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    seen = []

    def record(module, query, key, value, attention_mask, **kwargs):
        seen.append((query[0].clone(), key[0].clone()))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("pecli_test_record", record)
    before = model.config._attn_implementation
    model.set_attn_implementation("pecli_test_record")
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([ids]))
    finally:
        model.set_attn_implementation(before)
    return seen[0]


def test_none_identical_tokens_have_identical_layer1_attention():
    """With no position information, two copies of a token at positions p < q have, in layer 1,
    the same query and key vectors (up to float rounding: a GEMM kernel may tile rows
    differently, so bitwise equality is machine dependent). Hence (1) the logits of row q over
    the keys both rows see (j <= p) equal those of row p; (2) query q gives the two copies the
    same weight, a[q, p] == a[q, q]. (The full rows cannot be equal under a causal mask: row q
    has q - p more keys; its probabilities over j <= p are row p's times a constant.) The
    tolerance, 1e-6, is 100x below the gaps that position information opens (next test)."""
    model, tok = tiny("none")
    ids = probe_ids(tok)  # <bos> 2 1 + 2 1 =
    pairs = [(p, q) for q in range(len(ids)) for p in range(q) if ids[p] == ids[q]]
    assert pairs == [(1, 4), (2, 5)]
    query, key = _recorded_qk(model, ids)  # [heads, t, d]
    logits = query @ key.transpose(-1, -2)  # [heads, t, t]
    probs = attention_rows(model, torch.tensor([ids]))[0]  # [heads, t, t]
    for p, q in pairs:
        exact = dict(rtol=0, atol=1e-6)
        torch.testing.assert_close(query[:, p], query[:, q], **exact)
        torch.testing.assert_close(key[:, p], key[:, q], **exact)
        torch.testing.assert_close(logits[:, q, : p + 1], logits[:, p, : p + 1], **exact)
        torch.testing.assert_close(probs[:, q, p], probs[:, q, q], **exact)
        renorm = probs[:, q, : p + 1] / probs[:, q, : p + 1].sum(-1, keepdim=True)
        torch.testing.assert_close(renorm, probs[:, p, : p + 1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("scheme", ["learned", "sinusoidal", "rope"])
def test_position_information_breaks_the_identity(scheme):
    model, tok = tiny(scheme)
    ids = probe_ids(tok)
    query, _ = _recorded_qk(model, ids)
    assert (query[:, 1] - query[:, 4]).abs().max() > 1e-4
    gaps = repeat_gaps(attention_rows(model, torch.tensor([ids]))[0], ids)
    assert gaps["repeat_key_gap"] > 1e-4 and gaps["shared_key_row_gap"] > 1e-4


def test_alibi_is_relative_in_layer1():
    """ALiBi: same query and key for copies (no absolute position), so over shared keys the
    rows agree after renormalising, but query q prefers the nearer copy: a[q, q] > a[q, p]."""
    model, tok = tiny("alibi")
    ids = probe_ids(tok)
    probs = attention_rows(model, torch.tensor([ids]))[0]
    gaps = repeat_gaps(probs, ids)
    assert gaps["shared_key_row_gap"] < 1e-6
    assert (probs[:, 4, 4] > probs[:, 4, 1]).all()


def test_sinusoid_table_formula_and_shift():
    table = sinusoid_table(50, 16)  # [50, 16]
    pos, i = 7, 3
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    # PE(p) . PE(q) depends only on p - q.
    torch.testing.assert_close(table[3] @ table[10], table[20] @ table[27], rtol=0, atol=1e-5)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_loss_decreases(scheme):
    model, tok = tiny(scheme)
    batches = batch_iterator(tok, arithmetic_examples(10), batch=32, seed=0)
    with torch_threads(1):  # a second thread only adds synchronisation at this size
        losses = train(model, batches, TrainConfig(steps=20, lr=1e-2, warmup=5))["losses"]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


@pytest.mark.parametrize("scheme", ["sinusoidal", "none", "alibi", "t5"])
def test_fixed_position_tables_stay_fixed(scheme):
    from pecli.models.architectures import ARCHITECTURES, position_embedding

    model, tok = tiny(scheme)
    wpe = position_embedding(model, ARCHITECTURES.get("gpt2")).weight
    before = wpe.detach().clone()
    expected = torch.zeros_like(wpe)
    if scheme == "sinusoidal":
        expected = sinusoid_table(*wpe.shape) * model.config.pecli_sinusoid_scale
        assert model.config.pecli_sinusoid_scale == pytest.approx(0.02 * math.sqrt(2))
    assert torch.equal(before, expected)
    train(model, batch_iterator(tok, arithmetic_examples(5), 8, 0), TrainConfig(steps=3))
    assert torch.equal(wpe.detach(), before)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_checkpoint_round_trips_through_load_model(scheme, tmp_path):
    from pecli.models.loading import load_model

    model, tok = tiny(scheme, seed=1)
    save_checkpoint(model, tok, tmp_path / scheme)
    loaded = load_model(str(tmp_path / scheme), device="cpu")
    assert scheme_of(loaded.model) == scheme
    assert loaded.spec.family == FAMILY[scheme]
    assert loaded.model.config._attn_implementation == model.config._attn_implementation
    ids = torch.tensor([probe_ids(tok, "12+34=46")])
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, loaded.model(input_ids=ids).logits)
    assert loaded.tokenizer("1+2=")["input_ids"] == tok("1+2=")["input_ids"]


def test_alibi_checkpoint_loads_in_a_fresh_process(tmp_path):
    """A new process (no pecli.measures.training imported) must register ALiBi before loading."""
    import subprocess
    import sys

    model, tok = tiny("alibi", seed=1)
    save_checkpoint(model, tok, tmp_path / "alibi")
    code = ("import sys; from pecli.models.loading import load_model; "
            "assert 'pecli.measures.training' not in sys.modules; "
            "m = load_model(sys.argv[1], device='cpu').model; "
            "print(m.config._attn_implementation)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "alibi")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == model.config._attn_implementation


def test_unknown_scheme_is_a_config_error():
    from pecli.experiments.options.toy import ToyOptions
    from pecli.experiments.options.train_lm import TrainLmOptions

    def pe(value):
        return [str(c) for c in TrainLmOptions.build({"pe": value}, "t").pe]

    assert pe("none, rope") == ["none", "rope"]
    assert pe(["learned", "learned,alibi"]) == ["learned", "alibi"]
    from pecli.experiments.options.toy_length import ToyLengthOptions

    assert set(SCHEMES) == {str(c) for c in ToyLengthOptions().pe}  # every scheme, by default
    assert [str(c) for c in ToyOptions().pe] == list(SCHEMES[:5])  # arithmetic: the first five
    with pytest.raises(ConfigError, match="^t: .*unknown position encoding 'nope'"):
        TrainLmOptions.build({"pe": ["nope"]}, "t")
    with pytest.raises(ConfigError, match="unknown position encoding 'nope'"):
        build_model("nope", 10, ModelSize(1, 8, 2, 8), pad_token_id=0, bos_token_id=0,
                    eos_token_id=0)


def test_committed_demo_checkpoint_loads():
    """models/tiny-gpt2-imdb: the offline GPT-2 for E2/E3 (learned wpe, under 20 MB)."""
    from pathlib import Path

    from pecli.models.architectures import position_embedding
    from pecli.models.loading import load_model

    folder = Path(__file__).resolve().parents[2] / "models" / "tiny-gpt2-imdb"
    assert sum(f.stat().st_size for f in folder.iterdir()) < 20 * 2**20
    loaded = load_model(str(folder), device="cpu")
    assert loaded.spec.family == "gpt2" and scheme_of(loaded.model) == "learned"
    wpe = position_embedding(loaded.model, loaded.spec).weight
    assert wpe.shape[0] == loaded.max_positions == 128 and wpe.abs().sum() > 0
    ids = loaded.tokenizer("This movie was", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        assert torch.isfinite(loaded.model(input_ids=ids).logits).all()


def test_train_lm_test_perplexity_interval_resamples_seeds_and_the_shared_windows():
    """train lm's mean over seeds: each seed's corpus perplexity (exp of the mean of its
    windows' mean NLL, windows of one length) with seeds and the windows every seed was
    scored on resampled together, one draw of windows per resample (written out); the
    per-window values stay out of the tables."""
    import numpy as np

    from pecli.experiments.train_lm import PER_WINDOW, _tables

    rng = np.random.default_rng(1)
    per = [rng.gamma(20.0, 0.14, 40) for _ in range(3)]  # [seed][window] mean NLL
    from pecli.runs.tables import CORE_COLUMNS, MODEL_COLUMNS

    filled = dict.fromkeys(CORE_COLUMNS + MODEL_COLUMNS, "x")
    rows = [[{**filled, "model": "lm-learned", "metric": m, "seed": s, "model_revision": f"seed:{s}",
              "value": float(np.exp(w.mean())) if m == "test_perplexity" else float(w.mean()),
              PER_WINDOW: w} for m in ("test_perplexity", "test_nll")] for s, w in enumerate(per)]
    results = [{"perplexity": r, "curve": [{**filled, "metric": "train_loss", "value": 1.0}],
                "length": [], "positions": []} for r in rows]
    tables = _tables([], results)
    assert all(PER_WINDOW not in t.columns for t in tables.values())
    ppl = tables["perplexity"].set_index("metric").loc["test_perplexity"]
    d = np.stack(per)  # [seed, window]
    g = np.random.default_rng(0)
    windows = g.integers(0, 40, (1000, 40))
    within = np.exp(np.stack([d[s][windows].mean(1) for s in range(3)], 1))
    stats = np.take_along_axis(within, g.integers(0, 3, (1000, 3)), 1).mean(1)
    np.testing.assert_allclose([ppl["ci_low"], ppl["ci_high"]], np.percentile(stats, [2.5, 97.5]),
                               rtol=1e-12)
    assert ppl["value"] == pytest.approx(np.mean(np.exp(d.mean(1))))


def test_train_lm_length_table_resamples_seeds_and_the_shared_windows():
    """train lm's length rows: a seed's bucket perplexity is exp of its windows' NLL sums over
    their target counts; the mean over seeds' interval draws seeds and the windows every seed
    was scored on together (written out); the per-window sums stay out of the table, and
    seeds scored on different windows are refused."""
    import numpy as np
    import pandas as pd

    from pecli.experiments.train_lm import length_over_seeds
    from pecli.measures.intervals import SEEDS_CROSSED_TEXTS
    from pecli.measures.length_scoring import PER_WINDOW

    rng = np.random.default_rng(3)
    counts = rng.integers(5, 9, 25)  # targets per window in the bucket
    sums = [rng.gamma(20.0, 0.15, 25) * counts for _ in range(4)]  # [seed][window]
    rows = [{"model": "lm-rope", "metric": "perplexity", "length": 64, "window_start": 0,
             "all_positions": True, "seed": s, "model_revision": f"seed:{s}",
             "value": float(np.exp(x.sum() / counts.sum())), PER_WINDOW[0]: x, PER_WINDOW[1]: counts}
            for s, x in enumerate(sums)]
    out = length_over_seeds(pd.DataFrame(rows)).iloc[0]
    assert not set(PER_WINDOW) & set(out.index) and out["interval"] == SEEDS_CROSSED_TEXTS
    g = np.random.default_rng(0)
    windows = g.integers(0, 25, (1000, 25))
    within = np.exp(np.stack([x[windows].sum(1) / counts[windows].sum(1) for x in sums], 1))
    stats = np.take_along_axis(within, g.integers(0, 4, (1000, 4)), 1).mean(1)
    np.testing.assert_allclose([out["ci_low"], out["ci_high"]], np.percentile(stats, [2.5, 97.5]),
                               rtol=1e-12)
    assert out["value"] == pytest.approx(np.mean([np.exp(x.sum() / counts.sum()) for x in sums]))
    rows[2][PER_WINDOW[1]] = counts[::-1].copy()
    with pytest.raises(ValueError, match="same windows"):
        length_over_seeds(pd.DataFrame(rows))
    rows[2][PER_WINDOW[1]] = counts  # equal counts, but seed 1 read another stream
    streams = [{**r, "stream_tokens": 39725 + (r["seed"] == 1), "windows": 25} for r in rows]
    with pytest.raises(ValueError, match="same windows"):
        length_over_seeds(pd.DataFrame(streams))
    same = [{**r, "stream_tokens": 39725, "windows": 25} for r in rows]
    assert length_over_seeds(pd.DataFrame(same)).iloc[0]["ci_low"] == out["ci_low"]


def test_train_lm_positions_table_pairs_zero_with_intact_over_seeds_and_texts():
    """The positions table: each condition's corpus perplexity over seeds, its interval and
    zero's paired difference from intact resampling seeds and the shared texts together
    (intervals.seeds_and_texts_interval, itself written out in test_intervals)."""
    import numpy as np
    import pandas as pd

    from pecli.experiments.train_lm import positions_over_seeds
    from pecli.measures.intervals import seeds_and_texts_interval

    rng = np.random.default_rng(2)
    tokens = rng.integers(10, 64, 30)
    texts, rows = [], []
    for seed in range(3):
        base = rng.gamma(20.0, 0.8, 30)
        for cond, scale in (("intact", 1.0), ("zero", 1.5)):
            ppl = base * scale * np.exp(rng.normal(0, 0.05, 30))
            texts.append(pd.DataFrame({"intervention": cond, "text_id": range(30), "text_tokens": tokens,
                                       "value": ppl, "pe": "learned", "seed": seed}))
            corpus = float(np.exp((tokens * np.log(ppl)).sum() / tokens.sum()))
            rows.append({"model": "lm-learned", "pe": "learned", "intervention": cond, "seed": seed,
                         "metric": "checkpoint_perplexity", "value": corpus, "model_revision": "r"})
    texts = pd.concat(texts, ignore_index=True)
    out = positions_over_seeds(pd.DataFrame(rows), texts).set_index("intervention")
    logs = {c: [np.log(texts[(texts.intervention == c) & (texts.seed == s)]["value"].to_numpy())
                for s in range(3)] for c in ("intact", "zero")}
    w = [tokens.astype(float)] * 3
    boot = {"weights": w, "transform": np.exp, "same_texts": True, "seed": 0}
    assert out.loc["zero", ["ci_low", "ci_high"]].tolist() == list(seeds_and_texts_interval(logs["zero"], **boot))
    assert out.loc["zero", "diff_vs_intact"] == pytest.approx(out.loc["zero", "value"] - out.loc["intact", "value"])
    assert [out.loc["zero", "diff_ci_low"], out.loc["zero", "diff_ci_high"]] == list(
        seeds_and_texts_interval(logs["zero"], reference=logs["intact"], **boot))
    assert out.loc["zero", "diff_ci_low"] > 0 and np.isnan(out.loc["intact", "diff_vs_intact"])
    corpus = [np.exp((tokens * g).sum() / tokens.sum()) for g in logs["zero"]]  # the rows' own values
    assert out.loc["zero", "value"] == pytest.approx(np.mean(corpus))


def test_toy_arithmetic_over_training_seeds():
    """`--seeds N`: every seed answers the same test sums, so the accuracy row is the mean of
    the seeds' exact match with the crossed two-level bootstrap of their items, written here
    from the per-seed items; seed --seed's model is the one-seed run's; workers change nothing."""
    import numpy as np
    import pandas as pd

    from pecli.experiments.options.toy import ToyOptions
    from pecli.experiments.toy import run
    from pecli.measures.intervals import SEEDS_CROSSED_TEXTS, seeds_and_texts_interval

    o = ToyOptions.build({"pe": "none,learned", "max_n": 12, "steps": 40, "layers": 1, "width": 16,
                          "heads": 2, "seeds": 3, "seed": 5}, "t")
    tables = run(o)
    by_seed, acc = tables["by_seed"], tables["accuracy"]
    for (pe, op), rows in by_seed[by_seed.metric == "exact_match"].groupby(["pe", "operation"]):
        assert rows["seed"].tolist() == [5, 6, 7] and (rows["split_seed"] == 5).all()
        items = [np.array([c == "1" for c in r], float) for r in rows["items_right"]]
        assert [i.mean() for i in items] == pytest.approx(rows["value"].tolist())
        mean = acc[(acc.pe == pe) & (acc.metric == "exact_match") & (acc.operation == op)].iloc[0]
        assert mean["value"] == pytest.approx(rows["value"].mean()) and mean["seeds"] == 3
        low, high = seeds_and_texts_interval(items, same_texts=True)
        assert (mean["ci_low"], mean["ci_high"]) == pytest.approx((low, high), nan_ok=True)
        assert mean["interval"] == (SEEDS_CROSSED_TEXTS if low == low else "")
    assert acc.loc[acc.metric == "exact_match", "ci_low"].notna().any()  # not every cell blank
    assert sorted(tables["attention"]["seed"].unique()) == [5, 6, 7]

    one = run(o.replace(seeds=1))
    first = by_seed[(by_seed.seed == 5)].reset_index(drop=True)
    numbers = first.metric.isin(["exact_match", "final_train_loss"])
    pd.testing.assert_series_equal(first[numbers]["value"], one["by_seed"][numbers]["value"])
    assert (one["accuracy"].query("metric == 'exact_match'")["interval"]
            == "95 % Wilson score interval over test examples").all()
    two = run(o.replace(workers=2))["accuracy"]
    same = acc.metric.isin(["exact_match", "final_train_loss"])
    pd.testing.assert_frame_equal(two[same][["pe", "metric", "operation", "value", "ci_low", "ci_high"]],
                                  acc[same][["pe", "metric", "operation", "value", "ci_low", "ci_high"]])


def test_greedy_answers_stop_at_the_longest_example_inside_the_position_table():
    """A barely trained model that never writes <eos> (`pecli toy arithmetic --steps 1`) once
    decoded `longest` new tokens after each prompt, past the learned position table
    (IndexError). Decoding now stops when a prompt is as long as the longest example."""
    from pecli.experiments.toy import encode_example, greedy_answers

    tok = char_tokenizer()
    examples = arithmetic_examples(100)
    longest = max(len(encode_example(tok, e)[0]) for e in examples)
    model = build_model("learned", len(tok), ModelSize(1, 16, 2, positions=longest),
                        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id).eval()
    seen: list[int] = []

    def never_ends(module, args, kwargs, output):
        seen.append(kwargs["attention_mask"].shape[1])  # the tokens held, cached or new
        output.logits[..., tok.eos_token_id] = -torch.inf

    model.register_forward_hook(never_ends, with_kwargs=True)
    prompts = ["1+1=", "99+99=", "7-50="]
    assert greedy_answers(model, tok, prompts, longest) == ["<no eos>"] * 3
    assert max(seen) == longest - 1  # the last token decoded sits at position longest - 1
    # Every right answer fits: "99+99=198" and its <eos> end exactly at `longest`.
    assert len(encode_example(tok, "99+99=198")[0]) == longest


@pytest.mark.parametrize("scheme", SCHEMES)
def test_cached_greedy_decoding_equals_decoding_the_whole_sequence_each_step(scheme):
    """greedy_tokens keeps the KV cache; the reference recomputes every step over the whole
    sequence (what toy and toy length did before). The same logits at every step, and so the
    same tokens, under every scheme: alibi's and t5's attention functions and the randomized
    scheme's positions included. Briefly trained, so that the logits move from step to step
    (a random model's hardly do)."""
    from pecli.measures.training import greedy_tokens, random_position_ids

    model, tok = tiny(scheme, seed=1)
    with torch_threads(1):
        train(model, batch_iterator(tok, arithmetic_examples(10), 32, 0),
              TrainConfig(steps=30, lr=1e-2, warmup=5))
    model.eval()
    ids = torch.tensor([probe_ids(tok, text) for text in ("21+21=", "73-53=", "30+41=")])
    steps = 6
    positions = None
    if scheme == "randomized":
        positions = random_position_ids(3, ids.shape[1] + steps, SIZE.positions,
                                        torch.Generator().manual_seed(0))
    last_logits: list[torch.Tensor] = []
    model.register_forward_hook(lambda m, a, out: last_logits.append(out.logits[:, -1].clone()))
    whole = ids
    with torch.inference_mode():
        for _ in range(steps):
            kwargs = {} if positions is None else {"position_ids": positions[:, : whole.shape[1]]}
            logits = model(input_ids=whole, attention_mask=torch.ones_like(whole), **kwargs).logits
            whole = torch.cat([whole, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    reference, last_logits[:] = list(last_logits), []
    written = greedy_tokens(model, ids, steps, position_ids=positions)
    assert torch.equal(written, whole[:, ids.shape[1]:])
    steps_apart = (torch.stack(reference)[1:] - torch.stack(reference)[:-1]).abs().amax()
    assert steps_apart > 0.1  # so the comparison below can tell a step's logits from another's
    torch.testing.assert_close(torch.stack(last_logits), torch.stack(reference), rtol=0, atol=1e-4)
