"""Remedies past the context, frequency bands and per-layer surgery against literal references.

- sinks: a token-by-token streaming decode, one token per forward, with a rolling cache (the
  first K entries + the W most recent) of keys kept *before* rotation and rotated at their
  cache positions 0..len-1, the query at the last slot (Xiao et al. 2023, §3.2);
- Self-Extend, ReRoPE (and leaky), LM-Infinite, bands and @LAYERS: an eager attention that
  builds the full score matrix from a distance matrix written from each paper's definition,
  q . R(D[i, j]) k per rotary pair, merged before one softmax.

Both references receive unrotated queries and keys through their own pre-hook (identity
cos/sin) and rotate with angles p * inv_freq computed here, not by pecli's code.
"""

from __future__ import annotations

import pytest
import torch
from remedy_references import (
    literal_attention,
    lminfinite_distance,
    rerope_distance,
    rotary_of,
    se_distance,
    sinks_distance,
    streaming_nll,
)

from pecli.models.architectures import layer_groups
from pecli.positions.interventions import intervene
from pecli.positions.remedies import attention_modules
from pecli.runs.errors import InterventionError

N = 40  # tokens per sequence in the unit tests
FAMILIES = ("llama", "pythia", "deepseek_v3")


@pytest.fixture(params=FAMILIES)
def model(request, tiny):
    # sharper attention (init 0.3): position changes show far above float noise
    return tiny(request.param, initializer_range=0.3)


def _ids(loaded, n=N, batch=1, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, loaded.model.config.vocab_size, (batch, n), generator=gen)


def _logits(loaded, ids, mask=None):
    mask = torch.ones_like(ids) if mask is None else mask
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return loaded.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits


CASES = {
    "selfextend:2:8": lambda layer, i, j: se_distance(i, j, 2, 8),
    "selfextend:3:8": lambda layer, i, j: se_distance(i, j, 3, 8),  # W not divisible by G
    "rerope:8": lambda layer, i, j: rerope_distance(i, j, 8),
    "rerope:8:4": lambda layer, i, j: rerope_distance(i, j, 8, 4.0),
    "lminfinite:2:8": lambda layer, i, j: lminfinite_distance(i, j, 2, 8, 8),
    "lminfinite:3:10:6": lambda layer, i, j: lminfinite_distance(i, j, 3, 10, 6),
    "sinks:2:8": lambda layer, i, j: sinks_distance(i, j, 2, 8),
    "sinks:0:8": lambda layer, i, j: sinks_distance(i, j, 0, 8),
    "selfextend:2:8@1": lambda layer, i, j: se_distance(i, j, 2, 8) if layer == 1 else i - j,
    "zero@0": lambda layer, i, j: 0 if layer == 0 else i - j,
    "shift:5@1": lambda layer, i, j: i - j,  # a shift keeps every distance
}


@pytest.mark.parametrize("name", CASES)
def test_each_method_equals_the_literal_eager_reference(model, name):
    ids = _ids(model)
    with intervene(model, name):
        ours = _logits(model, ids)
    with literal_attention(model, CASES[name]):
        literal = _logits(model, ids)
    intact = _logits(model, ids)
    assert torch.allclose(ours, literal, atol=2e-5, rtol=1e-4), (ours - literal).abs().max()
    if not name.startswith("shift"):
        assert (ours - intact).abs().max() > 1e-3  # the condition changes the numbers


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gpt_oss", "gemma3"])
@pytest.mark.parametrize("name", ["selfextend:2:4", "rerope:4:4", "sinks:2:4", "lminfinite:2:4",
                                  "zero@sliding_attention"])
def test_remedies_keep_the_window_the_cap_and_the_sinks(tiny, family, name):
    """Layouts with more than rotation (windows of 8 tokens; Gemma 2's soft-cap and query
    scaling; gpt-oss's sink logits and YaRN; Gemma 3's window of 6, its rotary base per layer
    type and q/k norms): each method against the literal reference that applies them itself."""
    loaded = tiny(family, initializer_range=0.3)
    ids = _ids(loaded, n=20)
    remedy = name.partition("@")[0]
    sliding = set(layer_groups(loaded.model.config).get("sliding_attention", ()))
    case = {"selfextend:2:4": lambda i, j: se_distance(i, j, 2, 4),
            "rerope:4:4": lambda i, j: rerope_distance(i, j, 4, 4.0),
            "sinks:2:4": lambda i, j: sinks_distance(i, j, 2, 4),
            "lminfinite:2:4": lambda i, j: lminfinite_distance(i, j, 2, 4, 4),
            "zero": lambda i, j: 0}[remedy]
    only = sliding if "@" in name else None
    with intervene(loaded, name):
        ours = _logits(loaded, ids)
    with literal_attention(loaded, lambda layer, i, j: case(i, j) if only is None or layer in only else i - j):
        literal = _logits(loaded, ids)
    assert torch.allclose(ours, literal, atol=2e-5, rtol=1e-4), (ours - literal).abs().max()
    assert (ours - _logits(loaded, ids)).abs().max() > 1e-3


