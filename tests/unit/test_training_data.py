"""Toy arithmetic data and IMDB token streams: reproducible, disjoint, scored as documented."""

from __future__ import annotations

import math

import pytest
import torch

from pecli.experiments.options.toy import ToyOptions
from pecli.experiments.toy import (
    arithmetic_examples,
    batch_iterator,
    char_tokenizer,
    default_probe,
    encode_example,
    split_examples,
)
from pecli.experiments.train_lm import eval_windows, train_bpe, unigram_nll, window_batches
from pecli.runs.errors import ConfigError


def test_examples_cover_both_operations():
    ex = arithmetic_examples(12)
    assert len(ex) == 2 * 12 * 12 == len(set(ex))
    assert "11+11=22" in ex and "3-7=-4" in ex and "0-0=0" in ex
    with pytest.raises(ConfigError, match="--max"):
        ToyOptions(max_n=1)


def test_split_is_reproducible_and_disjoint():
    ex = arithmetic_examples(30)
    train, test = split_examples(ex, 0.2, seed=0)
    assert (train, test) == split_examples(ex, 0.2, seed=0)
    assert not set(train) & set(test)
    assert sorted(train + test) == sorted(ex)
    assert len(test) == round(0.2 * len(ex))
    assert split_examples(ex, 0.2, seed=1)[1] != test


def test_labels_cover_answer_and_eos_only():
    tok = char_tokenizer()
    ids, start = encode_example(tok, "21+211=232")
    assert tok.convert_ids_to_tokens(ids) == ["<bos>", *"21+211=232", "<eos>"]
    assert start == 8
    batch = next(batch_iterator(tok, ["1+2=3", "10-20=-10"], batch=4, seed=0))
    for row, labels in zip(batch["input_ids"], batch["labels"], strict=True):
        kept = [int(t) for t in labels if t != -100]
        tokens = tok.convert_ids_to_tokens([int(t) for t in row if t != tok.pad_token_id])
        answer = "".join(tokens[1:-1]).split("=")[1]
        assert tok.convert_ids_to_tokens(kept) == [*answer, "<eos>"]


def test_probe_checks():
    assert default_probe(100) == "21+21=" and default_probe(1000) == "21+211="
    assert default_probe(5) == "1+1="
    assert ToyOptions(probe="21+211=", max_n=300).probe == "21+211="
    for bad in ("21+211=", "2*3=", "1+2=3", "+1="):
        with pytest.raises(ConfigError, match="--probe"):
            ToyOptions(probe=bad, max_n=100)


def test_unigram_nll_by_hand():
    train = torch.tensor([0, 0, 1, 2])  # counts 2, 1, 1 (+1 each over a vocab of 4)
    windows = torch.tensor([[3, 0, 1]])  # targets 0 and 1
    nll, n = unigram_nll(train, windows, vocab_size=4)
    assert n == 2
    assert nll == pytest.approx(-math.log(3 / 8) - math.log(2 / 8))


def test_windows_and_batches():
    stream = torch.arange(10)
    assert eval_windows(stream, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    a = next(window_batches(stream, 4, 3, seed=5))["input_ids"]
    b = next(window_batches(stream, 4, 3, seed=5))["input_ids"]
    assert torch.equal(a, b) and a.shape == (3, 4)
    assert ((a[:, 1:] - a[:, :-1]) == 1).all()  # contiguous windows


def test_bpe_round_trips_text():
    texts = ["A film about films. <br /><br />Not bad at all!"] * 20 + ["terrible movie"] * 20
    tok = train_bpe(texts, 300)
    assert len(tok) <= 300
    ids = tok("Not bad, terrible film", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "Not bad, terrible film"
    assert tok.eos_token == "<|endoftext|>"


def test_bigram_nll_by_hand():
    """The interpolated bigram, written out with dictionaries: lambda picked on the last 10 %
    of the train stream with counts from the first 90 %, then counts from the whole stream."""
    import math
    from collections import Counter

    from pecli.experiments.train_lm import bigram_nll

    rng = torch.Generator().manual_seed(0)
    train = torch.randint(0, 7, (400,), generator=rng)
    train[::5] = 3  # some structure: 3 every fifth token
    windows = torch.randint(0, 7, (4, 6), generator=rng)
    v = 8  # one id never seen: add-one keeps it finite

    def model(stream):
        s = stream.tolist()
        pairs, ctx, uni = Counter(zip(s[:-1], s[1:], strict=True)), Counter(s[:-1]), Counter(s)
        total = len(s) + v

        def p(a, b, lam):
            pu = (uni[b] + 1) / total
            cond = pairs[(a, b)] / ctx[a] if ctx[a] else pu
            return lam * cond + (1 - lam) * pu
        return p

    cut = int(400 * 0.9)
    head, tail = model(train[:cut]), train[cut:].tolist()
    grid = [round(0.05 * k, 2) for k in range(1, 20)]
    lam = min(grid, key=lambda x: -sum(math.log(head(a, b, x)) for a, b in zip(tail[:-1], tail[1:], strict=True)))
    full = model(train)
    expected = -sum(math.log(full(a, b, lam)) for w in windows.tolist() for a, b in zip(w[:-1], w[1:], strict=True))
    nll, n, got_lam = bigram_nll(train, windows, v)
    assert got_lam == lam and n == 4 * 5
    assert nll == pytest.approx(expected, rel=1e-12)
