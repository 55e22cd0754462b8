import pytest
import torch

from pecli.models.architectures import ARCHITECTURES, max_positions, position_embedding, resolve
from pecli.models.loading import load_model, resolve_device, resolve_dtype
from pecli.runs.errors import ArchSpecError, DeviceError, ModelError

FAMILIES = ARCHITECTURES.names()


@pytest.mark.parametrize("family", FAMILIES)
def test_spec_paths_resolve_on_the_real_config_classes(tiny, family):
    loaded = tiny(family)
    spec = loaded.spec
    assert max_positions(loaded.model, spec) == 64
    assert isinstance(resolve(loaded.model, spec, spec.layers), torch.nn.ModuleList)
    if spec.position == "learned":
        assert position_embedding(loaded.model, spec).num_embeddings == 64 + spec.pos_offset
    else:
        if spec.rotates and spec.sincos:  # GPT-J: a [positions, sin | cos] table per attention
            from pecli.models.architectures import resolve_in

            for block in resolve(loaded.model, spec, spec.layers):
                assert resolve_in(block, spec.sincos).shape[0] == 64
        elif spec.rotates:
            resolve(loaded.model, spec, spec.rotary)
        if spec.position == "relative bias":
            assert isinstance(resolve(loaded.model, spec, spec.bias), torch.nn.Embedding)
        with pytest.raises(ArchSpecError, match="no embedding table"):
            position_embedding(loaded.model, spec)


def test_missing_path_is_loud(tiny):
    loaded = tiny("gpt2")
    with pytest.raises(ArchSpecError, match="'nope' not found on GPT2LMHeadModel"):
        resolve(loaded.model, loaded.spec, "nope")


def test_unknown_names_and_devices(tmp_path):
    with pytest.raises(ModelError, match="unknown model family 'gtp2'.*did you mean 'gpt2'"):
        load_model("random:gtp2", device="cpu")
    with pytest.raises(ModelError, match="no config.json"):
        load_model(str(tmp_path), device="cpu")
    with pytest.raises(ModelError, match="hub is unreachable"):
        load_model("nobody/no-such-model", device="cpu")
    # a typo of an offline model reads as a hub id: the message names the model meant
    with pytest.raises(ModelError, match=r"cannot load 'smolm2' \(did you mean 'smollm2'\?\): the hub"):
        load_model("smolm2", device="cpu")
    with pytest.raises(ModelError, match="unknown dtype"):
        resolve_dtype("float8")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="CUDA is not available"):
            resolve_device("cuda")
    assert resolve_device("cpu").type == "cpu"


def test_unsupported_family(tmp_path):
    from transformers import CTRLConfig

    CTRLConfig(n_layer=1, n_embd=8, dff=8, n_head=1).save_pretrained(tmp_path)
    with pytest.raises(ModelError, match="'ctrl' has no supported position mechanism"):
        load_model(str(tmp_path), device="cpu")


def test_local_checkpoint_round_trip(tiny, tmp_path):
    loaded = tiny("gpt2")
    loaded.model.save_pretrained(tmp_path)
    loaded.tokenizer.save_pretrained(tmp_path)
    again = load_model(str(tmp_path), device="cpu")
    assert again.source == "local" and again.revision.startswith("sha256:")
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        assert torch.equal(loaded.model(ids).logits, again.model(ids).logits)


def test_random_model_is_seeded_and_labelled():
    a = load_model("random:bert", device="cpu", seed=1)
    b = load_model("random:bert", device="cpu", seed=1)
    assert a.is_random and a.provenance()["random_init"] is True
    assert a.provenance()["model_revision"] == "seed:1"
    assert a.model.config.hidden_size == 768 and a.max_positions == 512  # bert-base-uncased
    assert torch.equal(a.model.embeddings.word_embeddings.weight, b.model.embeddings.word_embeddings.weight)


def test_random_roberta_runs_offline_with_its_special_ids(gpt2_bpe):
    # RoBERTa numbers positions by skipping its pad id, so the stand-in tokenizer must use
    # roberta-base's special ids; then padding must not change a text's hidden states.
    r = load_model("random:roberta", device="cpu")
    tok, cfg = r.tokenizer, r.model.config
    assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id) == (0, 1, 2)
    assert (cfg.bos_token_id, cfg.pad_token_id, cfg.eos_token_id) == (0, 1, 2)
    assert max(tok.get_vocab().values()) < cfg.vocab_size and tok.mask_token_id == 50264
    short, longer = "a short one", "a somewhat longer sentence, with more tokens in it"
    batch = tok([short, longer], padding=True, return_tensors="pt")
    alone = tok([short], return_tensors="pt")
    with torch.inference_mode():
        padded = r.model(**batch).last_hidden_state[0, : alone.input_ids.shape[1]]
        single = r.model(**alone).last_hidden_state[0]
    assert (batch.attention_mask[0] == 0).any()
    torch.testing.assert_close(padded, single, atol=1e-5, rtol=1e-5)