@pytest.mark.parametrize("name, which", [("droplow:0.5", "low"), ("drophigh:0.25", "high"),
                                         ("droplow:0.5@0", "low")])
def test_bands_equal_the_reference_without_those_pairs(model, name, which):
    pairs = rotary_of(model).inv_freq.shape[0]
    fraction = float(name.split(":")[1].split("@")[0])
    n = round(fraction * pairs)
    keep = torch.ones(pairs, dtype=torch.bool)
    if which == "low":  # inv_freq falls with the index: the lowest frequencies are last
        keep[pairs - n:] = False
    else:
        keep[:n] = False
    only = 0 if "@" in name else None
    ids = _ids(model)
    with intervene(model, name):
        ours = _logits(model, ids)
    with literal_attention(model, lambda layer, i, j: i - j,
                    keep=lambda layer: keep if only in (None, layer) else torch.ones_like(keep)):
        literal = _logits(model, ids)
    assert torch.allclose(ours, literal, atol=2e-5, rtol=1e-4)
    if n:
        assert (ours - _logits(model, ids)).abs().max() > 1e-4


# --- sinks: the streaming decode ------------------------------------------------------------


def _one_pass_nll(loaded, ids, name):
    with intervene(loaded, name):
        logits = _logits(loaded, ids)[0, :-1].double()
    return -torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]


@pytest.mark.parametrize("k, w", [(2, 8), (0, 8), (4, 5), (1, 16)])
def test_sinks_equal_the_streaming_decode(model, k, w):
    ids = _ids(model, n=30)
    streamed = streaming_nll(model, ids, k, w)
    ours = _one_pass_nll(model, ids, f"sinks:{k}:{w}")
    assert torch.allclose(ours, streamed, atol=1e-4), (ours - streamed).abs().max()
    intact = _one_pass_nll(model, ids, "intact")
    assert (ours - intact).abs().max() > 1e-3


def test_streaming_reference_is_the_plain_model_when_nothing_is_evicted(model):
    """The reference itself: with a cache that never fills, it is ordinary causal decoding."""
    ids = _ids(model, n=20)
    assert torch.allclose(streaming_nll(model, ids, 4, 16), _one_pass_nll(model, ids, "intact"),
                          atol=1e-4)


# --- exact reductions ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sinks:30:10", "sinks:0:40", "selfextend:1:8", "selfextend:4:40",
                                  "rerope:40", "rerope:64:4", "lminfinite:4:40", "droplow:0",
                                  "drophigh:0", "zero@none", "selfextend:2:8@none", "sinks:2:8@none"])
def test_reductions_are_bit_identical_to_the_intact_model(model, name):
    ids = _ids(model)
    intact = _logits(model, ids)
    with intervene(model, name):
        assert torch.equal(_logits(model, ids), intact)
    assert torch.equal(_logits(model, ids), intact)  # and restored


@pytest.mark.parametrize("name", ["sinks:30:10", "selfextend:1:8", "rerope:40", "lminfinite:4:40"])
def test_reductions_through_the_blocked_path_equal_the_intact_model(model, name):
    """The same reductions with the exact shortcut switched off: the merged score sets give the
    plain attention to float noise."""
    ids = _ids(model)
    modules = attention_modules(model)
    for m in modules:
        m.pecli_remedy_literal = True
    try:
        with intervene(model, name):
            ours = _logits(model, ids)
    finally:
        for m in modules:
            del m.pecli_remedy_literal
    assert torch.allclose(ours, _logits(model, ids), atol=2e-5, rtol=1e-4)


def test_every_layer_is_the_whole_intervention(model):
    ids = _ids(model)
    with intervene(model, "zero"):
        everywhere = _logits(model, ids)
    with intervene(model, "zero@all"):
        assert torch.equal(_logits(model, ids), everywhere)


@pytest.mark.parametrize("name", ["sinks:2:8", "selfextend:2:8", "rerope:8:4"])
def test_padding_and_batching_do_not_change_a_row(model, name):
    ids = _ids(model, n=N, batch=2)
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0  # right padding: row 1 is 25 tokens long
    with intervene(model, name):
        batched = _logits(model, ids, mask)
        alone = _logits(model, ids[1:, :25])
    assert torch.allclose(batched[1, :25], alone[0], atol=2e-5, rtol=1e-4)
    assert not batched.isnan().any()


