"""Length-split toy tasks, the three newer schemes (t5, randomized, p-rope), intervals over
seeds, the ranking, and deterministic training: each against a literal computation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from pecli.experiments.options.toy_length import ToyLengthOptions
from pecli.experiments.toy import char_tokenizer
from pecli.experiments.toy_length import (
    Encoder,
    exact_match,
    held_out_items,
    instance,
    ranking,
    reciprocal_ranks,
    sequence_length,
    training_batches,
)
from pecli.measures.training import (
    SCHEMES,
    ModelSize,
    TrainConfig,
    build_model,
    random_position_ids,
    save_checkpoint,
    t5_buckets,
    train,
    with_random_positions,
)
from pecli.runs.errors import ConfigError

ENC = Encoder(char_tokenizer())


def tiny(scheme: str, seed: int = 0, positions: int = 32):
    tok = char_tokenizer()
    return build_model(scheme, len(tok), ModelSize(2, 16, 2, positions), pad_token_id=ENC.pad,
                       bos_token_id=ENC.bos, eos_token_id=ENC.eos, seed=seed)


# --- tasks and the split ------------------------------------------------------------------


def test_tasks_by_their_definitions():
    rng = np.random.default_rng(0)
    for length in (1, 3, 7, 20):
        prompt, answer = instance("copy", length, rng)
        assert prompt == answer + "=" and len(answer) == length
        prompt, answer = instance("reverse", length, rng)
        assert answer == "".join(reversed(prompt[:-1]))
        prompt, answer = instance("sort", length, rng)
        assert list(answer) == sorted(prompt[:-1])
        prompt, answer = instance("addition", length, rng)
        a, b = prompt[:-1].split("+")
        assert len(a) == len(b) == length and len(answer) == length + 1
        # least significant digit first: the digits of the sum, one by one with carries
        carry, digits = 0, []
        for i in range(length):
            carry, d = divmod(int(a[i]) + int(b[i]) + carry, 10)
            digits.append(str(d))
        assert answer == "".join(digits) + str(carry)
    assert instance("addition", 2, np.random.default_rng(3))[0].count("+") == 1
    assert sequence_length("addition", 4) == 1 + 4 + 1 + 4 + 1 + 5 + 1


def test_training_batches_stay_within_the_training_lengths_and_label_the_answer_only():
    batch = next(training_batches("reverse", ENC, 4, 64, seed=0))
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    eq = ENC.vocab["="]
    for row in range(64):
        n = int(mask[row].sum())
        seq = ids[row, :n].tolist()
        split = seq.index(eq)
        digits = split - 1  # after <bos>
        assert 1 <= digits <= 4 and seq[0] == ENC.bos and seq[-1] == ENC.eos
        assert seq[split + 1: -1] == seq[1:split][::-1]
        assert (labels[row, : split + 1] == -100).all() and (labels[row, n:] == -100).all()
        assert labels[row, split + 1: n].tolist() == seq[split + 1:]
    lengths = {int(m.sum()) for m in mask}
    assert len(lengths) > 1  # mixed lengths in one batch
    again = next(training_batches("reverse", ENC, 4, 64, seed=0))
    assert torch.equal(again["input_ids"], ids)


def test_test_items_are_shared_across_schemes_and_seeds_and_differ_by_length():
    assert held_out_items("copy", 6, 5, seed=0) == held_out_items("copy", 6, 5, seed=0)
    assert held_out_items("copy", 6, 5, seed=0) != held_out_items("copy", 6, 5, seed=1)
    assert all(len(p) == 7 for p, _ in held_out_items("copy", 6, 5, seed=0))


def test_options_default_to_three_n_and_check_tasks():
    o = ToyLengthOptions()
    assert o.test_lengths == (2, 4, 6, 8, 10, 12) and max(o.test_lengths) == 3 * o.train_length
    assert o.seeds >= 3 and len(o.pe) == len(SCHEMES) >= 8
    assert ToyLengthOptions.build({"task": ["copy,sort"]}, "t").task == ("copy", "sort")
    with pytest.raises(ConfigError, match="unknown task 'cpy' .did you mean 'copy'"):
        ToyLengthOptions.build({"task": "cpy"}, "t")
    with pytest.raises(ConfigError, match="none is past the training length 10; test beyond it"):
        ToyLengthOptions.build({"train_length": 10, "test_lengths": "4,6"}, "t")
    # At the training length only: nothing to rank (`pecli toy length --train-length 1
    # --test-lengths 1` once ended in a KeyError traceback after training).
    with pytest.raises(ConfigError, match="none is past the training length 1; .* e.g. 1,2,3"):
        ToyLengthOptions.build({"train_length": 1, "test_lengths": "1"}, "t")


# --- greedy exact match ------------------------------------------------------------------


class Oracle(torch.nn.Module):
    """Emits the answer of each item, then `tail` (eos when right); records position_ids.
    Its "cache" is the tokens so far, so it reads each row whole as a model's cache does."""

    def __init__(self, items, tail):
        super().__init__()
        self.answers = {tuple([ENC.bos, *ENC.ids(p)]): ENC.ids(a) + tail for p, a in items}
        self.seen = []

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=False):
        self.seen.append(None if position_ids is None else position_ids.clone())
        if past_key_values is not None:
            input_ids = torch.cat([past_key_values, input_ids], dim=1)
        logits = torch.zeros(*input_ids.shape, len(ENC.vocab))
        for r, row in enumerate(input_ids.tolist()):
            for key, answer in self.answers.items():
                if tuple(row[: len(key)]) == key:
                    logits[r, -1, answer[len(row) - len(key)]] = 1.0
        return type("Out", (), {"logits": logits, "past_key_values": input_ids})


