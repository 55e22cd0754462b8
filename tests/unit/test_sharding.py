"""Model sharding: a model spread by a device map, part of it offloaded to disk, gives the
undivided model's numbers exactly (fp32 weights read back bit for bit), with interventions
and pecli's masked attention on the dispatched model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_tiny

from pecli.measures.lm_scoring import score, windows_for
from pecli.models.loading import load_model
from pecli.models.sharding import dispatch, parse_max_memory
from pecli.positions.interventions import intervene
from pecli.runs.errors import DeviceError

TEXTS = ["the film was long and the ending made no sense at all",
         "a quiet, patient story", "I laughed, I cried, I went home and slept well"]
TINY_GPT2 = str(Path(__file__).resolve().parents[2] / "models" / "tiny-gpt2-imdb")


def _nlls(loaded, pe: str, shape: str, semantics: str, protocol: str) -> list[torch.Tensor]:
    ids = [loaded.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    prepared = windows_for(ids, loaded.max_positions, loaded.tokenizer.bos_token_id)
    with intervene(loaded, pe, seed=0):
        return score(loaded, prepared, shape, semantics, protocol)[0]


CONDITIONS = [("intact", "default", "legacy", "relative"), ("zero", "linear", "log-bias", "relative"),
              ("shuffle", "linear", "log-bias", "study"), ("shift:2", "exponential", "scale", "relative")]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_gpt2_with_blocks_on_disk_equals_undivided(tmp_path):
    whole = load_model(TINY_GPT2, device="cpu")
    split = load_model(TINY_GPT2, device="cpu")
    device_map = {"transformer.wte": "cpu", "transformer.wpe": "disk",  # kept on cpu (edited)
                  "transformer.drop": "cpu", "transformer.h.0": "cpu", "transformer.h.1": "disk",
                  "transformer.h.2": "disk", "transformer.h.3": "cpu", "transformer.ln_f": "disk",
                  "lm_head": "cpu"}
    assert dispatch(split, device_map, offload_folder=tmp_path) == torch.device("cpu")
    assert split.extra["device_map"]["transformer.wpe"] == "cpu"
    assert split.model.transformer.h[1].attn.c_attn.weight.device.type == "meta"  # really offloaded
    assert any(tmp_path.iterdir())
    for cond in CONDITIONS:
        _same(_nlls(whole, *cond), _nlls(split, *cond))
    assert split.provenance()["device_map"] == "cpu, disk"


def test_auto_map_by_max_memory_equals_undivided():
    whole = load_model(TINY_GPT2, device="cpu")
    split = load_model(TINY_GPT2, device="cpu", device_map="auto", max_memory="cpu=3MB")
    assert "disk" in split.extra["device_map"].values()  # 5.3 MB of weights: some on disk
    for cond in CONDITIONS[:2]:
        _same(_nlls(whole, *cond), _nlls(split, *cond))


def test_rotary_llama_with_a_layer_on_disk(tmp_path):
    whole, split = make_tiny("llama"), make_tiny("llama")
    dispatch(split, {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "cpu",
                     "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"},
             offload_folder=tmp_path)
    for cond in [("zero", "default", "legacy", "relative"), ("shuffle", "alibi", "log-bias", "relative"),
                 ("reverse", "linear", "legacy", "study")]:
        _same(_nlls(whole, *cond), _nlls(split, *cond))


def test_ablate_cosines_on_offloaded_bert(tmp_path):
    from pecli.experiments.ablate import measure

    whole, split = make_tiny("bert"), make_tiny("bert")
    dispatch(split, {"embeddings": "disk", "encoder.layer.0": "disk",
                     "encoder.layer.1": "cpu", "pooler": "cpu"}, offload_folder=tmp_path)
    assert split.extra["device_map"]["embeddings"] == "cpu"  # holds the position table
    a = measure(whole, TEXTS, ["zero", "shuffle"], checkpoint_every=None)
    b = measure(split, TEXTS, ["zero", "shuffle"], checkpoint_every=None)
    for name in ("zero", "shuffle"):
        np.testing.assert_array_equal(a.cosine[name], b.cosine[name])


def test_max_memory_parsing():
    assert parse_max_memory("0=20GiB, 1=20GiB,cpu=64GiB") == {0: "20GiB", 1: "20GiB", "cpu": "64GiB"}
    assert parse_max_memory(None) is None
    for bad in ("20GiB", "gpu0=1GiB", "cpu="):
        with pytest.raises(DeviceError, match="DEVICE=SIZE"):
            parse_max_memory(bad)