def test_small_query_blocks_change_nothing(model, monkeypatch):
    from pecli.positions import remedies

    ids = _ids(model)
    for name in ("sinks:2:8", "selfextend:2:8", "rerope:8"):
        with intervene(model, name):
            whole = _logits(model, ids)
        monkeypatch.setattr(remedies, "MASK_BUDGET", 1)  # 16-query blocks
        with intervene(model, name):
            assert torch.allclose(_logits(model, ids), whole, atol=1e-5)
        monkeypatch.undo()


# --- what is refused --------------------------------------------------------------------------


@pytest.mark.parametrize("family, name, words", [
    ("gpt2", "rerope:64", ["does not apply", "learned positions"]),
    ("gpt2", "zero@even", ["per-layer surgery applies to rotary"]),
    ("gptj", "selfextend:2:8", ["its own code"]),
    ("gptj", "zero@0", ["its own code"]),
    ("llama", "zero@7", ["has 2 layers"]),
    ("modernbert", "sinks:2:8", ["an encoder"]),
])
def test_meaningless_conditions_are_refused_in_one_line(tiny, family, name, words):
    loaded = tiny(family)
    with pytest.raises(InterventionError) as err:
        with intervene(loaded, name):
            pass
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message


# --- lm-eval's model_args -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["loglikelihood_rolling", "generate_until"])
def test_lm_eval_model_args_take_a_remedy(tiny, kind):
    """model='pecli' with intervention=selfextend:2:4 answers as lm-eval's own HFLM on the
    model inside pecli's intervention (generation runs through the KV cache: queries after
    the first see unrotated cached keys, rotated by the remedy)."""
    pytest.importorskip("lm_eval", reason="lm-eval not installed (make setup)")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from pecli.integrations import lm_eval as plugin

    loaded = tiny("llama", initializer_range=0.3)
    text = "The film was long, but the last hour moved me more than anything this year."
    args = {"loglikelihood_rolling": (text,),
            "generate_until": (text, {"until": ["\n"], "max_gen_toks": 6, "do_sample": False})}[kind]
    requests = [Instance(kind, {}, args, 0)]
    plain = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=1)
    intact = getattr(plain, kind)(requests, disable_tqdm=True)
    with torch.inference_mode(), intervene(loaded, "selfextend:2:4"):
        expected = getattr(plain, kind)(requests, disable_tqdm=True)
    lm = plugin.PecliLM(pretrained="random:llama", intervention="selfextend:2:4", loaded=loaded,
                        batch_size=1)
    try:
        got = getattr(lm, kind)(requests, disable_tqdm=True)
    finally:
        lm.close()
    assert got == expected
    if kind == "loglikelihood_rolling":
        assert got != intact


def test_generation_with_the_cache_equals_one_pass_per_prefix(tiny):
    """A remedy under transformers' KV cache (decoding one token at a time, keys cached before
    rotation) gives the same next-token logits as a full pass over each prefix."""
    loaded = tiny("llama", initializer_range=0.3)
    ids = _ids(loaded, n=20)
    with intervene(loaded, "sinks:2:5"), torch.no_grad():
        out = loaded.model(input_ids=ids[:, :12], use_cache=True)
        cache, steps = out.past_key_values, []
        for t in range(12, 20):
            out = loaded.model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits[0, -1])
        full = [loaded.model(input_ids=ids[:, :t + 1]).logits[0, -1] for t in range(12, 20)]
    assert torch.allclose(torch.stack(steps), torch.stack(full), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("w", [2, 3, 8, 20])
def test_band_tiles_cover_each_visible_pair_once(w):
    """The tiles of a query block are exactly the pairs lo <= i - j < hi (keys >= 0), each once."""
    from pecli.positions.remedies import band_tiles

    for block in range(1, w):
        for qa in range(0, 40, block):
            qe = qa + block
            for lo, hi in ((0, w), (w, None)):
                want = {(i, j) for i in range(qa, qe) for j in range(qe)
                        if i - j >= lo and (hi is None or i - j < hi)}
                got = []
                for start, stop, pattern in band_tiles(qa, qe, lo, hi):
                    for r, i in enumerate(range(qa, qe)):
                        for c, j in enumerate(range(start, stop)):
                            seen = {"all": True, "causal": c <= r, "anti": c >= r}[pattern]
                            if j >= 0 and seen:
                                got.append((i, j))
                assert sorted(got) == sorted(want), (w, block, qa, lo, hi)