def test_exact_match_needs_the_answer_then_eos():
    items = held_out_items("reverse", 5, 6, seed=0)
    assert exact_match(Oracle(items, [ENC.eos]), ENC, items).all()
    assert not exact_match(Oracle(items, [ENC.vocab["1"]]), ENC, items).any()
    wrong = Oracle(items, [ENC.eos])
    first = next(iter(wrong.answers))
    wrong.answers[first] = [ENC.vocab["="]] + wrong.answers[first][1:]
    assert exact_match(wrong, ENC, items).tolist() == [False] + [True] * 5
    positions = random_position_ids(6, 1 + 6 + 6, 40, torch.Generator().manual_seed(0))
    oracle = Oracle(items, [ENC.eos])
    exact_match(oracle, ENC, items, positions)
    # The prompts' positions, then each new token's own (the cache holds the earlier ones).
    assert torch.equal(oracle.seen[0], positions[:, :7])
    assert [p.shape[1] for p in oracle.seen[1:]] == [1] * 5
    assert torch.equal(torch.cat(oracle.seen, dim=1), positions[:, :12])


# --- intervals over seeds, the ranking -----------------------------------------------------


def test_seed_interval_is_students_t_by_hand():
    from pecli.measures.training import seed_interval

    values = [0.2, 0.4, 0.9]
    mean = sum(values) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    half = 4.30265273 * sd / math.sqrt(3)  # t(0.975, 2 degrees of freedom)
    assert seed_interval(values) == pytest.approx((mean - half, mean + half), abs=1e-8)
    assert all(math.isnan(x) for x in seed_interval([0.5]))


def test_mean_reciprocal_rank_by_hand():
    assert reciprocal_ranks({"a": 0.9, "b": 0.5, "c": 0.5}) == {"a": 1.0, "b": 0.5, "c": 0.5}
    rows = []
    acc = {("copy", "none"): [0.8, 0.6], ("copy", "rope"): [0.1, 0.3],
           ("sort", "none"): [0.2, 0.2], ("sort", "rope"): [0.5, 0.7]}
    for (task, pe), values in acc.items():
        for seed, v in enumerate(values):
            rows.append({"task": task, "pe": pe, "seed": seed, "metric": "exact_match",
                         "test_length": 8, "value": v})
            rows.append({"task": task, "pe": pe, "seed": seed, "metric": "exact_match",
                         "test_length": 4, "value": 1.0 - v})  # inside training: ignored
    out = ranking(pd.DataFrame(rows), train_length=4, n_boot=200).set_index(["pe", "metric"])
    # copy: none first (0.7 vs 0.2); sort: rope first (0.6 vs 0.2): MRR (1 + 1/2) / 2 each
    assert out.loc[("none", "mrr"), "value"] == out.loc[("rope", "mrr"), "value"] == 0.75
    assert out.loc[("none", "exact_match_past_train_length"), "value"] == pytest.approx(0.45)
    # every resample of the seeds keeps both orders (copy: none's worst seed 0.6 > rope's best
    # 0.3; sort: 0.2 < 0.5): the ranking cannot vary, so it has no interval, not [0.75, 0.75]
    assert out.loc[("none", "mrr"), ["ci_low", "ci_high"]].isna().all()


# --- the three newer schemes against their definitions -------------------------------------


def test_t5_buckets_are_t5s_unidirectional_buckets():
    """Raffel et al.: distance d = query - key >= 0; buckets 0..15 exact, then 16 log-spaced
    buckets up to distance 128, the last bucket for everything beyond."""
    def by_hand(d: int) -> int:
        if d < 16:
            return d
        return min(31, 16 + int(math.log(d / 16) / math.log(128 / 16) * 16))

    b = t5_buckets(200, 200)
    for q, k in [(0, 0), (5, 3), (40, 0), (199, 100), (199, 0), (150, 149)]:
        assert b[q, k].item() == by_hand(q - k), (q, k)
    assert t5_buckets(1, 7)[0].tolist() == [6, 5, 4, 3, 2, 1, 0]  # one new query at the end


def test_t5_attention_adds_the_bias_to_the_logits():
    """Layer-1 attention of a t5 model equals softmax(q k^T / sqrt(d) + bias[bucket(q - k)])
    computed by hand from its own projections, causal."""
    model = tiny("t5").eval()
    attn = model.transformer.h[0].attn
    torch.nn.init.normal_(attn.relative_bias.weight, std=2.0)
    ids = torch.tensor([[ENC.bos, *ENC.ids("3141=")]])
    with torch.inference_mode():
        out = model(input_ids=ids, output_attentions=True)
        x = model.transformer.h[0].ln_1(model.transformer.wte(ids))  # wpe is zero
        q, k, _ = attn.c_attn(x).split(16, dim=-1)
        q, k = (t.view(1, -1, 2, 8).transpose(1, 2) for t in (q, k))  # [1, h, t, d]
        t = ids.shape[1]
        logits = q @ k.transpose(-1, -2) / math.sqrt(8)
        dist = torch.arange(t)[:, None] - torch.arange(t)[None, :]
        logits = logits + attn.relative_bias.weight[dist.clamp(min=0)].permute(2, 0, 1)
        logits = logits.masked_fill(dist < 0, -math.inf)
        torch.testing.assert_close(out.attentions[0], logits.softmax(-1), rtol=0, atol=1e-6)


def test_t5_checkpoint_reloads_its_bias_tables(tmp_path):
    from pecli.models.loading import load_model

    model = tiny("t5").eval()
    for block in model.transformer.h:
        torch.nn.init.normal_(block.attn.relative_bias.weight)
    save_checkpoint(model, char_tokenizer(), tmp_path / "t5")
    loaded = load_model(str(tmp_path / "t5"), device="cpu").model
    for a, b in zip(model.transformer.h, loaded.transformer.h, strict=True):
        assert torch.equal(a.attn.relative_bias.weight, b.attn.relative_bias.weight)
    ids = torch.tensor([[ENC.bos, *ENC.ids("12=21")]])
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)


def test_p_rope_turns_the_highest_three_quarters_of_the_frequencies():
    """Barbero et al.'s p-RoPE, p = 0.75: inv_freq_i = base^(-2i/d) for the first 3/4 of the
    d/2 frequencies (the highest), 0 (no rotation) for the lowest quarter."""
    model = build_model("p-rope", 20, ModelSize(1, 64, 2, 16), pad_token_id=0, bos_token_id=1,
                        eos_token_id=2)  # head dim 32: 16 frequencies, 12 turned
    expected = [10000 ** (-2 * i / 32) if i < 12 else 0.0 for i in range(16)]
    torch.testing.assert_close(model.model.rotary_emb.inv_freq, torch.tensor(expected))
    rope = build_model("rope", 20, ModelSize(1, 64, 2, 16), pad_token_id=0, bos_token_id=1,
                       eos_token_id=2)
    torch.testing.assert_close(rope.model.rotary_emb.inv_freq[:12], torch.tensor(expected[:12]))


def test_randomized_positions_are_sorted_distinct_draws_that_reach_the_model():
    gen = torch.Generator().manual_seed(0)
    pos = random_position_ids(500, 12, 40, gen)
    assert (pos.diff(dim=1) > 0).all() and pos.min() >= 0 and pos.max() < 40
    assert pos[:, -1].max() == 39 and pos[:, 0].min() == 0  # the whole range is drawn
    assert len({tuple(r) for r in pos.tolist()}) > 400
    with pytest.raises(ConfigError):
        random_position_ids(1, 41, 40, gen)
    batches = with_random_positions(training_batches("copy", ENC, 4, 8, 0), 40, seed=0)
    batch = next(batches)
    assert batch["position_ids"].shape == batch["input_ids"].shape
    model = tiny("randomized", positions=40).eval()
    with torch.inference_mode():
        plain = model(input_ids=batch["input_ids"]).logits
        moved = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    assert (plain - moved).abs().max() > 1e-4


@pytest.mark.parametrize("scheme", SCHEMES)
def test_training_is_deterministic_per_seed(scheme):
    """Train twice with one seed on CPU: bit-identical weights; another seed differs."""
    def trained(seed):
        model = tiny(scheme, seed=seed)
        batches = training_batches("copy", ENC, 4, 8, seed)
        if scheme == "randomized":
            batches = with_random_positions(batches, 32, seed)
        train(model, batches, TrainConfig(steps=4, warmup=2))
        return model.state_dict()

    first, again, other = trained(0), trained(0), trained(1)
    assert first.keys() == again.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)


def test_workers_change_nothing_but_the_time():
    from pecli.experiments.toy_length import run

    o = ToyLengthOptions.build({"task": "reverse", "pe": "none,t5", "train_length": 2, "steps": 3,
                                "seeds": 2, "eval_items": 4, "width": 16}, "t")
    one = run(o)["by_seed"]
    two = run(o.replace(workers=2))["by_seed"]
    numbers = one.metric.isin(["exact_match", "final_train_loss", "attention_mean_distance"])
    pd.testing.assert_series_equal(one[numbers]["value"], two[numbers]["value"])


# --- the seed's question at a length never trained on -----------------------------------------


def test_probe_is_the_all_ones_addition():
    from pecli.experiments.toy_length import probe

    assert probe(1) == ("1+1=", "20")
    assert probe(2) == ("11+11=", "220")  # 11 + 11 = 22, least significant digit first
    for length in range(1, 8):
        prompt, answer = probe(length)
        ones = int("1" * length)
        assert int(answer[::-1]) == ones + ones and len(answer) == length + 1
        assert len(prompt) + len(answer) + 2 == sequence_length("addition", length)


def test_probe_map_is_the_models_head_mean_attention_from_equals_on():
    """probe_map's weights are transformers' attention probabilities averaged over heads, for
    every query from "=" on and every key it sees; without positions (none) layer 1 gives
    every operand 1 the same weight (identical tokens, identical keys): the seed's question
    answered 'cannot tell them apart' at any length; rope's rotation separates them."""
    from pecli.experiments.toy_length import probe, probe_map

    prompt, answer = probe(6)
    ids = torch.tensor([[ENC.bos, *ENC.ids(prompt), *ENC.ids(answer), ENC.eos]])
    t = ids.shape[1]
    for scheme in ("none", "rope"):
        model = tiny(scheme).eval()
        cells = pd.DataFrame(probe_map(model, ENC, 6))
        model.set_attn_implementation("eager")
        with torch.inference_mode():
            maps = model(input_ids=ids, output_attentions=True).attentions
        first = len(prompt)  # index of "=" (0 is <bos>)
        assert len(cells) == 2 * sum(q + 1 for q in range(first, t))
        for row in cells.itertuples():
            assert row.value == pytest.approx(float(maps[row.layer - 1][0, :, row.query, row.key].mean()),
                                              abs=1e-6)
        sums = cells.groupby(["layer", "query"])["value"].sum()
        np.testing.assert_allclose(sums.to_numpy(), 1.0, atol=1e-5)
        layer1 = cells[(cells.layer == 1) & (cells["query"] == first) & (cells.key_token == "1")]
        assert len(layer1) == 12
        spread = layer1.value.max() - layer1.value.min()
        if scheme == "none":
            assert spread < 1e-6
        else:
            assert spread > 1e-4


def test_addition_runs_write_the_probe_map_of_the_first_seed_at_the_longest_length(tmp_path):
    from pecli.experiments.toy_length import run
    from pecli.plots.training import toy_length_map

    o = ToyLengthOptions.build({"task": "addition,copy", "pe": "none", "train_length": 2,
                                "steps": 2, "seeds": 2, "eval_items": 2, "width": 16}, "t")
    tables = run(o)
    maps = tables["attention_map"]
    assert set(maps.seed) == {o.seed} and set(maps.task) == {"addition"}
    assert set(maps.test_length) == {max(o.test_lengths)} and not maps.in_training.any()
    assert set(maps.probe) == {"111111+111111=2222220"}
    assert "attention_weight" not in set(tables["by_seed"].metric)
    maps.to_csv(tmp_path / "map.csv", index=False)
    out = toy_length_map(tmp_path / "map.csv", tmp_path / "map.png")
    assert out.exists() and out.stat().st_size > 0


def test_exact_match_over_seeds_resamples_the_shared_items_once_for_all_seeds():
    """Every seed answers the same items: the by-seed rows keep each item's 0/1 in order, and
    the summary's interval draws one set of items per resample for every seed (written out)."""
    from pecli.experiments.toy_length import run, summary

    o = ToyLengthOptions.build({"task": "reverse", "pe": "none", "train_length": 2, "steps": 3,
                                "seeds": 3, "eval_items": 6, "width": 16}, "t")
    tables = run(o)
    by_seed = tables["by_seed"]
    past = tables["ranking"].query("metric == 'exact_match_past_train_length'")
    assert not (past["ci_low"] < 0).any() and not (past["ci_high"] > 1).any()  # t over 3 seeds went below 0
    em = by_seed[by_seed.metric == "exact_match"]
    right = [np.array([c == "1" for c in str(s)], float) for s in em["items_right"]]
    assert [len(r) for r in right] == em["rows"].tolist()
    np.testing.assert_allclose([r.mean() for r in right], em["value"])
    rng = np.random.default_rng(5)
    fake = em.iloc[:1].loc[em.index[[0] * 3]].assign(
        seed=[0, 1, 2], model_revision="r", rows=30,
        items_right=["".join(rng.choice(["0", "1"], 30)) for _ in range(3)])
    fake["value"] = [np.mean([c == "1" for c in s]) for s in fake["items_right"]]
    row = summary(fake).iloc[0]
    d = np.array([[c == "1" for c in s] for s in fake["items_right"]], float)  # [seed, item]
    g = np.random.default_rng(0)
    items = g.integers(0, 30, (1000, 30))
    within = np.stack([d[s][items].mean(1) for s in range(3)], 1)
    stats = np.take_along_axis(within, g.integers(0, 3, (1000, 3)), 1).mean(1)
    np.testing.assert_allclose([row["ci_low"], row["ci_high"]], np.percentile(stats, [2.5, 97.5]),
                               rtol=1e-12)
    assert row["interval"].startswith("95 % two-level percentile bootstrap: training seeds resampled, and")
